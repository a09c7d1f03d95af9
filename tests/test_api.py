"""The library API: ``vllm_eval.evaluate`` writes what ``vllm-eval run`` writes, resumes after its engine stalled,
and refuses bad input with the command's one-line errors before anything loads."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import vllm_eval
from vllm_eval.testing import offline_env
from vllm_eval.utils.errors import OptionError, UnknownNameError, UsageError

TASKS = ["WordSim353", "TwentyNewsgroupsMini"]
#: Run text of the Python API, as a user would write it (spawned processes need the ``__main__`` guard); a stalled
#: engine ends it with the error's exit code.
SCRIPT = """
import sys
import vllm_eval
from vllm_eval.utils.errors import EngineError

if __name__ == "__main__":
    try:
        vllm_eval.evaluate(
            tasks="WordSim353, TwentyNewsgroupsMini", output_dir=sys.argv[1], cache_dir=sys.argv[2], chunk_size=16,
            show_progress=False, stall_timeout=3,
        )
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
"""


def _scores(summary: dict) -> dict[str, float]:
    return {s["task"]: s["main_score"] for s in summary["scores"]}


def _entries(cache) -> int:
    with sqlite3.connect(f"file:{cache / 'outputs.sqlite'}?mode=ro", uri=True, timeout=5) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM outputs").fetchone()[0])


def _mteb_scores(out) -> dict[str, dict]:
    return {
        p.stem: json.loads(p.read_text())["scores"] for p in out.rglob("results/**/*.json") if p.stem != "model_meta"
    }


@pytest.mark.slow
def test_evaluate_writes_what_run_writes(cli_in_process, vllm_encoder, tmp_path):  # vllm_encoder: the engine
    out, cache = tmp_path / "cli", tmp_path / "cache"
    tasks = ["LeeDocSimilarity", "WordSim353", "PangLeePolarity"]  # three kinds of task; the suite's cheapest
    code, err = cli_in_process(
        "run", "--tasks", ",".join(tasks), "--output-dir", str(out), "--cache-dir", str(cache), "--no-progress"
    )
    assert code == 0, err[-3000:]
    stored = _entries(cache)
    cli_bytes = (out / "summary.json").read_bytes()
    result = vllm_eval.evaluate(tasks=tasks, output_dir=tmp_path / "api", cache_dir=cache, show_progress=False)
    assert (out / "summary.json").read_bytes() == cli_bytes  # a later run leaves an earlier run's summary alone
    cli_summary = json.loads((out / "summary.json").read_text())
    api_summary = json.loads(result.summary_path.read_text())
    assert result.summary_path == tmp_path / "api" / "summary.json"
    assert result.scores == _scores(cli_summary) == _scores(api_summary)  # equal, not close
    assert _mteb_scores(tmp_path / "api") == _mteb_scores(out) and len(_mteb_scores(out)) == 3
    assert result.results_dir.is_dir() and {p.stem for p in result.results_dir.glob("*.json")} >= set(result.scores)
    assert _entries(cache) == stored and all(r.cache_hits > 0 for r in result.rows)  # all from the run's cache
    same = ("model", "backend", "revision", "preset", "engine_kwargs", "engine_options_in_force", "prompts")
    assert {k: api_summary.get(k) for k in same} == {k: cli_summary.get(k) for k in same}
    phases = {p["phase"] for p in result.timeline["phases"]}
    assert {"imports", "model", "tasks", "engine", "load", "encode", "write"} <= phases, phases
    assert api_summary["timeline"]["phases"]  # the summary keeps the timeline
    assert result.cache.stats.hits == sum(r.cache_hits for r in result.rows) and not result.failed


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="66 s: the CI's 30 minutes; its parts run in CI (test_watchdog: a real stalled engine; test_resume: a "
    "run killed mid-task resumes). VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_evaluate_stopped_by_a_stalled_engine_resumes(vllm_encoder, tmp_path):  # vllm_encoder: the engine
    # A user's script whose engine hangs for real mid-task (its engine-core processes stopped with SIGSTOP once chunks
    # of the second task are cached): the watchdog stops it (EngineStalled, exit 3), the engine processes are gone, the
    # first task's result and the cached chunks are kept, and the same call resumes in this process (the session's
    # engine); an uninterrupted call is the reference.
    import psutil

    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out), str(cache)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**offline_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},  # the core in processes of its own, to stop
    )
    first_task = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if first_task is None and (out / "summary.json").is_file():
            first_task = _entries(cache)
        if first_task is not None and _entries(cache) >= first_task + 32:
            break  # two chunks of the second task are committed
        time.sleep(0.05)
    assert proc.poll() is None and first_task is not None, "the run ended before it could be stopped"
    engine = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name().startswith("VLLM::")]
    for p in engine:
        p.send_signal(signal.SIGSTOP)
    _, err = proc.communicate(timeout=120)
    _, alive = psutil.wait_procs(engine, timeout=15)
    assert engine, "no engine processes were started"
    assert proc.returncode == 3 and "made no progress for" in err and "--stall-timeout 3" in err, err[-2000:]
    assert not alive
    first = json.loads((out / "summary.json").read_text())["scores"]
    assert [s["task"] for s in first] == TASKS[:1]
    stored = _entries(cache)
    resumed = vllm_eval.evaluate(tasks=TASKS, output_dir=out, cache_dir=cache, chunk_size=16, show_progress=False)
    status = {r.task: r.status for r in resumed.rows}
    print(f"\nstalled after {[s['task'] for s in first]} ({stored} outputs cached); resumed: {status}")
    assert status == {TASKS[0]: "reused", TASKS[1]: "computed"}
    assert resumed.rows[1].cache_hits >= 32  # the chunks committed before the stall
    reference = vllm_eval.evaluate(tasks=TASKS, output_dir=tmp_path / "ref", no_cache=True, show_progress=False).scores
    rows = _scores(json.loads((out / "summary.json").read_text()))
    assert list(rows) == TASKS and rows == resumed.scores
    assert rows[TASKS[0]] == round(reference[TASKS[0]], 6)  # read back from mteb's file (6 digits)
    assert rows[TASKS[1]] == reference[TASKS[1]]  # equal, not close


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (dict(max_model_length=128), OptionError, "max_model_len"),
        (dict(backend="st", max_num_seqs=8), UsageError, "does not take vLLM engine options"),
        (dict(tasks="NoSuchTask"), UnknownNameError, "NoSuchTask"),
        (dict(log_samples=True), UsageError, "--log-samples needs --output-dir"),
        (dict(data="x.jsonl", tasks="WordSim353"), UsageError, "not both"),
        (dict(pooling_task="classify"), UsageError, "--pooling-task must be one of"),
        (dict(check_parity=4, backend="st"), UsageError, "run it with another backend"),
    ],
)
def test_evaluate_refuses_bad_input_before_loading(call, error, message, monkeypatch):
    import vllm_eval.engine.build as build

    monkeypatch.setattr(build, "acquire_engine", lambda *a, **k: pytest.fail("an engine started"))
    with pytest.raises(error, match=message) as caught:
        vllm_eval.evaluate(**call, show_progress=False, no_cache=True)
    assert "\n" not in str(caught.value)


def test_a_benchmark_name_given_as_a_task_runs_the_benchmark():
    from vllm_eval.tasks import get_benchmark_tasks, select_tasks, split_names

    names = split_names(["WordSim353, MTEB(eng, v2)"])
    assert names == ["WordSim353", "MTEB(eng, v2)"]
    tasks = [t.metadata.name for t in select_tasks(names)]
    assert tasks[0] == "WordSim353" and tasks[1:] == [t.metadata.name for t in get_benchmark_tasks("MTEB(eng, v2)")]


def test_old_import_paths_are_the_moved_modules():
    import importlib

    from vllm_eval.evaluation import results
    from vllm_eval.models.encoder import base

    sys.modules.pop("vllm_eval.results", None)  # imported under its old name only here
    with pytest.warns(DeprecationWarning, match="moved to vllm_eval.evaluation.results"):
        assert importlib.import_module("vllm_eval.results") is results
    assert importlib.import_module("vllm_eval.encoder.base") is base  # one module object, not a copy
    assert vllm_eval.evaluate is importlib.import_module("vllm_eval.api.evaluate").evaluate


def test_tasks_pick_among_a_replicas_tasks(replica):
    from vllm_eval.api.evaluate import select

    assert [t.metadata.name for t in select("encoder", tasks="sts12, SCIDOCS", data=replica)] == ["STS12", "SCIDOCS"]
    assert len(select("encoder", data=replica)) > 2  # all of them
    with pytest.raises(UnknownNameError, match="'STS99' is not a task of the replica"):
        select("encoder", tasks="STS99", data=replica)
    with pytest.raises(UsageError, match="give --data or --benchmark, not both"):
        select("encoder", benchmark="MTEB(eng, v2)", data=replica)
