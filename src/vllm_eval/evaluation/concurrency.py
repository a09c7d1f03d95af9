"""Tasks evaluated concurrently: one task's scoring on the CPU while another encodes.

mteb evaluates a task by encoding its inputs and then scoring them on the CPU (logistic regression for
classification, k-means for clustering, ranking metrics for retrieval and reranking); for a fast engine
the scoring is most of a benchmark's wall time (on one H100, 94 of 162 s of a 2 % MTEB(eng, v2) replica,
docs/bench/h100-time-to-result). Evaluated one after another, the engine idles while a task scores and
all but one core idle while it encodes. Here up to ``workers`` tasks run at once, each on a thread of
its own with its own ``mteb.evaluate`` (for an encoder, in a process of its own that the thread serves:
:mod:`vllm_eval.evaluation.task_processes`, since mteb's scoring holds the GIL much of the time); the backend serves one
call at a time (:meth:`~vllm_eval.models.base.BackendBase._one_call`), so calls keep the engine's full batch and only
the scoring overlaps.

mteb's evaluators seed their own generators (``random.Random``, ``numpy.random.Generator``, an explicit
``random_state``), so a task's scores do not depend on what runs beside it (the test suite checks concurrent
against sequential scores); the one state mteb shares between task objects, a class-level scikit-learn model,
is cloned per task (:func:`own_evaluator`).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..utils.errors import UsageError

#: Most tasks evaluated at once by default. On one H100 (16 cores, 4 BERT-base replicas, the 2 % MTEB(eng, v2)
#: replica), scored in processes: 4 at once 62.0 s, 6 at once 62.4 s, 8 at once 72.4 s (eight processes slowed
#: the replicas' start); on threads 4 at once took 90.1 s on the same machine (docs/bench/h100-task-processes).
MAX_DEFAULT_WORKERS = 4


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_task_workers() -> int:
    """Tasks evaluated at once when not asked: 1 on a machine of 4 cores or fewer (there the cores encode
    and score in turn, and overlapping them gains nothing), else half the cores, at most
    :data:`MAX_DEFAULT_WORKERS`."""
    n = cores()
    return 1 if n <= 4 else min(MAX_DEFAULT_WORKERS, n // 2)


def expected_size(task: Any) -> int:
    """Samples in ``task``'s evaluation splits by the descriptive statistics mteb ships (0 when it has none):
    the order tasks start in when several run at once."""
    try:
        stats = task.metadata.descriptive_stats or {}
        return sum(int((stats.get(split) or {}).get("num_samples") or 0) for split in task.metadata.eval_splits)
    except Exception:  # a task of ours or one without statistics: no estimate
        return 0


def in_run_order(tasks: Sequence[Any], workers: int) -> list[Any]:
    """``tasks`` in the order they start: as given one at a time; largest first when several run at once, so
    the longest (MindSmallReranking's 2.4M samples in MTEB(eng, v2), 26 s of scoring alone) does not start
    last and end alone. Stable: tasks of equal size keep their order."""
    if workers <= 1:
        return list(tasks)
    return sorted(tasks, key=expected_size, reverse=True)


def task_workers(requested: int | None, n_tasks: int, *, recording: bool = False) -> int:
    """``requested`` tasks at once (None: :func:`default_task_workers`), never more than there are tasks; 1 when
    ``recording`` (a parity check records the inputs of the model, not of a task).

    Raises:
        UsageError: ``requested`` is not a positive int.
    """
    if recording:
        return 1
    if requested is None:
        requested = default_task_workers()
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise UsageError(f"concurrent_tasks must be a positive int, got {requested!r}")
    return max(1, min(requested, n_tasks))


def own_evaluator(task: Any) -> None:
    """Give ``task`` a scikit-learn model of its own. mteb's classification, multilabel classification and
    regression tasks share one model object per class (``evaluator_model``, a class attribute that each
    experiment fits again): two such tasks evaluated at once fitted and read the same object (seen on an
    H100: ``IndexError: index 14 is out of bounds for axis 0 with size 11`` in ``predict``). An unfitted
    clone with the same parameters computes what the shared one does, since every experiment fits anew."""
    model = getattr(task, "evaluator_model", None)
    if model is not None and hasattr(model, "get_params"):
        from sklearn.base import clone

        task.evaluator_model = clone(model)


def run_tasks(
    tasks: Sequence[Any],
    run: Callable[[Any], Any],
    *,
    workers: int,
    display: Callable[[str, int], Any],
    done: Callable[[int, Any], None],
) -> None:
    """``run(task)`` for every task, ``workers`` at once (starting in :func:`in_run_order`); ``done(index, row)``
    (``index`` in ``tasks``) is called on this thread as each ends, in the order they end, so results are
    written as soon as a task has them. ``display(name, position)``: the progress display's context manager
    around one task.

    Raises:
        Whatever ``run`` raised first, at once: tasks not started yet are not started, and tasks still running
        are not waited for (their threads are daemons, ended by the engine's shutdown or the process's exit), so
        a failure or Ctrl-C stops the command within seconds, as it does with tasks one after another.
    """

    def one(index: int, task: Any) -> Any:
        if workers > 1:
            own_evaluator(task)
        with display(task.metadata.name, index + 1):
            return run(task)

    if workers <= 1:
        for index, task in enumerate(tasks):
            done(index, one(index, task))
        return
    _run_at_once(tasks, one, workers, done)


def _run_at_once(
    tasks: Sequence[Any], one: Callable[[int, Any], Any], workers: int, done: Callable[[int, Any], None]
) -> None:
    """:func:`run_tasks` with several at once, on ``workers`` daemon threads."""
    from threadpoolctl import threadpool_limits

    position = {id(task): i for i, task in enumerate(tasks)}
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for task in in_run_order(tasks, workers):
        todo.put(task)
    ended: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            try:
                task = todo.get_nowait()
            except queue.Empty:
                return
            index = position[id(task)]
            try:
                ended.put((index, None, one(index, task)))
            except BaseException as exc:  # handed to the caller's thread, which raises it
                ended.put((index, exc, None))

    # Each task's BLAS and OpenMP pools get their share of the cores, not every core each.
    with threadpool_limits(limits=max(1, cores() // workers)):
        for k in range(workers):
            threading.Thread(target=worker, name=f"vllm-eval-task-{k}", daemon=True).start()
        try:
            for _ in tasks:
                index, error, row = _next(ended)
                if error is not None:
                    raise error
                done(index, row)
        finally:
            stop.set()


def _next(ended: queue.SimpleQueue) -> Any:
    while True:
        try:
            return ended.get(timeout=0.5)  # a timeout, so that Ctrl-C is seen at once
        except queue.Empty:
            continue
