"""The bench harness's own pieces (numbers come from `vllm-eval bench`, never from tests)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from vllm_eval.measure.bench import BenchRecord, make_texts, parse_lengths, plot
from vllm_eval.utils.modelinfo import packaged_model_path


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


def test_synthetic_retrieval_task_is_beir_and_each_query_is_in_its_document(tmp_path):
    from vllm_eval.measure.suite import build_synthetic_retrieval
    from vllm_eval.tasks.owntasks import own_mteb_task

    data = build_synthetic_retrieval(tmp_path / "syn", packaged_model_path(), n_docs=120, n_queries=15, seed=2)
    docs = {json.loads(x)["_id"]: json.loads(x)["text"] for x in (data / "corpus.jsonl").read_text().splitlines()}
    queries = {json.loads(x)["_id"]: json.loads(x)["text"] for x in (data / "queries.jsonl").read_text().splitlines()}
    qrels = [x.split("\t") for x in (data / "qrels.tsv").read_text().splitlines()[1:]]
    assert len(docs) == 120 and len(queries) == len(qrels) == 15
    assert all(queries[q] in docs[d] and len(queries[q].split()) == 8 and s == "1" for q, d, s in qrels)
    stamp = (data / "corpus.jsonl").stat().st_mtime_ns
    assert build_synthetic_retrieval(tmp_path / "syn", packaged_model_path(), 120, 15, 2) == data
    assert (data / "corpus.jsonl").stat().st_mtime_ns == stamp  # the same request reuses the files
    task = own_mteb_task(data)
    assert task.metadata.type == "Retrieval" and task.metadata.main_score == "ndcg_at_10"


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="43 s of CI's 30 minutes: the suite's backends are the run command's, whose scores CI compares in"
    " tests/test_parity.py; the rest of bench runs in this module; VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_suite_times_each_backend_in_its_own_process_and_compares_scores(tmp_path):
    from vllm_eval.testing import run_cli

    out = tmp_path / "suite"
    result = run_cli(
        "bench", "--suite", "synthetic", "--n-docs", "100", "--n-queries", "10",
        "--backends", "vllm", "st", "--output-dir", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    suite = json.loads((out / "suite.json").read_text())
    records = {r["backend"]: r for r in suite["records"]}
    print(f"\nsuite: { {b: (r['seconds'], r['scores'], r['engine_start_s']) for b, r in records.items()} }")
    assert set(records) == {"vllm", "st"} and all(r["returncode"] == 0 for r in records.values())
    (task,) = records["vllm"]["scores"]
    assert 0 < records["vllm"]["scores"][task] <= 1
    assert records["st"]["max_delta"] < 1e-4 and records["vllm"]["max_delta"] == 0
    assert records["vllm"]["engine_start_s"] > 0 and records["st"]["engine_start_s"] is None
    assert all(r["seconds"] > 0 for r in records.values())
    assert (out / "vllm" / "summary.json").is_file() and (out / "st" / "mteb").is_dir()
    assert "seconds / vllm's" in result.stdout
    # Each backend's time per phase, from its run's timeline, printed side by side.
    ours, theirs = records["vllm"]["phases"], records["st"]["phases"]
    assert ours["engine"] > 0 and ours["encode"] > 0 and ours["tasks"] > 0 and ours["shutdown"] > 0
    assert theirs["engine"] > 0 and theirs["encode"] > 0 and "load" in theirs
    # psutil dates the process start to the kernel clock tick, not better than a fraction of a second
    assert ours["wall"] <= records["vllm"]["seconds"] + 1 and "seconds per phase" in result.stdout
    # `vllm-eval report` on the suite's folder renders each backend's run
    from vllm_eval.measure.report import write_report

    page = write_report([out], tmp_path / "report.html").read_text()
    assert str(out / "vllm") in page and str(out / "st") in page


def test_mfu_beside_each_throughput_against_the_computing_dtypes_peak(monkeypatch, capsys):
    from vllm_eval.measure import bench
    from vllm_eval.utils import telemetry

    record = bench.BenchRecord(
        "vllm", "bfloat16", "fixed:512", 2000, 2000, 1_024_000, 25.2, 79.4, 40_647.6, 0.1, 0.1, 1
    )
    monkeypatch.setattr(telemetry, "device_name", lambda: "NVIDIA H200")
    bf16 = bench._with_mfu(record, 7_567_295_488, bench._computing_dtype("vllm", "bfloat16", {}))
    assert bf16.mfu == round(40_647.6 * 2 * 7_567_295_488 / 989e12, 4) and bf16.peak_tflops == 989.0
    fp8 = bench._with_mfu(record, 7_567_295_488, bench._computing_dtype("vllm", "bfloat16", {"quantization": "fp8"}))
    assert fp8.peak_tflops == 1979.0 and fp8.mfu < bf16.mfu
    assert bench._computing_dtype("st", "bfloat16", {"quantization": "fp8"}) == "bfloat16"  # st does not quantize
    assert "MFU 62% of NVIDIA H200's 989 TFLOP/s bfloat16 (7.57 B params)" in capsys.readouterr().out
    # Two replicas on two H100s (80,562 tok/s measured): the fraction of both GPUs' peak, not of one (123 %).
    two = bench._with_mfu(replace(record, tokens_per_s=80_562.0), 7_567_295_488, "bfloat16", devices=2)
    assert two.mfu == round(80_562.0 * 2 * 7_567_295_488 / (2 * 989e12), 4) and two.peak_tflops == 1978.0
    assert "MFU 62% of 2 x NVIDIA H200's 989 TFLOP/s bfloat16" in capsys.readouterr().out
    monkeypatch.setattr(telemetry, "device_name", lambda: "CPU: AMD EPYC (2 cores)")
    assert bench._with_mfu(record, 7_567_295_488, "float32").mfu is None  # no known peak: left out


def test_a_given_layout_reaches_the_backend_as_given_and_the_label_names_the_layout_started(monkeypatch):
    """``--replicas-per-gpu 1 2 4``: the 1 is a choice (one engine), not "none given" (which lets a GPU machine
    choose 4 for a small model), and each measurement is labelled by the layout that started."""
    from types import SimpleNamespace

    from vllm_eval.measure import bench
    from vllm_eval.models import backends

    seen = []

    def fake_load(kind, name, model, **kw):
        seen.append({k: kw[k] for k in ("data_parallel_size", "replicas_per_gpu") if k in kw})
        rpg = kw.get("replicas_per_gpu") or 4  # what a GPU machine chooses for a small model when none is given
        layout = SimpleNamespace(data_parallel_size=kw.get("data_parallel_size") or 1, replicas_per_gpu=rpg)
        return SimpleNamespace(layout=layout, accelerators=1, encode_texts=None)

    monkeypatch.setattr(backends, "load_backend", fake_load)
    labels = [
        bench._Backend("vllm", "m", "float16", {}, replicas=r).label
        for r in ({"replicas_per_gpu": 1}, {"replicas_per_gpu": 2}, None, {"data_parallel_size": 2})
    ]
    assert seen == [{"replicas_per_gpu": 1}, {"replicas_per_gpu": 2}, {}, {"data_parallel_size": 2}]
    assert labels == ["vllm", "vllm-dp1x2", "vllm-dp1x4", "vllm-dp2x4"]
    assert bench._replica_label(SimpleNamespace(), {"data_parallel_size": 2, "ray_address": "auto"}) == "vllm-dp2-ray"
