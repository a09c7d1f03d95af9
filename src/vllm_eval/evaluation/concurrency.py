"""Tasks evaluated concurrently: one task's scoring on the CPU while another encodes.

mteb evaluates a task by encoding its inputs and then scoring them on the CPU (logistic regression for
classification, k-means for clustering, ranking metrics for retrieval and reranking); for a fast engine
the scoring is most of a benchmark's wall time (on one H100, 94 of 162 s of a 2 % MTEB(eng, v2) replica,
docs/bench/h100-time-to-result). Evaluated one after another, the engine idles while a task scores and
all but one core idle while it encodes. Here up to ``workers`` tasks run at once, each on a thread of
its own with its own ``mteb.evaluate`` (for an encoder, in a process of its own that the thread serves:
:mod:`vllm_eval.evaluation.task_processes`, since mteb's scoring holds the GIL much of the time); the backend serves one
call at a time (:meth:`~vllm_eval.models.base.BackendBase._one_call`), so calls keep the engine's full batch and only
the scoring overlaps; engine replicas that tokenize their own shares serve two calls at once, so the replicas that
finish one call's last chunk first already have the next call's.

mteb's evaluators seed their own generators (``random.Random``, ``numpy.random.Generator``, an explicit
``random_state``), so a task's scores do not depend on what runs beside it (the test suite checks concurrent
against sequential scores); the one state mteb shares between task objects, a class-level scikit-learn model,
is cloned per task (:func:`own_evaluator`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..engine.procenv import cpu_cores
from ..utils.errors import UsageError

#: Most tasks evaluated at once by default, whatever the GPUs. On one H100 (16 cores, 4 BERT-base replicas, the 2 %
#: MTEB(eng, v2) replica), scored in processes: 4 at once 62.0 s, 6 at once 62.4 s, 8 at once 72.4 s (eight
#: processes slowed the replicas' start); on threads 4 at once took 90.1 s on the same machine
#: (docs/bench/h100-task-processes). On four H100s (64 cores, 16 replicas, the whole replica): 4 at once 132.6 s,
#: 8 at once 131.5 s, 16 at once 159.4 s (the engines ready after 56 s instead of 31 s; docs/bench/h100x4-scaling).
MAX_DEFAULT_WORKERS = 4
#: Most tasks a sweep of small models (at most ``engine.sizing.FOUR_REPLICAS_MAX_PARAMS``) evaluates at once by
#: default: its task processes start once, so more of them no longer slow an engine's start, and a later model's
#: tasks, all loaded, then keep the engine busy. One H200 host (16 cores), 8 random-weight BERT-base checkpoints, the
#: 5 % MTEB(eng, v2) replica: later models 12.3-13.3 s each with 8 at once against 15.4-16.8 s with 4, the engine
#: then encoding 12.2 of a model's 13.1 s (docs/bench/h200-sweep-5). Bigger models keep 4: each task process may
#: hold GPU memory for mteb's similarity beside the engine (``engine.sizing.SCORING_PROCESSES``).
MAX_SWEEP_WORKERS = 8


def cores() -> int:
    """The cores this process may run on."""
    return len(cpu_cores())


def default_task_workers(sweep: bool = False) -> int:
    """Tasks evaluated at once when not asked: 1 on a machine of 4 cores or fewer (there the cores encode
    and score in turn, and overlapping them gains nothing), else half the cores, at most
    :data:`MAX_DEFAULT_WORKERS` (``sweep``, a sweep of small models: :data:`MAX_SWEEP_WORKERS`)."""
    n = cores()
    return 1 if n <= 4 else min(MAX_SWEEP_WORKERS if sweep else MAX_DEFAULT_WORKERS, n // 2)


#: Seconds of mteb's scoring per sample by task type, for the order tasks start in: classification per training
#: sample of its subsets (a logistic regression fitted per experiment), the others per evaluated sample; the
#: types not named here at :data:`SCORING_SECONDS_DEFAULT`. Fitted to the whole MTEB(eng, v2) replica scored
#: alone on one H200 host, two cores per task, 768 dimensions (docs/bench/h200-full-benchmark): 0.62-0.78 ms
#: per training sample for its eight classification tasks, 0.05-0.29 ms for clustering and pair
#: classification, at most 0.09 ms for retrieval, reranking and STS.
SCORING_SECONDS = {"Classification": 6.5e-4, "Clustering": 2e-4, "PairClassification": 2e-4}
SCORING_SECONDS_DEFAULT = 5e-5
#: Seconds per point k-means clusters in mteb's bootstrapped clustering, whatever the task's size: each of its
#: ``n_clusters`` experiments draws ``max_documents_per_cluster`` (16,384) points with replacement. The same
#: replica: 2.0-2.7 s for the clustering tasks of 2,048-59,545 samples at 768 dimensions (10 x 16,384 points);
#: with a 4,096-wide 8B model three of them took 44 s each at fraction 0.02 and, estimated by their size, started
#: last and ended the run alone (docs/bench/h200-8b).
CLUSTERED_SECONDS = 1.5e-5


def _samples(task: Any, split: str) -> int:
    """Samples of ``split`` in the subsets ``task`` evaluates, by mteb's descriptive statistics (0: none)."""
    stats = (task.metadata.descriptive_stats or {}).get(split) or {}
    per_subset = stats.get("hf_subset_descriptive_stats")
    subsets = getattr(task, "hf_subsets", None)
    if per_subset and subsets:  # a benchmark's task keeps some of its subsets (MassiveIntent: 1 language of 51)
        return sum(int((per_subset.get(s) or {}).get("num_samples") or 0) for s in subsets)
    return int(stats.get("num_samples") or 0)


def expected_size(task: Any) -> int:
    """Samples in ``task``'s evaluation splits and subsets by the descriptive statistics mteb ships (0 when it
    has none)."""
    try:
        return sum(_samples(task, split) for split in task.metadata.eval_splits)
    except Exception:  # a task of ours or one without statistics: no estimate
        return 0


def expected_scoring(task: Any) -> float:
    """Estimated seconds of mteb's scoring of ``task`` at the size of its statistics (:data:`SCORING_SECONDS`, and
    :data:`CLUSTERED_SECONDS` for the points a clustering task's experiments draw); 0 without statistics."""
    kind = getattr(task.metadata, "type", None)
    try:
        samples = _samples(task, "train") if kind == "Classification" else expected_size(task)
    except Exception:
        return 0.0
    clustered = int(getattr(task, "n_clusters", 0) or 0) * int(getattr(task, "max_documents_per_cluster", 0) or 0)
    fixed = clustered * CLUSTERED_SECONDS if kind == "Clustering" and samples else 0.0
    return samples * SCORING_SECONDS.get(kind, SCORING_SECONDS_DEFAULT) + fixed


def in_run_order(tasks: Sequence[Any], workers: int) -> list[Any]:
    """``tasks`` in the order they start: as given one at a time; when several run at once, the longest to
    score first (:func:`expected_scoring`; then the largest), so that scoring overlaps the engine's work on
    the others instead of ending the run alone. On the whole MTEB(eng, v2) (one H200, 4 replicas) the largest
    first left ToxicConversationsClassification's 30 s of logistic regression to start at 243 s of 273 s.
    Stable: tasks estimated equal keep their order."""
    if workers <= 1:
        return list(tasks)
    return sorted(tasks, key=lambda t: (expected_scoring(t), expected_size(t)), reverse=True)


def task_workers(requested: int | None, n_tasks: int, *, recording: bool = False, sweep: bool = False) -> int:
    """``requested`` tasks at once (None: :func:`default_task_workers`, ``sweep`` passed on), never more than there
    are tasks; 1 when ``recording`` (a parity check records the inputs of the model, not of a task).

    Raises:
        UsageError: ``requested`` is not a positive int.
    """
    if recording:
        return 1
    if requested is None:
        requested = default_task_workers(sweep)
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
