"""`vllm-eval compare`: configurations against a reference, tolerances as an exit code; telemetry in results."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from vllm_eval.measure.compare import Config, ConfigResult, agreement, compare_results, configurations, parse_reference


def test_configurations_labels_and_tolerances():
    configs = configurations(["vllm", "st"], ["float32", "bfloat16"], ["fp8"], None)
    assert [c.label for c in configs] == ["vllm float32 fp8", "vllm bfloat16 fp8", "st float32", "st bfloat16"]
    assert Config("st", "float32").tolerance(1e-4, 1e-3) == 1e-4
    assert Config("vllm", "bfloat16").tolerance(1e-4, 1e-3) == 1e-3
    assert Config("vllm", "float32", "fp8").tolerance(1e-4, 1e-3) == 1e-3
    assert parse_reference("st:float32") == Config("st", "float32") and parse_reference("vllm") == Config("vllm")


def test_scores_and_agreement_decide_pass_or_fail():
    rng = np.random.default_rng(0)
    ref_emb = rng.standard_normal((5, 8)).astype(np.float32)
    ref = ConfigResult(Config("st", "float32"), {"A": 0.5, "B": 0.7}, ["x"] * 5, ref_emb)
    close = ConfigResult(Config("vllm", "float32"), {"A": 0.50005, "B": 0.7}, ["x"] * 5, ref_emb + 1e-6)
    far = ConfigResult(Config("vllm", "bfloat16"), {"A": 0.502, "B": 0.7}, ["x"] * 5, ref_emb[:, :4])
    result = compare_results([ref, close, far], ref, 1e-4, 1e-3)
    failed = [(r["task"], r["config"]) for r in result.rows if not r["passed"]]
    assert failed == [("A", "vllm bfloat16")] and not result.passed
    assert result.agreement["vllm float32"]["min_cosine"] > 0.999999
    assert agreement(ref_emb, ref_emb[:, :4])["min_cosine"] == pytest.approx(1.0)  # a narrower width: its prefix
    # Scores and log-likelihoods (1-D) agree by |Δ|.
    diff = agreement(np.array([0.1, -2.0, 3.0]), np.array([0.1, -2.5, 3.0]))
    assert diff == {"max_abs_diff": 0.5, "median_abs_diff": 0.0, "n": 3}


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="21 s of CI's 30 minutes: compare's verdicts run in CI in this module's other cases (pass or fail "
    "from scores and agreement; the reranker, generator and classifier against their references); "
    "VLLMEVAL_FULL_TESTS=1 runs it",
)
@pytest.mark.slow
def test_compare_cli_passes_for_parity_and_fails_when_perturbed(cli_in_process, tmp_path):
    out = tmp_path / "cmp"
    code, err = cli_in_process(
        "compare",
        "--backends",
        "vllm",
        "st",
        "--tasks",
        "WordSim353",
        "SimLex999",
        "TwentyNewsgroupsMini",  # clustering: its bootstrap subsets come from the task object's random state
        "--output-dir",
        str(out),
        "--no-progress",
        "--sample",
        "64",
    )
    assert code == 0, err
    report = json.loads((out / "compare.json").read_text())
    assert report["passed"] and report["reference"] == "st default"
    assert {r["config"] for r in report["rows"]} == {"vllm default", "st default"}
    assert all(r["delta"] <= 1e-4 for r in report["rows"])
    agree = report["agreement"]["vllm default"]
    print(
        f"\ncompare vllm vs st: max |delta| {max(r['delta'] for r in report['rows']):.2e}, "
        f"min cosine {agree['min_cosine']:.8f} over {agree['n']} inputs"
    )
    assert agree["n"] == 64 and agree["min_cosine"] > 0.9999
    # A different width is a different configuration: compared with the full one, it fails.
    code, err = cli_in_process(
        "compare",
        "--backends",
        "st",
        "--dimensions",
        "32",
        "--tasks",
        "WordSim353",
        "--output-dir",
        str(tmp_path / "cmp2"),
        "--no-progress",
    )
    report = json.loads((tmp_path / "cmp2" / "compare.json").read_text())
    assert code == 1 and not report["passed"], err
    assert [r["config"] for r in report["rows"] if not r["passed"]] == ["st default d=32"]


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="18 s of CI's 30 minutes: compare's parity check runs in CI on the reranker, generator and classifier"
    " (the test above); VLLMEVAL_FULL_TESTS=1 runs it",
)
@pytest.mark.slow
def test_run_check_parity_records_agreement_per_task(cli_in_process, tmp_path, capsys):
    code, err = cli_in_process(
        "run",
        "--tasks",
        "WordSim353",
        "LeeKnownItemRetrieval",
        "--check-parity",
        "16",
        "--no-cache",
        "--no-progress",
        "--output-dir",
        str(tmp_path),
    )
    assert code == 0, err
    rows = json.loads((tmp_path / "summary.json").read_text())["scores"]
    print(f"\n--check-parity 16: {[(r['task'], r['parity_min_cosine']) for r in rows]}")
    assert all(r["parity_n"] == 16 and r["parity_min_cosine"] > 0.9999 for r in rows)


@pytest.mark.slow
def test_compare_reranker_generator_classifier_against_their_references(
    cli_in_process, test_models, vllm_cross, generator, vllm_classifier, tmp_path
):
    """Every kind compares: a reranker's scores with sentence-transformers' CrossEncoder, a generator's
    log-likelihoods (multiple choice) and a classifier's probabilities with transformers, per task and
    per sampled input. (The session's engines are reused: the fixtures keep them up.)"""
    code, err = cli_in_process(
        "compare",
        "--kind",
        "reranker",
        "--model",
        str(test_models["cross"]),
        "--top-k",
        "3",
        "--sample",
        "40",
        "--output-dir",
        str(tmp_path / "rr"),
        "--no-progress",
    )
    assert code == 0, err
    report = json.loads((tmp_path / "rr" / "compare.json").read_text())
    assert report["reference"] == "st default" and {r["task"] for r in report["rows"]} == {"LeeKnownItemRetrieval"}
    rr = report["agreement"]["vllm default"]
    assert rr["n"] == 40 and rr["max_abs_diff"] <= 1e-4, rr

    code, err = cli_in_process(
        "compare",
        "--kind",
        "generator",
        "--model",
        str(test_models["qwen3"]),
        "--limit",
        "12",
        "--sample",
        "24",
        "--output-dir",
        str(tmp_path / "gen"),
        "--no-progress",
    )
    assert code == 0, err
    report = json.loads((tmp_path / "gen" / "compare.json").read_text())
    assert report["reference"] == "hf default" and [r["task"] for r in report["rows"]] == ["PangLeePolarity"] * 2
    gen = report["agreement"]["vllm default"]
    print(f"\ncompare reranker: {rr}; generator log-likelihoods: {gen}")
    assert gen["n"] == 24 and gen["max_abs_diff"] <= 1e-4, gen
    assert len(list((tmp_path / "gen").glob("vllm*/PangLeePolarity/samples.jsonl"))) == 1

    code, err = cli_in_process(
        "compare",
        "--kind",
        "classifier",
        "--model",
        str(test_models["classifier"]),
        "--sample",
        "50",
        "--output-dir",
        str(tmp_path / "cls"),
        "--no-progress",
    )
    assert code == 0, err
    report = json.loads((tmp_path / "cls" / "compare.json").read_text())
    cls = report["agreement"]["vllm default"]
    print(f"classifier probabilities: {cls}")
    assert report["reference"] == "hf default" and cls["n"] == 50 and cls["max_abs_diff"] <= 1e-4


def test_compare_refuses_what_a_kind_cannot_do(cli_in_process, test_models):
    code, err = cli_in_process(
        "compare", "--kind", "generator", "--model", str(test_models["qwen3"]), "--tasks", "Digits"
    )
    assert code == 2 and "log-likelihood" in err and "Digits" in err
    code, err = cli_in_process(
        "compare", "--kind", "reranker", "--backends", "hf", "--model", str(test_models["cross"])
    )
    assert code == 2 and "reranker backend 'hf'" in err
    code, err = cli_in_process("compare", "--kind", "reranker")
    assert code == 2 and "--model is required" in err
