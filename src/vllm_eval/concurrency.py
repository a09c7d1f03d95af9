"""Tasks evaluated concurrently: one task's scoring on the CPU while another encodes.

mteb evaluates a task by encoding its inputs and then scoring them on the CPU (logistic regression for
classification, k-means for clustering, ranking metrics for retrieval and reranking); for a fast engine
the scoring is most of a benchmark's wall time (on one H100, 94 of 162 s of a 2 % MTEB(eng, v2) replica,
docs/bench/h100-time-to-result). Evaluated one after another, the engine idles while a task scores and
all but one core idle while it encodes. Here up to ``workers`` tasks run at once, each on a thread of
its own with its own ``mteb.evaluate``; the backend serves one call at a time
(:meth:`~vllm_eval.base.BackendBase._one_call`), so calls keep the engine's full batch and only the
scoring overlaps. NumPy, scikit-learn and PyTorch release the GIL in their kernels.

mteb's evaluators seed their own generators (``random.Random``, ``numpy.random.Generator``, an explicit
``random_state``), so a task's scores do not depend on what runs beside it: the test suite checks
concurrent against sequential scores on the offline suite.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from .errors import UsageError

#: Most tasks evaluated at once by default.
MAX_DEFAULT_WORKERS = 8


def default_task_workers() -> int:
    """Tasks evaluated at once when not asked: 1 on a machine of 4 cores or fewer (there the cores encode
    and score in turn, and overlapping them gains nothing: the 2-core CPU's offline suite took as long),
    else half the cores, at most :data:`MAX_DEFAULT_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if cores <= 4 else min(MAX_DEFAULT_WORKERS, cores // 2)


def task_workers(requested: int | None, n_tasks: int) -> int:
    """``requested`` tasks at once (None: :func:`default_task_workers`), never more than there are tasks.

    Raises:
        UsageError: ``requested`` is not a positive int.
    """
    if requested is None:
        requested = default_task_workers()
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise UsageError(f"concurrent_tasks must be a positive int, got {requested!r}")
    return max(1, min(requested, n_tasks))


def run_tasks(
    tasks: Sequence[Any],
    run: Callable[[Any], Any],
    *,
    workers: int,
    display: Callable[[str, int], Any],
    done: Callable[[int, Any], None],
) -> None:
    """``run(task)`` for every task, ``workers`` at once, in the given order of starting; ``done(index, row)``
    is called on this thread as each ends (in the order they end), so results are written as soon as a task
    has them. ``display(name, position)`` is the progress display's context manager around one task.

    Raises:
        Whatever ``run`` raised first; tasks not started yet are not started, running ones finish.
    """

    def one(index: int, task: Any) -> Any:
        with display(task.metadata.name, index + 1):
            return run(task)

    if workers <= 1:
        for index, task in enumerate(tasks):
            done(index, one(index, task))
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="vllm-eval-task")
    try:
        futures = {pool.submit(one, i, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            done(futures[future], future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
