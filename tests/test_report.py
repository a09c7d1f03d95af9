"""`vllm-eval report`: one self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from vllm_eval.measure.compare import Config, ConfigResult, compare_results, save

TASKS = ["WordSim353", "LeeKnownItemRetrieval"]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:  # `make test` installs it (Debian's chromium); a bare pytest elsewhere may lack it
        pytest.skip("chromium is not installed (make test installs it)")
    return path


def test_report_is_self_contained_and_renders(cli_in_process, tmp_path, vllm_encoder):
    from PIL import Image

    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks import get_tasks

    run = tmp_path / "run"
    evaluate(vllm_encoder, get_tasks(TASKS), output_dir=run, show_progress_bar=False, run_info={"backend": "vllm"})
    ref = ConfigResult(Config("st", "float32"), {"WordSim353": 0.7289, "LeeKnownItemRetrieval": 0.8754})
    other = ConfigResult(Config("vllm", "bfloat16"), {"WordSim353": 0.7301, "LeeKnownItemRetrieval": 0.8754})
    save(compare_results([ref, other], ref, 1e-4, 1e-3), run)
    code, err = cli_in_process("report", str(run), "-o", str(tmp_path / "report.html"))
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    assert "<script" not in page and "<link" not in page and "src='http" not in page  # no network assets
    # time/throughput, the timeline (the tasks' loads and encode calls) and the parity plots, inline
    assert page.count("data:image/png;base64,") == 3 and "<h3>Timeline</h3>" in page
    assert "seconds per phase" in page and "<th>encode</th>" in page and "<th>load</th>" in page
    assert "engine options in force" in page and "FAIL" in page  # provenance; bf16's 1.2e-3 > 1e-3

    chromium = _chromium()
    url = (tmp_path / "report.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", "--window-size=1280,1800", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    dark = float((pixels < 128).mean())
    print(f"\nscreenshot {pixels.shape[1]}x{pixels.shape[0]}: std {pixels.std():.1f}, dark share {dark:.3f}")
    assert pixels.std() > 10 and dark > 0.005  # text and plots, not a blank page
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert all(task in dom for task in TASKS)
