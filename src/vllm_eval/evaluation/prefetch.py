"""Task data loaded in the background: while the engine starts, and while the previous task encodes.

``mteb.evaluate`` loads a task's data itself when it is not loaded yet, and then unloads it; a task
loaded beforehand is evaluated as it is and left loaded (mteb 2's ``_evaluate_task``). So a thread
that calls ``task.load_data()`` ahead of the evaluation takes the load off the critical path without
changing what mteb computes; :meth:`Prefetch.done` unloads each task once it is evaluated.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..utils.timeline import phase

logger = logging.getLogger(__name__)


class Prefetch:
    """Load ``tasks``' data in order on one daemon thread, at most ``ahead`` tasks past the one being
    evaluated (each loaded task holds its data in memory until :meth:`done`).

    Args:
        tasks: mteb tasks, in the order they will be evaluated.
        ahead: how many tasks may be loaded and not yet done (>= 1).
        skip: names of tasks not to load (known unavailable, or to be read back from results).
        imports: modules to import on the same thread before the first load: what ``mteb.evaluate`` imports on
            its first call (sentence-transformers, and torch with it) while an engine starts elsewhere. On one H100
            a parent of replicas imported them in its first task, holding the GIL every other task waited for.
        keep: a :class:`TaskStore` that loads each task and keeps its data for the next model of a sweep (a task
            it holds is not unloaded when done).
    """

    def __init__(
        self,
        tasks: Sequence[Any],
        ahead: int = 2,
        skip: Sequence[str] = (),
        imports: Sequence[str] = (),
        keep: TaskStore | None = None,
    ) -> None:
        self._imports = list(imports)
        self._keep = keep
        self._tasks = list(tasks)
        self._skip = set(skip)
        self._futures: dict[int, Future] = {id(t): Future() for t in self._tasks}
        self._slots = threading.Semaphore(max(ahead, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-eval-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for module in self._imports:
            try:
                importlib.import_module(module)
            except Exception as exc:  # the evaluation imports it again and reports what is wrong
                logger.debug("importing %s ahead failed: %s", module, exc)
        for task in self._tasks:
            future = self._futures[id(task)]
            name = task.metadata.name
            if name in self._skip or task.data_loaded:
                future.set_result(False)
                continue
            self._slots.acquire()
            if self._stop.is_set():
                future.set_result(False)
                continue
            try:
                with phase("load", task=name):
                    if self._keep is not None:
                        self._keep.load(task)
                    else:
                        task.load_data()
            except BaseException as exc:  # re-raised where the task is evaluated, as its own failure
                self._slots.release()
                future.set_exception(exc)
            else:
                future.set_result(True)

    def wait(self, task: Any) -> None:
        """Block until ``task``'s data is loaded (or was not to be loaded); a task this prefetch does not
        hold is loaded by mteb as usual.

        Raises:
            Whatever the task's ``load_data`` raised (a missing dataset ...).
        """
        future = self._futures.get(id(task))
        if future is not None:
            future.result()

    def done(self, task: Any) -> None:
        """``task`` is evaluated: unload the data this prefetch loaded and let the next task load."""
        future = self._futures.pop(id(task), None)
        if future is None or not future.done() or future.exception() is not None or not future.result():
            return
        try:
            if self._keep is None or not self._keep.holds(task):
                task.unload_data()
        except Exception as exc:  # freeing memory is best effort
            logger.debug("unloading %s raised %s", task.metadata.name, exc)
        self._slots.release()

    def close(self) -> None:
        """Stop loading further tasks (those loading now finish)."""
        self._stop.set()
        for _ in self._tasks:
            self._slots.release()


def prefetch_for(
    tasks: Sequence[Any],
    workers: int,
    *,
    skip: Sequence[str] = (),
    imports: Sequence[str] = (),
    keep: TaskStore | None = None,
) -> Prefetch:
    """The :class:`Prefetch` of a run evaluating ``workers`` tasks at once: tasks in the order they start
    (:func:`~vllm_eval.evaluation.concurrency.in_run_order`), the next one loaded ahead of each running one."""
    from .concurrency import in_run_order

    return Prefetch(in_run_order(tasks, workers), ahead=workers + 1, skip=skip, imports=imports, keep=keep)


def load_keeping(task: Any, load: Any) -> dict[str, Any]:
    """``load()`` (which loads ``task``'s data) and the attributes it set: ``{name: value}`` of those added or
    replaced (the data), to be given to a fresh copy of the task (:func:`fresh_task`); empty when it was loaded."""
    if task.data_loaded:
        return {}
    before = dict(vars(task))
    load()
    return {k: v for k, v in vars(task).items() if k not in before or before[k] is not v}


def fresh_task(pristine: bytes, data: dict[str, Any]) -> Any:
    """The task pickled as ``pristine`` (before its data was loaded or it was evaluated), holding ``data`` (from
    :func:`load_keeping`): the state an evaluation changes is new, the data is shared.

    Why: mteb's clustering draws its subsamples from the task's own ``rng_state``; the same task object evaluated a
    second time drew others (5 clustering tasks' scores of a second model moved on the MTEB(eng, v2) replica)."""
    task = pickle.loads(pristine)
    vars(task).update(data)
    return task


class TaskStore:
    """Tasks' data loaded once for a sweep's models, on this process's threads: the first evaluation of a task
    loads it (:class:`Prefetch` with ``keep=store``), each later one gets :meth:`fresh` of it. Tasks that do not
    pickle (a data file's own task class) are not kept: loaded again for each model."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[bytes, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def load(self, task: Any) -> None:
        """Load ``task``'s data, keeping it (and the task's state before) when the task pickles."""
        try:
            pristine = pickle.dumps(task)
        except (pickle.PicklingError, AttributeError, TypeError):
            task.load_data()
            return
        data = load_keeping(task, task.load_data)
        if data:
            with self._lock:
                self._held[task.metadata.name] = (pristine, data)

    def holds(self, task: Any) -> bool:
        with self._lock:
            return task.metadata.name in self._held

    def fresh(self, tasks: Sequence[Any]) -> list[Any]:
        """``tasks`` with every held one replaced by a fresh copy holding its data."""
        with self._lock:
            held = dict(self._held)
        return [fresh_task(*held[t.metadata.name]) if t.metadata.name in held else t for t in tasks]
