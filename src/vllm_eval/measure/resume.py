"""What lets an interrupted ``bench --suite`` resume: the suite's settings and each backend's attempts.

Each start of a backend's process is an **attempt**, kept under ``<output_dir>/<backend>/attempts/<N>/``:

* ``attempt.json``: ``{"attempt": N, "started_at": unix seconds, "pid": the process's id, "seconds": wall seconds
  from its start to its exit, "returncode", "stopped"}``, written when it starts and again when it ends
  (``stopped``: None, ``"time-limit"``, ``"interrupted"`` (the suite was), or ``"lost"``: the suite itself was
  killed before the backend exited, its seconds counted up to the backend's last write);
* ``summary.json``: the backend's ``summary.json`` as that attempt left it (its timeline, phases per task);
* ``log.txt``: that attempt's log, moved there when the next attempt starts (the latest stays in
  ``<backend>/log.txt``).

A backend whose last attempt exited 0 with its ``summary.json`` written is finished and not run again; any other
runs again, its finished tasks read back. The backend's time to result is the sum of its attempts' seconds (the
gaps between attempts are not counted), its seconds per phase the sums over its attempts' timelines.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError

#: Seconds a stopped backend gets to shut its engine down after SIGTERM before it is killed.
STOP_GRACE_S = 30.0
#: The settings a resumed suite must share with the runs already in its folder, and the flag each is given by.
SETTINGS = {
    "model": "--model",
    "suite": "--suite",
    "tasks": "tasks",
    "dtype": "--dtype",
    "engine_kwargs": "engine options",
    "replicas": "--data-parallel-size/--replicas-per-gpu",
    "n_docs": "--n-docs",
    "n_queries": "--n-queries",
    "fraction": "--fraction",
}


@dataclass
class Attempt:
    """One start of a backend's process. ``started_at``: ``time.time()`` seconds; ``seconds``: wall seconds to its
    exit (None while it runs); ``returncode``: its exit status (None when unknown: ``stopped == "lost"``)."""

    attempt: int
    started_at: float
    pid: int | None = None
    seconds: float | None = None
    returncode: int | None = None
    stopped: str | None = None


def prepare_folder(
    out: Path, settings: dict[str, Any], backends: Sequence[str], *, restart: bool = False, every: Sequence[str] = ()
) -> None:
    """Check that ``out`` holds nothing but a suite run of the same ``settings`` (or nothing), then write its
    ``suite.json`` with them (records to come). ``restart``: remove the earlier runs first (``suite.json`` and the
    folders of ``every`` backend; built task data stays, rebuilt by its builder when it differs).

    Raises:
        UsageError: one line naming the setting that differs (``--fraction 0.02, not 0.05``), or a folder that holds
            backend runs without the records a resume needs; each says ``--restart`` starts over.
    """
    suite_json = out / "suite.json"
    if restart:
        suite_json.unlink(missing_ok=True)
        for backend in every:
            if (out / backend).is_dir():
                shutil.rmtree(out / backend)
    wanted = json.loads(json.dumps(settings))
    if suite_json.is_file():
        _same_settings(suite_json, wanted)
    for backend in backends:
        folder = out / backend
        if folder.is_dir() and any(folder.iterdir()) and not (suite_json.is_file() and (folder / "attempts").is_dir()):
            raise UsageError(
                f"{folder} holds a run without the suite's attempt records (an older version's, or suite.json is "
                "gone): --restart to start over, or another --output-dir"
            )
    write_json(suite_json, {**wanted, "records": _previous_records(suite_json)})


def _same_settings(suite_json: Path, wanted: dict[str, Any]) -> None:
    try:
        previous = json.loads(suite_json.read_text())
        if not isinstance(previous, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:120]
        raise UsageError(f"{suite_json} cannot be read ({reason}): --restart to start over") from None
    compared = [k for k in SETTINGS if k != "tasks" or wanted.get("suite") == "offline"]  # data paths follow the folder
    for key in compared:
        if key in previous and previous[key] != wanted.get(key):
            raise UsageError(
                f"{suite_json.parent} holds a suite run with {SETTINGS[key]} {_shown(previous[key])}, not "
                f"{_shown(wanted.get(key))}: run with the same settings to resume, --restart to start over, "
                "or another --output-dir"
            )


def _shown(value: Any) -> str:
    if value is None:
        return "(default)"
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _previous_records(suite_json: Path) -> list[Any]:
    try:
        records = json.loads(suite_json.read_text()).get("records")
    except (OSError, ValueError, AttributeError):
        return []
    return records if isinstance(records, list) else []


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON through a temporary file and a rename (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)


def read_attempts(run_dir: Path) -> list[Attempt]:
    """A backend's attempts so far, oldest first; one the suite did not see end is recovered now (``stopped``
    ``"lost"``, its seconds up to the last write of its log or summary) and saved.

    Raises:
        UsageError: a damaged ``attempt.json`` (named), or an attempt whose process still runs (its pid named).
    """
    folders = [p for p in (run_dir / "attempts").glob("*") if p.name.isdigit() and (p / "attempt.json").is_file()]
    attempts = [_read_attempt(p / "attempt.json") for p in sorted(folders, key=lambda p: int(p.name))]
    if attempts and attempts[-1].seconds is None:
        _recover(run_dir, attempts[-1])
    return attempts


def _read_attempt(path: Path) -> Attempt:
    try:
        data = json.loads(path.read_text())
        known = {f.name for f in fields(Attempt)}
        attempt = Attempt(**{k: v for k, v in data.items() if k in known})
        if not isinstance(attempt.attempt, int) or not isinstance(attempt.started_at, int | float):
            raise ValueError("no attempt number or start")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        reason = " ".join(str(exc).split())[:120]
        raise UsageError(f"{path} cannot be read ({reason}): --restart to start over") from None
    return attempt


def _recover(run_dir: Path, attempt: Attempt) -> None:
    if attempt.pid is not None and _alive(attempt.pid, attempt.started_at):
        raise UsageError(
            f"{run_dir.name}: attempt {attempt.attempt} still runs (pid {attempt.pid}); wait for it or stop it, "
            "then run the same command again"
        )
    marks = [p.stat().st_mtime for p in (run_dir / "log.txt", run_dir / "summary.json") if p.is_file()]
    attempt.seconds = round(max([attempt.started_at, *marks]) - attempt.started_at, 2)
    attempt.stopped = "lost"
    _save(run_dir, attempt)


def _alive(pid: int, started_at: float) -> bool:
    """Whether ``pid`` is the attempt's process, still running (started within seconds of the attempt)."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return abs(proc.create_time() - started_at) < 10 and proc.status() != psutil.STATUS_ZOMBIE
    except Exception:  # no such process, or no psutil: nothing to wait for
        return False


def _folder(run_dir: Path, attempt: Attempt) -> Path:
    return run_dir / "attempts" / str(attempt.attempt)


def _save(run_dir: Path, attempt: Attempt) -> None:
    """``attempt.json``, and once the attempt ended, a copy of the backend's ``summary.json`` beside it."""
    folder = _folder(run_dir, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    if attempt.seconds is not None and (run_dir / "summary.json").is_file():
        shutil.copyfile(run_dir / "summary.json", folder / "summary.json.tmp")
        (folder / "summary.json.tmp").replace(folder / "summary.json")
    write_json(folder / "attempt.json", asdict(attempt))


def finished(run_dir: Path, attempts: Sequence[Attempt]) -> bool:
    """Whether the backend is done: its last attempt exited 0 and its ``summary.json`` is there."""
    return bool(attempts) and attempts[-1].returncode == 0 and (run_dir / "summary.json").is_file()


def run_attempt(
    cmd: Sequence[str], run_dir: Path, env: dict[str, str], previous: Sequence[Attempt], time_limit: float | None
) -> Attempt:
    """Run ``cmd`` as the backend's next attempt, its output to ``run_dir/log.txt``, and record it.

    The previous attempt's log moves to its attempt folder and ``summary.json`` is removed (the attempt writes its
    own, finished tasks included). After ``time_limit`` seconds the process gets SIGTERM (``vllm-eval run`` shuts its
    engine down and exits 143), and is killed :data:`STOP_GRACE_S` later if still there (``stopped``:
    ``"time-limit"``). An interrupt of the suite (Ctrl-C, SIGTERM) stops the process the same way (after Ctrl-C, which
    the backend got too, it has 10 s to stop by itself first), records the attempt (``"interrupted"``) and is raised
    again.

    Returns:
        The attempt, ended: ``seconds`` from the process's start to its exit, wall clock.
    """
    if previous and (run_dir / "log.txt").is_file():
        _folder(run_dir, previous[-1]).mkdir(parents=True, exist_ok=True)
        (run_dir / "log.txt").replace(_folder(run_dir, previous[-1]) / "log.txt")
    (run_dir / "summary.json").unlink(missing_ok=True)  # a failed attempt must not show an older one's scores
    attempt = Attempt(previous[-1].attempt + 1 if previous else 1, time.time())
    _save(run_dir, attempt)
    started = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        attempt.pid = proc.pid
        _save(run_dir, attempt)
        try:
            proc.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:
            attempt.stopped = "time-limit"
            _stop(proc)
        except KeyboardInterrupt as exc:
            attempt.stopped = "interrupted"
            if not hasattr(exc, "signum"):  # Ctrl-C: the terminal sent SIGINT to the backend too; let it stop first
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            _stop(proc)
            _end(run_dir, attempt, proc.returncode, started)
            raise
    _end(run_dir, attempt, proc.returncode, started)
    return attempt


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_GRACE_S` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _end(run_dir: Path, attempt: Attempt, returncode: int, started: float) -> None:
    attempt.seconds = round(time.perf_counter() - started, 2)
    attempt.returncode = returncode
    _save(run_dir, attempt)


def totals(run_dir: Path, attempts: Sequence[Attempt]) -> dict[str, Any]:
    """A backend's time to result over its attempts.

    Returns:
        ``seconds`` (summed over attempts, wall clock), ``attempt_seconds`` (each attempt's), ``phases`` (seconds per
        timeline phase summed over the attempts' timelines, ``wall`` included; None without any timeline) and
        ``engine_start_s`` (engine start seconds summed over the attempts that report one; None when none does).

    Raises:
        UsageError: a damaged ``summary.json`` of an attempt (file and field named).
    """
    from ..utils.timeline import phase_totals
    from .runfiles import read_summary

    phases: dict[str, float] = {}
    engine: list[float] = []
    for attempt in attempts:
        path = _folder(run_dir, attempt) / "summary.json"
        if not path.is_file():
            continue
        summary = read_summary(path)
        for name, seconds in phase_totals(summary.get("timeline")).items():
            phases[name] = round(phases.get(name, 0.0) + seconds, 2)
        if isinstance(summary.get("engine_start_seconds"), int | float):
            engine.append(summary["engine_start_seconds"])
    return {
        "seconds": round(sum(a.seconds or 0.0 for a in attempts), 2),
        "attempt_seconds": [a.seconds or 0.0 for a in attempts],
        "phases": phases or None,
        "engine_start_s": round(sum(engine), 2) if engine else None,
    }
