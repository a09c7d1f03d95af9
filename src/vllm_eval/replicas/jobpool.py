"""Jobs on a set of engine replicas, whatever runs them: local processes (:mod:`vllm_eval.replicas.pool`) or Ray
actors (:mod:`vllm_eval.replicas.ray`).

A job is a module-level ``fn(llm, payload)``; its future gets the value or the error the job raised. Each job
goes to the live replica with the fewest jobs outstanding. A replica that is lost (its process died, its
actor or node went away) has its unfinished jobs sent to the others; a job lost more than
``retry_budget`` times fails with a :class:`~vllm_eval.utils.errors.ReplicaError` that says what was left, and
every job already finished keeps its value.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..utils.errors import ReplicaError

__all__ = ["JobPool", "RETRY_BUDGET"]

logger = logging.getLogger(__name__)

#: How many times one job may be sent again after the replica running it was lost.
RETRY_BUDGET = 3


@dataclass
class _Job:
    future: Future
    fn: Callable[[Any, Any], Any]
    payload: Any
    lost: int = 0  # replicas lost while running it


@dataclass
class PoolState:
    """What ``summary.json`` keeps of a pool (``"replicas"``): where it ran, each replica's start, the work.

    Attributes:
        where: ``"local"`` or ``"ray <address>"``.
        ready_seconds: replica index -> seconds from the pool's start until it was ready.
        start_breakdown: replica index -> seconds of its start by step (local replicas: see
            :func:`vllm_eval.replicas.process.start_breakdown`).
        jobs_done: replica index -> jobs it finished.
        lost: replica index -> why it was lost.
        redone: jobs sent again after their replica was lost.
    """

    where: str
    ready_seconds: dict[int, float] = field(default_factory=dict)
    start_breakdown: dict[int, dict[str, float]] = field(default_factory=dict)
    jobs_done: dict[int, int] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    redone: int = 0


class JobPool:
    """The job bookkeeping every kind of replica pool shares; a subclass starts the replicas, sends a job
    (:meth:`_send`), reports each outcome (:meth:`_finished`) and each lost replica (:meth:`_lost`).

    Args:
        indices: the replicas' indices.
        where: ``"local"`` or ``"ray <address>"`` (for :meth:`state`).
        retry_budget: times one job may be sent again after losing its replica.
    """

    def __init__(self, indices: list[int], where: str, retry_budget: int = RETRY_BUDGET) -> None:
        self._jobs: dict[int, _Job] = {}
        self._outstanding: dict[int, set[int]] = {i: set() for i in indices}
        self._dead: dict[int, str] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._closed = False
        self.retry_budget = retry_budget
        self.where = where
        self.info: Any = None
        #: Jobs finished per replica (index -> count): shows how the work was shared.
        self.jobs_done: dict[int, int] = {i: 0 for i in indices}
        #: Seconds from the pool's start until each replica was ready (index -> s), and until all were.
        self.ready_seconds: dict[int, float] = {}
        #: Where each replica's start went, by step (index -> {step: seconds}), where the pool can tell.
        self.start_breakdown: dict[int, dict[str, float]] = {}
        self.start_seconds = 0.0
        self.redone = 0
        self._started = time.perf_counter()
        #: When this pool began starting its replicas (``time.time()``): ``ready_seconds`` count from here.
        self.started_at = time.time()

    def __len__(self) -> int:
        return len(self._outstanding)

    # --- what a subclass provides --------------------------------------------------------------------

    def describe(self, index: int) -> str:
        """Replica ``index`` in messages (where it runs)."""
        return f"replica {index}"

    def _send(self, index: int, job_id: int, fn: Callable[[Any, Any], Any], payload: Any) -> None:
        """Hand job ``job_id`` to replica ``index`` (called with the lock held)."""
        raise NotImplementedError

    def _check(self) -> None:
        """Find replicas lost since the last look and call :meth:`_lost` for each (default: none to find)."""

    # --- shared --------------------------------------------------------------------------------------

    def _ready(self, index: int, breakdown: dict[str, float] | None = None) -> None:
        self.ready_seconds[index] = round(time.perf_counter() - self._started, 2)
        steps = f" ({', '.join(f'{k} {v:.1f}' for k, v in breakdown.items())} s)" if breakdown else ""
        if breakdown:
            self.start_breakdown[index] = breakdown
        logger.info("%s ready after %.1f s%s", self.describe(index), self.ready_seconds[index], steps)

    def _started_all(self) -> None:
        self.start_seconds = round(time.perf_counter() - self._started, 2)

    def submit(self, fn: Callable[[Any, Any], Any], payload: Any) -> Future:
        """Run ``fn(llm, payload)`` on the live replica with the fewest jobs outstanding.

        ``fn`` must be a module-level function; ``payload`` and the result must pickle.

        Raises:
            ReplicaError: the pool is closed or no replica is alive.
        """
        if self._closed:
            raise ReplicaError("the replica pool is closed")
        self._check()
        future: Future = Future()
        with self._lock:
            job_id = self._next
            self._next += 1
            self._jobs[job_id] = _Job(future, fn, payload)
            self._dispatch(job_id)
        return future

    def broadcast(self, fn: Callable[[Any, Any], Any], payload: Any) -> list[Future]:
        """Run ``fn(llm, payload)`` once on every live replica (e.g. loading new weights into each); a replica lost
        meanwhile has its call redone by another, as for any job, so ``fn`` must be safe to run twice.

        Raises:
            ReplicaError: the pool is closed or no replica is alive.
        """
        if self._closed:
            raise ReplicaError("the replica pool is closed")
        self._check()
        futures: list[Future] = []
        with self._lock:
            live = [i for i in self._outstanding if i not in self._dead]
            if not live:
                raise ReplicaError(f"every replica has been lost ({self._lost_summary()})")
            for index in live:
                job_id, self._next = self._next, self._next + 1
                self._jobs[job_id] = _Job(Future(), fn, payload)
                self._outstanding[index].add(job_id)
                self._send(index, job_id, fn, payload)
                futures.append(self._jobs[job_id].future)
        return futures

    def submit_split(
        self, fn: Callable[[Any, Any], Any], n: int, payload: Callable[[int, int], Any]
    ) -> list[tuple[int, Future]]:
        """Split ``n`` items, in order, into one part per replica and :meth:`submit` ``fn(llm, payload(lo, hi))``
        for each part ``[lo, hi)``, so even one chunk keeps every replica busy.

        Returns:
            ``(lo, future)`` per part, in item order.
        """
        size = max(1, -(-n // len(self)))
        return [(lo, self.submit(fn, payload(lo, min(lo + size, n)))) for lo in range(0, n, size)]

    def _dispatch(self, job_id: int) -> None:
        """Send a job to the least-loaded live replica (caller holds the lock)."""
        live = [i for i in self._outstanding if i not in self._dead]
        job = self._jobs[job_id]
        if not live:
            self._jobs.pop(job_id)
            job.future.set_exception(ReplicaError(f"every replica has been lost ({self._lost_summary()})"))
            return
        target = min(live, key=lambda i: len(self._outstanding[i]))
        self._outstanding[target].add(job_id)
        self._send(target, job_id, job.fn, job.payload)

    def _finished(self, index: int, job_id: int, ok: bool, value: Any) -> None:
        """Job ``job_id`` came back from replica ``index``: its value (``ok``), or an error (an exception,
        or a message for a :class:`ReplicaError`)."""
        with self._lock:
            self._outstanding[index].discard(job_id)
            job = self._jobs.pop(job_id, None)
            self.jobs_done[index] += 1
        if job is None:
            return
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value if isinstance(value, BaseException) else ReplicaError(value))

    def _lost(self, index: int, reason: str) -> None:
        """Replica ``index`` is gone: its unfinished jobs go to the others, each within its retry budget."""
        with self._lock:
            if index in self._dead:
                return
            self._dead[index] = reason
            moved = sorted(self._outstanding[index])
            self._outstanding[index] = set()
            left = len(self._outstanding) - len(self._dead)
            warnings.warn(
                f"{self.describe(index)} {reason}; {len(moved)} pending job(s) moved to the {left} other replica(s)",
                RuntimeWarning,
                stacklevel=2,
            )
            for job_id in moved:
                job = self._jobs.get(job_id)
                if job is None:
                    continue
                job.lost += 1
                if job.lost > self.retry_budget:
                    self._jobs.pop(job_id)
                    unfinished = len(self._jobs) + 1
                    job.future.set_exception(
                        ReplicaError(
                            f"a job lost its replica {job.lost} times (retry budget {self.retry_budget}); "
                            f"{unfinished} job(s) of this pool were unfinished ({self._lost_summary()}); "
                            f"finished work is kept"
                        )
                    )
                    continue
                self.redone += 1
                self._dispatch(job_id)

    def _lost_summary(self) -> str:
        return "; ".join(f"{self.describe(i)} {why}" for i, why in sorted(self._dead.items())) or "none lost"

    def _fail_pending(self, message: str) -> None:
        with self._lock:
            jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            if not job.future.done():
                job.future.set_exception(ReplicaError(message))

    def state(self) -> PoolState:
        """Where the pool ran, each replica's start, the jobs each finished, what was lost and redone."""
        with self._lock:
            return PoolState(
                where=self.where,
                ready_seconds=dict(self.ready_seconds),
                start_breakdown=dict(self.start_breakdown),
                jobs_done=dict(self.jobs_done),
                lost=dict(self._dead),
                redone=self.redone,
            )
