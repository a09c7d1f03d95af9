"""A ``bench --suite`` run again with the same output folder resumes: finished backends are read back, a stopped one
runs only its missing tasks, and its time is the sum of its attempts. Changed settings are refused.

Cheap by construction: the suite's machinery runs a stand-in backend process (a few lines of Python that "compute"
one task per call and honour SIGTERM as the real ones do); the real peer's reading back is run in this process on two
tasks of the session's tiny replica.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from vllm_eval.measure import suite as suite_mod
from vllm_eval.measure.resume import read_attempts
from vllm_eval.utils.errors import UsageError
from vllm_eval.utils.modelinfo import packaged_model_path

#: A stand-in backend: argv = run folder, control folder, task names. A task with a file under <run>/done is read
#: back; the others are computed (after the first, forever when <control>/slow exists: a time limit stops it; with
#: <control>/alarm, the suite's process gets SIGALRM first; the first N starts exit 3 after the first task, as a run
#: whose engine stalled, when <control>/stall holds N).
_FAKE = """
import json, os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
out, control, tasks = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
with open(control / "starts", "a") as f:
    f.write("x")
origin, phases, scores = time.time(), [], []
(out / "done").mkdir(exist_ok=True)
for i, task in enumerate(tasks):
    reused = (out / "done" / task).is_file()
    if not reused:
        if i > 0 and (control / "alarm").is_file():
            os.kill(os.getppid(), signal.SIGALRM)  # the suite's process: "interrupted" now
        if i > 0 and (control / "slow").is_file():
            time.sleep(60)
        stall = control / "stall"
        if i > 0 and stall.is_file() and len((control / "starts").read_text()) <= int(stall.read_text()):
            sys.exit(3)  # "the engine stalled" (engine.watchdog), after the first task
        start = time.time() - origin
        time.sleep(0.01)
        phases.append({"phase": "encode", "start": start, "end": time.time() - origin, "task": task})
        (out / "done" / task).write_text("0.5")
    scores.append({"task": task, "main_score": 0.5, "status": "reused" if reused else "computed"})
    summary = {"backend": "st", "scores": scores, "timeline": {"origin": origin, "phases": phases}}
    (out / "summary.json").write_text(json.dumps(summary))
"""


@pytest.fixture
def fake_backend(tmp_path, monkeypatch):
    """The suite's backends replaced by :data:`_FAKE`; returns its control folder (``starts``: one x per start)."""
    control = tmp_path / "control"
    control.mkdir()
    script = control / "fake.py"
    script.write_text(_FAKE)

    def command(backend, model, task_args, out, dtype, engine):
        return [sys.executable, str(script), str(out), str(control), *task_args[1:]]

    monkeypatch.setattr(suite_mod, "_command", command)
    return control


def _starts(control) -> int:
    return len((control / "starts").read_text())


def test_a_stopped_backend_resumes_its_missing_tasks_and_sums_its_attempts(fake_backend, tmp_path, capsys):
    out = tmp_path / "suite"
    (fake_backend / "slow").touch()
    (first,) = suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=out, time_limit=1.0)
    assert first.stopped == "time-limit" and first.attempts == 1 and first.returncode == 143
    assert first.task_status == {"LeeDocSimilarity": "computed"} and first.seconds >= 1.0
    problem = suite_mod.suite_problem([first], out, 1.0)
    assert "st stopped at --time-limit 1 s" in problem and "run the same command again to resume" in problem

    (fake_backend / "slow").unlink()
    (second,) = suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=out)
    tasks = list(suite_mod._task_args("offline", out)[1:])
    assert second.returncode == 0 and second.stopped is None and second.attempts == 2 and len(second.scores) == 6
    assert second.task_status == {t: "reused" if t == "LeeDocSimilarity" else "computed" for t in tasks}
    assert second.seconds == round(sum(second.attempt_seconds), 2) and second.attempt_seconds[0] == first.seconds
    assert second.phases["encode"] >= 6 * 0.01  # one encode per task, summed over both attempts' timelines
    saved = json.loads((out / "suite.json").read_text())["records"][0]
    assert saved["attempts"] == 2 and saved["seconds"] == second.seconds and saved["stopped"] is None
    assert (out / "st" / "attempts" / "1" / "log.txt").is_file() and (out / "st" / "log.txt").is_file()
    assert [a.stopped for a in read_attempts(out / "st")] == ["time-limit", None]
    assert suite_mod.suite_problem([second], out) is None
    suite_mod.print_suite([second], "offline")
    assert "attempts" in capsys.readouterr().out

    # Finished: read back, not run again.
    (third,) = suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=out)
    assert _starts(fake_backend) == 2 and third.seconds == second.seconds and third.attempts == 2
    assert "finished before" in capsys.readouterr().out


def test_an_attempt_whose_engine_stalled_is_resumed_at_once_a_bounded_number_of_times(fake_backend, tmp_path, capsys):
    (fake_backend / "stall").write_text("1")
    (record,) = suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=tmp_path / "a")
    assert record.returncode == 0 and record.attempts == 2 and len(record.scores) == 6
    assert [a.returncode for a in read_attempts(tmp_path / "a" / "st")] == [3, 0]
    assert "st: its engine stalled after" in capsys.readouterr().out

    (fake_backend / "stall").write_text("99")  # stalls every time: given up after the retries, exit 3 kept
    (record,) = suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=tmp_path / "b")
    assert record.returncode == 3 and record.attempts == 1 + suite_mod.STALL_RETRIES and len(record.scores) == 1


def test_changed_settings_are_refused_in_one_line_and_restart_starts_over(fake_backend, tmp_path, cli_in_process):
    out = str(tmp_path / "suite")
    flags = ["bench", "--suite", "offline", "--backends", "st", "--output-dir", out]
    code, err = cli_in_process(*flags)
    assert code == 0, err
    code, err = cli_in_process(*flags, "--dtype", "float16")
    assert code == 2 and err.count("\n") == 1
    assert "holds a suite run with --dtype (default), not float16" in err and "--restart" in err
    assert _starts(fake_backend) == 1  # nothing ran
    code, err = cli_in_process(*flags, "--time-limit", "0")
    assert code == 2 and "--time-limit must be above 0" in err
    code, err = cli_in_process(*flags, "--dtype", "float16", "--restart")
    assert code == 0, err
    assert json.loads((tmp_path / "suite" / "suite.json").read_text())["dtype"] == "float16"
    assert _starts(fake_backend) == 2 and [a.attempt for a in read_attempts(tmp_path / "suite" / "st")] == [1]


class _Terminated(KeyboardInterrupt):
    """What the CLI raises on SIGTERM (``cli.Interrupted``): an interrupt the backend did not get."""

    signum = signal.SIGTERM


def test_an_interrupted_suite_stops_its_backend_and_records_the_attempt(fake_backend, tmp_path):
    (fake_backend / "slow").touch()
    (fake_backend / "alarm").touch()

    def interrupt(signum, frame):
        raise _Terminated()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(_Terminated):
            suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=tmp_path / "suite")
    finally:
        signal.signal(signal.SIGALRM, previous)
    (attempt,) = read_attempts(tmp_path / "suite" / "st")
    assert attempt.stopped == "interrupted" and attempt.returncode == 143 and attempt.seconds < 30
    assert json.loads((tmp_path / "suite" / "suite.json").read_text())["suite"] == "offline"


def test_an_attempt_the_suite_did_not_see_end_is_recovered_or_waited_for(fake_backend, tmp_path):
    run = tmp_path / "suite" / "st"
    (run / "attempts" / "1").mkdir(parents=True)
    started = time.time() - 5
    (run / "attempts" / "1" / "attempt.json").write_text(json.dumps({"attempt": 1, "started_at": started, "pid": None}))
    (run / "log.txt").write_text("killed with the suite\n")
    (lost,) = read_attempts(run)
    assert lost.stopped == "lost" and lost.returncode is None and 4 < lost.seconds < 60
    # A folder of an older version (no suite.json, no attempt records) is refused, not mixed with.
    with pytest.raises(UsageError, match="without the suite's attempt records.*--restart"):
        suite_mod.run_suite(packaged_model_path(), "offline", backends=["st"], output_dir=tmp_path / "suite")
    # An attempt whose process still runs is waited for, not run beside.
    import psutil

    me = psutil.Process(os.getpid()).create_time()
    (run / "attempts" / "2").mkdir()
    alive = {"attempt": 2, "started_at": me, "pid": os.getpid()}
    (run / "attempts" / "2" / "attempt.json").write_text(json.dumps(alive))
    with pytest.raises(UsageError, match=f"attempt 2 still runs \\(pid {os.getpid()}\\)"):
        read_attempts(run)


def test_the_peer_reads_back_finished_tasks_and_computes_the_rest(replica, tmp_path):
    """The real ``st`` peer (in this process): a task whose result is there is read back without loading its data."""
    from vllm_eval.utils.timeline import current

    mini = tmp_path / "mini"
    mini.mkdir()
    manifest = json.loads((replica / "replica.json").read_text())
    for task in ("STS17", "STS15"):
        (mini / task).symlink_to(replica / task, target_is_directory=True)
    out = tmp_path / "st"
    argv = ["st", "--model", packaged_model_path(), "--data", str(mini), "--output-dir", str(out)]
    handler = signal.getsignal(signal.SIGTERM)
    try:
        (mini / "replica.json").write_text(json.dumps({**manifest, "tasks": ["STS17"]}))
        current().reset()
        assert suite_mod._peer_main(argv) == 0
        before = json.loads((out / "summary.json").read_text())["scores"]
        (mini / "replica.json").write_text(json.dumps({**manifest, "tasks": ["STS17", "STS15"]}))
        current().reset()
        assert suite_mod._peer_main(argv) == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
        current().reset()
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["task"]: r for r in summary["scores"]}
    # mteb keeps 6 decimals in its result files: a score read back is the computed one rounded
    assert [r["task"] for r in before] == ["STS17"] and before[0]["status"] == "computed"
    assert rows["STS17"]["main_score"] == pytest.approx(before[0]["main_score"], abs=1e-6)
    assert rows["STS17"]["status"] == "reused" and rows["STS15"]["status"] == "computed"
    loaded = {p.get("task") for p in summary["timeline"]["phases"] if p["phase"] in ("load", "encode")}
    assert loaded == {"STS15"}
