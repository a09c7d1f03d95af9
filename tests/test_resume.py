"""Interrupted runs: kill -9 mid-task then rerun, SIGTERM shuts down cleanly, a stalled engine ends the command with
exit 3; benchmarks and failed tasks."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from vllm_eval.testing import cli_command, offline_env

TASKS = ["WordSim353", "TwentyNewsgroupsMini"]


def _args(out, cache) -> list[str]:
    return ["run", "--tasks", *TASKS, "--chunk-size", "16", "--output-dir", str(out), "--cache-dir", str(cache)]


def _run(out, cache) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(*_args(out, cache)), capture_output=True, text=True, timeout=600, env=offline_env()
    )


def _entries(cache) -> int:
    db = cache / "outputs.sqlite"
    if not db.is_file():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM outputs").fetchone()[0])
    except sqlite3.Error:
        return 0


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_kill_9_mid_task_then_rerun_finishes_with_equal_scores(cli_in_process, tmp_path):
    # The uninterrupted reference runs in this process (same options, the session's engine); the
    # killed run and its rerun are processes of their own.
    code, err = cli_in_process(*_args(tmp_path / "ref", tmp_path / "ref-cache"))
    assert code == 0, err[-2000:]
    reference = {s["task"]: s["main_score"] for s in _summary(tmp_path / "ref")["scores"]}
    distinct_news = next(s for s in _summary(tmp_path / "ref")["scores"] if s["task"] == TASKS[1])["cache_misses"]

    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen(
        cli_command(*_args(out, cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=offline_env(),
        start_new_session=True,
    )
    first_task_done = None
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            if (out / "summary.json").is_file() and first_task_done is None:
                first_task_done = _entries(cache)  # WordSim353's words are all in the cache by now
            if first_task_done is not None and _entries(cache) >= first_task_done + 48:
                break  # at least three chunks of the second task are committed
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9, engine processes included
        proc.wait()
    assert first_task_done is not None, "the run finished or stalled before it could be interrupted"
    committed = _entries(cache)
    news_committed = committed - first_task_done
    assert 0 < news_committed < distinct_news, (committed, first_task_done, distinct_news)

    start = time.perf_counter()
    resumed = _run(out, cache)
    resumed_s = time.perf_counter() - start
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = {s["task"]: s for s in _summary(out)["scores"]}
    print(
        f"\nkilled after {news_committed} of {distinct_news} {TASKS[1]} texts were cached; rerun "
        f"{resumed_s:.1f} s; rows: { {k: (v['status'], v['cache_hits'], v['cache_misses']) for k, v in rows.items()} }"
    )
    assert rows[TASKS[0]]["status"] == "reused"  # finished task read back, not recomputed
    assert rows[TASKS[1]]["cache_hits"] == news_committed  # every committed batch reused
    assert rows[TASKS[1]]["cache_misses"] == distinct_news - news_committed  # only the missing inputs computed
    assert rows[TASKS[1]]["main_score"] == reference[TASKS[1]]  # equal, not close
    assert rows[TASKS[0]]["main_score"] == round(reference[TASKS[0]], 6)  # read back from mteb's file (6 digits)
    assert "reusing WordSim353" in resumed.stderr and "cache: " in resumed.stdout


def test_a_signal_whose_exception_surfaces_as_another_still_exits_128_plus_it(monkeypatch, cli_in_process):
    """SIGTERM's exception raised inside a `with lock:` can reach the command as another error (seen in CI:
    "RuntimeError: cannot release un-acquired lock" from a thread's Future.result()): still 143 and the one line."""
    import vllm_eval.cli as cli

    def dispatch(argv):
        try:
            cli._raise_interrupted(signal.SIGTERM, None)
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock") from None

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    code, err = cli_in_process("run", "--tasks", "WordSim353")
    assert code == 143 and "vllm-eval: interrupted (SIGTERM)" in err

    def failing(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_dispatch", failing)
    with pytest.raises(RuntimeError, match="a bug"):  # without a signal, an error stays itself
        cli_in_process("run", "--tasks", "WordSim353")


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="48 s of CI's 30 minutes: a signal's exit code runs in CI in this module's in-process case, a real "
    "kill of a running command in its kill -9 case; VLLMEVAL_FULL_TESTS=1 runs it",
)
@pytest.mark.slow
def test_sigterm_shuts_engines_down_keeps_results_and_exits_143(tmp_path):
    import psutil

    out = tmp_path / "run"
    proc = subprocess.Popen(
        cli_command("run", "--tasks", *TASKS, "--chunk-size", "16", "--output-dir", str(out), "--no-cache"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # The engine core in processes of its own (vLLM's default; ours on GPUs): they must go too.
        env={**offline_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (out / "summary.json").is_file():
        time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "no engine processes were started"
    start = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    stop_s = time.perf_counter() - start
    gone, alive = psutil.wait_procs(children, timeout=15)
    print(
        f"\nSIGTERM: exit {proc.returncode} after {stop_s:.1f} s; {len(gone)} engine processes gone, {len(alive)} left"
    )
    assert proc.returncode == 143, err[-2000:]
    assert not alive, [p.info if hasattr(p, "info") else p for p in alive]
    assert "interrupted (SIGTERM)" in err and "Traceback" not in err
    summary = _summary(out)
    assert summary["scores"][0]["task"] == TASKS[0]  # the finished task stays recorded
    assert next(out.rglob(f"{TASKS[0]}.json")).is_file()


def test_a_stalled_engine_ends_the_command_with_exit_3_and_one_line(cli_in_process, monkeypatch):
    # The stall itself, with a real engine whose core is stopped, is in test_api.py (the library call under it).
    from vllm_eval.engine.watchdog import EngineStalled
    from vllm_eval.models import vllm_backend

    def stalled(*args, **kwargs):
        raise EngineStalled("the vLLM engine for m made no progress for 4 s (one engine step; --stall-timeout 3)")

    monkeypatch.setattr(vllm_backend, "acquire_engine", stalled)
    code, err = cli_in_process("run", "--tasks", "WordSim353", "--no-cache", "--no-progress")
    assert (
        code == 3
        and err
        == "vllm-eval: error: the vLLM engine for m made no progress for 4 s (one engine step; --stall-timeout 3)\n"
    ), err


def test_benchmark_lists_its_tasks_offline(cli_in_process):
    # In process (the session's imports): two subprocesses took 21 s of CI for the same command lines.
    code, err = cli_in_process("tasks", "--benchmark", "MTEB(eng, v2)", "--task-types", "STS", "--json")
    assert code == 0, err
    rows = json.loads(cli_in_process.stdout)
    assert rows and all(r["type"] == "STS" for r in rows) and "STS12" in {r["name"] for r in rows}
    assert not any(r["available"] for r in rows)  # offline, nothing cached
    code, err = cli_in_process("tasks", "--benchmark", "MTEB(eng, v3)")
    assert code == 2 and "unknown benchmark 'MTEB(eng, v3)'; close names: MTEB(eng, v2)" in err


def test_continue_on_error_marks_the_unavailable_task(cli_in_process, tmp_path):
    code, err = cli_in_process(
        "run",
        "--tasks",
        "WordSim353",
        "STS12",
        "--continue-on-error",
        "--no-progress",
        "--output-dir",
        str(tmp_path),
        "--no-cache",
    )
    assert code == 1, err
    rows = {s["task"]: s for s in json.loads((tmp_path / "summary.json").read_text())["scores"]}
    assert rows["WordSim353"]["status"] == "computed" and rows["WordSim353"]["main_score"] > 0.5
    assert rows["STS12"]["status"].startswith("failed: task STS12 needs dataset mteb/sts12-sts")
    code, err = cli_in_process("run", "--tasks", "STS12", "--continue-on-error", "--no-cache")
    assert code == 2 and "STS12" in err  # nothing left to run: an error before any engine starts


def test_log_samples_writes_jsonl_per_task(cli_in_process, tmp_path):
    code, err = cli_in_process(
        "run",
        "--tasks",
        "WordSim353",
        "LeeKnownItemRetrieval",
        "--log-samples",
        "--no-progress",
        "--output-dir",
        str(tmp_path),
        "--no-cache",
    )
    assert code == 0, err
    sts = [json.loads(x) for x in (tmp_path / "samples" / "WordSim353.jsonl").read_text().splitlines()]
    assert len(sts) == 353 and isinstance(sts[0]["cosine_scores"], float) and sts[0]["split"] == "test"
    ret = [json.loads(x) for x in (tmp_path / "samples" / "LeeKnownItemRetrieval.jsonl").read_text().splitlines()]
    assert len(ret) == 48 and len(ret[0]["top_k"]) == 10
    scores = [s for _, s in ret[0]["top_k"]]
    assert scores == sorted(scores, reverse=True)
