"""One progress display per process: the run's tasks, and the current task's inputs.

In a terminal it is one live ``rich`` display (a bar over the tasks and a bar over the current
call's inputs, redrawn in place). When standard error is not a terminal (a log file, a CI job,
a pipe) nothing is redrawn: a task prints one line when it starts and one when it ends, and a
long input stream one line at most every :data:`LOG_EVERY_S` seconds, so a log reads top to bottom.
Messages printed with :func:`echo` (warnings) appear above a live display instead of tearing it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Seconds between two progress lines of one input stream when standard error is not a terminal.
LOG_EVERY_S = 30.0

_state: dict[str, Any] = {"progress": None, "run": None, "prefix": "", "enabled": True}
#: Held while an input bar outside a run shows a display of its own: rich shows one live display at a time.
_own_display = threading.Lock()


def _is_tty() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _new_progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        console=_console(),
    )


def echo(message: str) -> None:
    """Print one line on standard error, above the live display when there is one."""
    progress = _state["progress"]
    if progress is not None:
        progress.console.print(message, markup=False, highlight=False, soft_wrap=True)
    else:
        print(message, file=sys.stderr, flush=True)


@contextmanager
def run_display(n_tasks: int, *, enabled: bool = True) -> Iterator[Callable[[str], Any]]:
    """The display of a whole run; yields ``task(name)``, a context manager around one task.

    With ``enabled=False`` nothing is shown, not even the input bars inside the run.
    """
    previous = dict(_state)
    _state["enabled"] = enabled
    outer = _state["progress"]  # a run inside a run (e.g. the stages of a two-stage run) shares the display
    progress = outer if outer is not None else (_new_progress() if enabled and _is_tty() else None)
    counter = {"done": 0}
    if progress is not None:
        _state["progress"] = progress
        _state["run"] = progress.add_task("tasks", total=n_tasks, unit="tasks done")
        if outer is None:
            progress.start()

    @contextmanager
    def task(name: str, index: int | None = None) -> Iterator[None]:
        index = counter["done"] + 1 if index is None else index  # tasks run concurrently give their own
        _state["prefix"] = name
        start = time.perf_counter()
        if progress is not None:
            progress.update(_state["run"], description=f"task {index}/{n_tasks}: {name}")
        if enabled and progress is None:
            echo(f"[{index}/{n_tasks}] {name} ...")
        ended = "stopped after"  # an error or an interrupt left the block
        try:
            yield
            ended = "finished in"
        finally:
            counter["done"] += 1
            _state["prefix"] = ""
            if progress is not None:
                progress.update(_state["run"], completed=counter["done"])
            elif enabled:
                echo(f"[{index}/{n_tasks}] {name} {ended} {time.perf_counter() - start:.1f} s")

    try:
        yield task
    finally:
        if progress is not None:
            progress.remove_task(_state["run"])
            if outer is None:
                progress.stop()
        _state.update(previous)


@contextmanager
def input_bar(desc: str, total: int | None, unit: str, *, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """A bar over one call's inputs; yields ``advance(n)``.

    Inside :func:`run_display` it is a second line of the run's display; outside one (library
    use) it is a display of its own. Disabled when ``enabled`` is False or the run's display is.
    """
    if not enabled or not _state["enabled"]:
        yield lambda n: None
        return
    label = f"{_state['prefix']} {desc}".strip()
    progress = _state["progress"]
    if progress is None and _is_tty():
        if not _own_display.acquire(blocking=False):  # another call's display is up (calls that overlap): one line
            yield lambda n: None
            return
        try:
            progress = _new_progress()
            with progress:
                bar = progress.add_task(label, total=total, unit=unit)
                yield lambda n: progress.advance(bar, n)
        finally:
            _own_display.release()
        return
    if progress is not None:
        bar = progress.add_task(label, total=total, unit=unit)
        try:
            yield lambda n: progress.advance(bar, n)
        finally:
            progress.remove_task(bar)
        return
    # Not a terminal: a line now and then, never a redraw.
    seen = {"n": 0, "last": time.perf_counter()}

    def advance(n: int) -> None:
        seen["n"] += n
        now = time.perf_counter()
        if now - seen["last"] >= LOG_EVERY_S:
            seen["last"] = now
            of = f"/{total}" if total else ""
            echo(f"  {label}: {seen['n']}{of} {unit}")

    yield advance
