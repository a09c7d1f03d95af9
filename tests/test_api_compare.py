"""The library API of ``compare`` and ``bench``: ``vllm_eval.compare`` and ``vllm_eval.bench`` give what the
commands write, and refuse bad input with the commands' one-line errors before any engine starts."""

from __future__ import annotations

import importlib
import json
import os

import pytest

import vllm_eval
from vllm_eval.utils.errors import VllmEvalError

#: Fields of a bench record that do not depend on the timing.
_SHAPE = ("backend", "dtype", "lengths", "batch_size", "n_texts", "n_tokens", "calls")


@pytest.mark.slow
def test_compare_returns_what_the_cli_writes(cli_in_process, vllm_encoder, tmp_path):
    cache = tmp_path / "cache"
    flags = ["--backends", "vllm", "st", "--tasks", "WordSim353", "--sample", "16", "--cache-dir", str(cache)]
    code, err = cli_in_process("compare", *flags, "--output-dir", str(tmp_path / "cli"), "--no-progress")
    assert code == 0, err
    comparison = vllm_eval.compare(
        backends=["vllm", "st"],
        tasks="WordSim353",
        sample=16,
        cache_dir=cache,
        output_dir=tmp_path / "api",
        show_progress=False,
    )
    written = json.loads((tmp_path / "cli" / "compare.json").read_text())
    assert comparison.to_json() == written  # the same scores, |Δ| and agreement, from the command's cached outputs
    assert comparison.path == tmp_path / "api" / "compare.json"
    assert json.loads(comparison.path.read_text()) == written
    assert (
        comparison.passed and comparison.reference == "st default" and comparison.agreement["vllm default"]["n"] == 16
    )
    assert comparison.cache.stats.hits > 0 and comparison.cache.stats.misses == 0


@pytest.mark.slow
def test_bench_measures_what_the_cli_measures(cli_in_process, vllm_encoder, tmp_path):
    flags = ["--backends", "vllm", "st", "--lengths", "fixed:16", "--batch-sizes", "8", "--n-texts", "16"]
    code, err = cli_in_process("bench", *flags, "--output-dir", str(tmp_path / "cli"))
    assert code == 0, err
    records = vllm_eval.bench(
        backends=["vllm", "st"], lengths=["fixed:16"], batch_sizes=[8], n_texts=16, output_dir=tmp_path / "api"
    )
    written = json.loads((tmp_path / "cli" / "bench.json").read_text())["records"]
    assert [{k: getattr(r, k) for k in _SHAPE} for r in records] == [{k: r[k] for k in _SHAPE} for r in written]
    assert [r.backend for r in records] == ["vllm", "st"] and all(r.tokens_per_s > 0 for r in records)
    saved = json.loads((tmp_path / "api" / "bench.json").read_text())["records"]
    assert [{k: r[k] for k in _SHAPE} for r in saved] == [{k: r[k] for k in _SHAPE} for r in written]


CASES = [
    (["compare", "--max-model-length", "128"], "compare", {"max_model_length": 128}),
    (["compare", "--kind", "reranker"], "compare", {"kind": "reranker"}),
    (["compare", "--endpoint", "http://127.0.0.1:9"], "compare", {"endpoint": ["http://127.0.0.1:9"]}),
    (
        ["compare", "--tasks", "WordSim353", "--reference", "remote"],
        "compare",
        {"tasks": "WordSim353", "reference": "remote"},
    ),
    (["bench", "--lengths", "long"], "bench", {"lengths": ["long"]}),
    (["bench", "--dtypes", "float16", "--dtype", "float32"], "bench", {"dtypes": ["float16"], "dtype": "float32"}),
    (["bench", "--endpoint", "http://127.0.0.1:9"], "bench", {"endpoint": "http://127.0.0.1:9"}),
    (
        ["bench", "--suite", "offline", "--dtypes", "float16", "float32"],
        "bench",
        {"suite": "offline", "dtypes": ["float16", "float32"]},
    ),
    (
        ["bench", "--suite", "offline", "--data-parallel-size", "1", "2"],
        "bench",
        {"suite": "offline", "data_parallel_size": [1, 2]},
    ),
]


@pytest.mark.parametrize("argv, function, call", CASES, ids=[" ".join(a) for a, _, _ in CASES])
def test_bad_input_is_the_commands_error_before_any_engine(argv, function, call, cli_in_process, monkeypatch, tmp_path):
    import vllm_eval.engine.build as build

    monkeypatch.setattr(build, "acquire_engine", lambda *a, **k: pytest.fail("an engine started"))
    monkeypatch.chdir(tmp_path)  # the default output folders are created before some of these checks
    code, err = cli_in_process(*argv)
    with pytest.raises(VllmEvalError) as caught:
        getattr(vllm_eval, function)(**call)
    message = str(caught.value)
    assert code == caught.value.exit_code == 2 and "\n" not in message
    assert err == f"vllm-eval: error: {message}\n"


def test_the_functions_are_exported_and_a_suite_has_a_folder_of_its_own():
    from vllm_eval.api.bench import bench_dir

    assert vllm_eval.compare is importlib.import_module("vllm_eval.api.compare").compare
    assert vllm_eval.bench is importlib.import_module("vllm_eval.api.bench").bench
    assert bench_dir(None) == bench_dir("results/bench") == bench_dir(os.path.join(os.getcwd(), "results", "bench"))
    assert bench_dir(None, "MTEB(eng, v2)").relative_to(os.getcwd()).as_posix() == "results/bench/suite-MTEB_eng_v2"
    assert bench_dir("out", "offline").name == "out"  # a folder given is the folder used
