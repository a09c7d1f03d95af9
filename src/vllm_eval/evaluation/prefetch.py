"""Task data loaded in the background: while the engine starts, and while the previous task encodes.

``mteb.evaluate`` loads a task's data itself when it is not loaded yet, and then unloads it; a task
loaded beforehand is evaluated as it is and left loaded (mteb 2's ``_evaluate_task``). So a thread
that calls ``task.load_data()`` ahead of the evaluation takes the load off the critical path without
changing what mteb computes; :meth:`Prefetch.done` unloads each task once it is evaluated.
"""

from __future__ import annotations

import importlib
import logging
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
        keep: leave each task's data loaded when it is done (a sweep evaluates it again for the next model).
    """

    def __init__(
        self,
        tasks: Sequence[Any],
        ahead: int = 2,
        skip: Sequence[str] = (),
        imports: Sequence[str] = (),
        keep: bool = False,
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
            if not self._keep:
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
    tasks: Sequence[Any], workers: int, *, skip: Sequence[str] = (), imports: Sequence[str] = (), keep: bool = False
) -> Prefetch:
    """The :class:`Prefetch` of a run evaluating ``workers`` tasks at once: tasks in the order they start
    (:func:`~vllm_eval.evaluation.concurrency.in_run_order`), the next one loaded ahead of each running one."""
    from .concurrency import in_run_order

    return Prefetch(in_run_order(tasks, workers), ahead=workers + 1, skip=skip, imports=imports, keep=keep)
