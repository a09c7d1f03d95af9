"""The `vllm-eval` command end to end: in a fresh process where the process itself is under test (entry
points, piped output, the engine's log), else in this one (same ``main``, exit codes, files; shared engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_eval.testing import run_cli


def test_version_and_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "vllm_eval", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("vllm-eval 0.1.0 (") and "mteb" in proc.stdout
    # a bad flag's one line and exit 2 from the parser: tests/test_cli_errors.py, in process (13 s less of CI)


def test_tasks_lists_the_offline_suite(cli_in_process):
    code, err = cli_in_process("tasks", "--json")
    assert code == 0, err
    rows = json.loads(cli_in_process.stdout)
    assert [r["name"] for r in rows if r["kind"] == "generative"] == ["PangLeePolarity", "Digits"]
    eva = {r["name"]: r for r in rows if r["kind"] == "eva"}  # generate --tasks eva.NAME takes each of them
    assert list(eva) == ["eva.PatchCamelyon", "eva.PathMMUAtlas", "eva.PubMedQA", "eva.QuiltVQA"]
    assert eva["eva.PatchCamelyon"]["type"] == "eva image, multiple choice of 2"
    assert eva["eva.QuiltVQA"]["main_score"] == "test/GEvalCorrectness" and eva["eva.PubMedQA"]["kinds"] == [
        "generator"
    ]
    names = [row["name"] for row in rows if row["kind"] == "mteb"]
    assert names == [
        "LeeDocSimilarity",
        "SimLex999",
        "WordSim353",
        "PangLeePolarity",
        "TwentyNewsgroupsMini",
        "LeeKnownItemRetrieval",
        "DigitsZeroShot",  # the offline image tasks, for image models
        "DigitsImageClassification",
        "DigitsTextToImageRetrieval",
    ]


def test_unknown_task_lists_close_names(cli_in_process):
    code, err = cli_in_process("run", "--tasks", "LeeDocSimilarty")
    assert code == 2
    assert "unknown task 'LeeDocSimilarty'" in err and "LeeDocSimilarity" in err
    assert "Traceback" not in err


def test_missing_model_path_is_named(cli_in_process):
    code, err = cli_in_process("run", "--model", "/no/such/model", "--tasks", "WordSim353")
    assert code == 2
    assert "/no/such/model" in err and "Traceback" not in err


def test_unknown_engine_option_is_named(cli_in_process):
    code, err = cli_in_process("run", "--tasks", "WordSim353", "--max-model-length", "128")
    assert code == 2
    assert "max_model_length" in err and "max_model_len" in err


@pytest.mark.slow
def test_run_end_to_end_writes_results_and_exits_zero(tmp_path):
    out = tmp_path / "res"
    proc = run_cli(
        "run",
        "--tasks",
        "WordSim353,SimLex999",
        "--output-dir",
        str(out),
        "--max-num-seqs",
        "64",
        "--enforce-eager",
        "--no-cache",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Piped, so not a terminal: plain progress lines, no bar refreshes, vLLM's chatter in the log file only.
    print("\nstderr of a piped run:\n" + proc.stderr)
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr
    assert "[1/2] WordSim353 ..." in proc.stderr and "[2/2] SimLex999 finished in" in proc.stderr
    for noise in ("Triton", "Loading safetensors", "FutureWarning", "NUMA", "INFO"):
        assert noise not in proc.stderr, noise
    assert all(line.startswith(("[", "vllm-eval: ")) for line in proc.stderr.splitlines()), proc.stderr
    log = (out / "vllm-eval.log").read_text()
    assert "command: " in log and "vllm.v1.engine.core" in log  # the engine-core process logs here too
    assert "WordSim353" in proc.stdout and "spearman" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [s["task"] for s in summary["scores"]] == ["WordSim353", "SimLex999"]
    # Telemetry and provenance in every result.
    for row in summary["scores"]:
        assert row["inputs"] >= row["distinct_inputs"] > 0 and row["tokens"] > 0 and row["cache_hits"] == 0
        assert row["tokens_per_s"] * row["encode_seconds"] == pytest.approx(row["tokens"], rel=0.01)
        assert row["score_seconds"] >= 0 and row["mfu"] is None  # no peak FLOP/s known for this CPU
    assert summary["device"].startswith("CPU: ") and summary["engine_start_seconds"] > 1
    forced = summary["engine_options_in_force"]
    assert forced["dtype"] == "float32" and forced["enforce_eager"] is True and forced["max_num_seqs"] == 64
    assert summary["max_length"] == 256 and summary["prompts"]["instruction_template"] is None
    task_seconds = sum(r["seconds"] for r in summary["scores"])
    assert summary["total_seconds"] >= task_seconds + summary["engine_start_seconds"]
    assert summary["started_at"] <= summary["finished_at"] and "tok/s" in proc.stdout
    assert all(r["parity_n"] == 0 and r["parity_min_cosine"] is None for r in summary["scores"])
    assert summary["engine_kwargs"]["max_num_seqs"] == 64
    # The CPU build keeps the layout given (none: one engine); no layout line is printed there.
    assert summary["layout"] == {
        "gpus": 0,
        "data_parallel_size": 1,
        "replicas_per_gpu": 1,
        "tensor_parallel_size": 1,
        "chosen": "default",
    }
    assert "layout:" not in proc.stderr
    # The timeline: every phase of the run, the data loaded while the engine started.
    phases = summary["timeline"]["phases"]
    expected = {"interpreter", "imports", "model", "tasks", "engine", "load", "encode", "write", "shutdown"}
    assert expected <= {p["phase"] for p in phases}, phases
    (engine,) = [p for p in phases if p["phase"] == "engine"]
    for row in summary["scores"]:
        mine = [p for p in phases if p.get("task") == row["task"]]
        (load,) = [p for p in mine if p["phase"] == "load"]
        encodes = [p for p in mine if p["phase"] == "encode"]
        assert load["end"] <= min(p["start"] for p in encodes) and engine["end"] <= min(p["start"] for p in encodes)
        assert sum(p["end"] - p["start"] for p in encodes) >= row["encode_seconds"] - 0.01
    first_load = next(p for p in phases if p["phase"] == "load")
    assert first_load["start"] < engine["end"] and first_load["end"] > engine["start"]  # loaded while it started
    (shutdown,) = [p for p in phases if p["phase"] == "shutdown"]
    assert shutdown["start"] >= max(p["end"] for p in phases if p["phase"] == "encode")
    result = next(out.rglob("WordSim353.json"))
    mteb_json = json.loads(result.read_text())
    assert mteb_json["task_name"] == "WordSim353"
    assert mteb_json["scores"]["test"][0]["main_score"] == pytest.approx(summary["scores"][0]["main_score"])
    assert "terminate called" not in proc.stderr


def test_models_lists_the_registry(cli_in_process):
    code, err = cli_in_process("models")
    assert code == 0, err
    assert "qwen3-reranker" in cli_in_process.stdout and "reranker" in cli_in_process.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="14 s of CI's 30 minutes: both stages run in CI through the API (tests/test_api_kinds.py) and the reranker's"
    " stage through the command (tests/test_reranker.py); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_rerank_two_stages_end_to_end(cli_in_process, tmp_path, test_models, vllm_cross):
    out = tmp_path / "res"
    code, err = cli_in_process(
        "rerank",
        "--first-stage",
        "bm25s",
        "--reranker",
        str(test_models["cross"]),
        "--top-k",
        "5",
        "--tasks",
        "LeeKnownItemRetrieval",
        "--output-dir",
        str(out),
        "--no-progress",
    )
    assert code == 0, err[-3000:]
    stdout = cli_in_process.stdout
    assert "first" in stdout and "rerank" in stdout and stdout.count("ndcg_at_10") == 2
    assert (out / "stage1" / "summary.json").is_file() and (out / "stage2" / "summary.json").is_file()
    stage2 = json.loads((out / "stage2" / "summary.json").read_text())
    assert stage2["top_k"] == 5 and stage2["scores"][0]["stage"] == "rerank"


def test_rerank_refuses_a_model_without_head_or_recipe(cli_in_process, test_models):
    code, err = cli_in_process("rerank", "--reranker", str(test_models["qwen3"]), "--top-k", "5", "--no-progress")
    assert code == 2
    assert "neither a classifier head nor a registered reranker recipe" in err


@pytest.mark.slow
def test_generate_end_to_end_both_scorings(cli_in_process, tmp_path, test_models, generator):
    model = str(test_models["qwen3"])
    out = tmp_path / "gen"
    code, err = cli_in_process(
        "generate",
        "--model",
        model,
        "--task",
        "PangLeePolarity",
        "--limit",
        "8",
        "--max-tokens",
        "8",
        "--answer-format",
        "xml",
        "--max-missing",
        "1",
        "--output-dir",
        str(out),
        "--no-progress",
    )
    assert code == 0, err[-3000:]
    assert "accuracy" in cli_in_process.stdout and "macro-F1" in cli_in_process.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["answer_format"] == "xml" and results["config"]["sampling"]["max_tokens"] == 8
    assert len((out / "samples.jsonl").read_text().splitlines()) == 8
    out2 = tmp_path / "ll"
    code, err = cli_in_process(
        "generate",
        "--model",
        model,
        "--task",
        "PangLeePolarity",
        "--limit",
        "8",
        "--scoring",
        "loglikelihood",
        "--output-dir",
        str(out2),
        "--no-progress",
    )
    assert code == 0, err[-3000:]
    assert json.loads((out2 / "results.json").read_text())["metrics"]["missing"] == 0
    out3 = tmp_path / "strict"
    code, err = cli_in_process(
        "generate",
        "--model",
        model,
        "--task",
        "PangLeePolarity",
        "--limit",
        "4",
        "--max-tokens",
        "4",
        "--max-missing",
        "0",
        "--output-dir",
        str(out3),
        "--no-progress",
    )
    assert code == 1 and "budget of 0" in err
    assert (out3 / "samples.jsonl").is_file()  # results are kept even when the run fails


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="12 s of CI's 30 minutes: an unknown generate task is refused in CI by tests/test_cli_errors.py;"
    " VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_generate_unknown_task(cli_in_process, test_models):
    code, err = cli_in_process("generate", "--model", str(test_models["qwen3"]), "--task", "Nope")
    assert code == 2 and "unknown task 'Nope'" in err
