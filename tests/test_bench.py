"""The bench harness's own pieces (numbers come from `vllm-eval bench`, never from tests)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from vllm_eval.bench import BenchRecord, make_texts, parse_lengths, plot
from vllm_eval.modelinfo import packaged_model_path


def test_texts_have_the_requested_token_counts():
    tok = AutoTokenizer.from_pretrained(packaged_model_path())
    texts, counts = make_texts(tok, 50, "fixed:130", seed=1)
    assert len(texts) == 50 and set(counts) == {130}
    assert counts == [len(x) for x in tok(texts)["input_ids"]]
    texts, counts = make_texts(tok, 200, "mixed:16-500", seed=1)
    assert min(counts) >= 16 and max(counts) <= 500 and len(set(counts)) > 50
    assert make_texts(tok, 5, "fixed:20", seed=3) == make_texts(tok, 5, "fixed:20", seed=3)


@pytest.mark.parametrize("bad", ["fixed", "mixed:5", "fixed:2", "mixed:10-5", "uniform:1-2"])
def test_bad_length_specs(bad):
    with pytest.raises(ValueError, match="lengths"):
        parse_lengths(bad)


def test_plots_are_written(tmp_path):
    recs = [
        BenchRecord(b, d, "fixed:130", bs, 100, 13000, 1.0, 100.0, 13000.0 * k, 0.1 * bs, 0.2 * bs, 1)
        for k, b in enumerate(["vllm", "st"], 1)
        for d in ("float16", "float32")
        for bs in (8, 64)
    ]
    paths = plot(recs, tmp_path)
    assert [p.name for p in paths] == ["throughput_latency.png", "dtype.png", "lengths.png"]
    assert all(p.stat().st_size > 5000 for p in paths)
    json.dumps([r.__dict__ for r in recs])
