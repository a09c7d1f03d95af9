"""Where a run's wall time goes: named phases with wall-clock start and end.

One :class:`Timeline` per process (:func:`current`) collects phases as they happen: the
interpreter's own start, imports, model resolution, each engine or replica until ready, and per task
its data load, its encode calls, the rest of mteb's evaluation (scoring) and the result writes, then
the shutdown. ``summary.json`` keeps them under ``"timeline"`` (:meth:`Timeline.as_json`), ``vllm-eval
report`` draws them as bars over time and ``bench --suite`` adds them up per backend
(:func:`phase_totals`).

Phases may overlap (data loading in the background while an engine starts): totals per phase are sums
of their own intervals, not shares of the wall time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: Phase names, in the order a run meets them (the report's bar colours and the suite's columns).
PHASES = (
    "interpreter",
    "imports",
    "model",
    "tasks",
    "engine",
    "load",
    "encode",
    "wait",
    "score",
    "write",
    "shutdown",
)
#: Encode calls closer together than this (seconds) are kept as one interval: a retrieval task makes
#: hundreds of calls and the picture is the same.
MERGE_GAP_S = 0.05


@dataclass
class Phase:
    """One interval: ``name`` (one of :data:`PHASES`), ``start``/``end`` as ``time.time()`` seconds,
    the task it belongs to (None for the run's own phases) and a free-form ``detail`` (a replica's
    index, a model path)."""

    name: str
    start: float
    end: float
    task: str | None = None
    detail: str | None = None


def process_start() -> float:
    """When this process started (``time.time()`` seconds), from the kernel's record via psutil;
    the import time of this module when psutil is missing."""
    try:
        import psutil

        return float(psutil.Process(os.getpid()).create_time())
    except Exception:  # psutil comes with vLLM; without it the interpreter's own start is not counted
        return _IMPORTED


_IMPORTED = time.time()


class Timeline:
    """The phases of one process, thread-safe (data loads record from a background thread).

    ``task`` is the task the calling thread evaluates now (tasks evaluated concurrently each have a
    thread of their own): encode intervals without a task of their own are filed under it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.phases: list[Phase] = []
        #: summary.json files written from this timeline -> the run's start (``time.time()``), to bring
        #: up to date once the engines are shut down.
        self.summaries: dict[Any, float] = {}

    @property
    def task(self) -> str | None:
        return getattr(self._local, "task", None)

    @task.setter
    def task(self, name: str | None) -> None:
        self._local.task = name

    def add(self, name: str, start: float, end: float, task: str | None = None, detail: str | None = None) -> None:
        """Record an interval measured elsewhere (``time.time()`` seconds)."""
        with self._lock:
            self.phases.append(Phase(name, start, end, task, detail))

    @contextmanager
    def phase(self, name: str, task: str | None = None, detail: str | None = None) -> Iterator[None]:
        """Time the body as phase ``name``; recorded also when it raises."""
        start = time.time()
        try:
            yield
        finally:
            self.add(name, start, time.time(), task, detail)

    def encoded(self, start: float, end: float) -> None:
        """One engine call of the current task (``time.time()`` seconds), merged with the previous one when
        they are less than :data:`MERGE_GAP_S` apart."""
        with self._lock:
            last = next((p for p in reversed(self.phases) if p.name == "encode"), None)
            if last is not None and last.task == self.task and start - last.end < MERGE_GAP_S:
                last.end = max(last.end, end)
                return
            self.phases.append(Phase("encode", start, end, self.task))

    def as_json(self, since: float = 0.0) -> dict[str, Any]:
        """The phases that ended after ``since``, as seconds from the process start:
        ``{"origin": unix seconds, "phases": [{"phase", "start", "end", "task", "detail"}, ...]}``."""
        origin = process_start()
        with self._lock:
            kept = [p for p in self.phases if p.end >= since]
        phases = sorted([p for p in kept if p.name != "task"] + _scoring(kept), key=lambda p: p.start)
        return {
            "origin": round(origin, 3),
            "phases": [
                {
                    "phase": p.name,
                    "start": round(p.start - origin, 3),
                    "end": round(p.end - origin, 3),
                    **({"task": p.task} if p.task else {}),
                    **({"detail": p.detail} if p.detail else {}),
                }
                for p in phases
            ],
        }

    def reset(self) -> None:
        """Forget every phase (a new command in the same process)."""
        with self._lock:
            self.phases.clear()
            self.task = None
            self.summaries.clear()


def _scoring(phases: list[Phase]) -> list[Phase]:
    """``score`` intervals: the parts of each task's span (phase ``task``: its ``mteb.evaluate``) that no
    encode call of that task, nor its wait for another task's call, covers."""
    out: list[Phase] = []
    for span in (p for p in phases if p.name == "task"):
        cursor = span.start
        calls = sorted(  # within the span: a sweep evaluates a task of this name once per model
            (p for p in phases if p.name in ("encode", "wait") and p.task == span.task and _within(p, span)),
            key=lambda p: p.start,
        )
        for call in calls:
            if call.start - cursor > MERGE_GAP_S:
                out.append(Phase("score", cursor, min(call.start, span.end), span.task))
            cursor = max(cursor, call.end)
        if span.end - cursor > MERGE_GAP_S:
            out.append(Phase("score", cursor, span.end, span.task))
    return out


def _within(call: Phase, span: Phase) -> bool:
    return call.end >= span.start and call.start <= span.end


_CURRENT = Timeline()


def current() -> Timeline:
    """This process's timeline."""
    return _CURRENT


def phase(name: str, task: str | None = None, detail: str | None = None) -> Any:
    """:meth:`Timeline.phase` on this process's timeline."""
    return _CURRENT.phase(name, task, detail)


def phase_totals(timeline: dict[str, Any] | None) -> dict[str, float]:
    """Seconds per phase name of a summary's ``"timeline"`` (sums of intervals; overlapping phases
    each count in full), plus ``"wall"``: first start to last end. Empty for a run without one."""
    phases = (timeline or {}).get("phases") or []
    totals: dict[str, float] = {}
    for p in phases:
        totals[p["phase"]] = totals.get(p["phase"], 0.0) + p["end"] - p["start"]
    if phases:
        totals["wall"] = max(p["end"] for p in phases) - min(p["start"] for p in phases)
    return {k: round(v, 2) for k, v in totals.items()}
