"""`vllm-eval compare`: configurations against a reference, tolerances as an exit code; telemetry in results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_eval.compare import Config, ConfigResult, agreement, compare_results, configurations, parse_reference


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
    assert agreement(ref_emb, ref_emb[:, :4])[0] == pytest.approx(1.0)  # a narrower width compares its prefix


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
