"""Tasks scored in Ray actors on the cluster of ``--ray-address``, while the driver's backend encodes for all of them.

The same workers as :mod:`vllm_eval.evaluation.task_processes`, each a Ray actor instead of a local process:
:class:`RayTaskProcesses` is a :class:`~vllm_eval.evaluation.task_processes.TaskProcesses` whose workers are
started on the cluster, with the same messages, the same loop (``serve_tasks``) and the same stand-in model, so
the scores are those of a local task process. An actor loads its task's data where Ray placed it (the node needs
the task's data, or the hub, as it needs vllm-eval itself) and runs ``mteb.evaluate``; the stand-in's encode (and
search) calls come back to the driver, which runs them on the real backend as for a local process.

The channel is the actor's own methods: the driver sends a message with ``put`` and waits for the next one with
``take``, which returns when the actor's loop (a thread of the actor) has one; a message waits in a queue of the
actor until taken. No actor or port of the driver's is needed, and an actor that dies fails the pending ``take``
with Ray's actor error, which the driver reports as the task's :class:`TaskProcessError`. The actors reserve
their CPUs in one placement group (``SPREAD``: scoring is spread over the nodes), refused at once when the
cluster has too few, and an error naming what it has when placement is still pending after
:data:`~vllm_eval.replicas.ray.PLACEMENT_TIMEOUT_S`.

The driver alone writes results: an actor's node may be another machine, so a task runs with folders of its own
(a temporary folder per folder the task writes into) whose files come back with its score and are written into
the driver's folders.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..replicas.ray import PLACEMENT_TIMEOUT_S, connect
from ..utils.errors import UsageError
from .task_processes import TaskProcessError, TaskProcesses, limit_threads, serve_tasks, set_up

__all__ = ["RayTaskProcesses", "TASK_CPUS"]

logger = logging.getLogger(__name__)

#: CPUs each task actor reserves: mteb's scoring of one task is mostly one Python thread.
TASK_CPUS = 1


class RayTaskProcesses(TaskProcesses):
    """``n`` Ray actors on the cluster at ``address`` evaluating one task at a time each, as
    :class:`~vllm_eval.evaluation.task_processes.TaskProcesses` (``first``: the tasks whose data they load at
    once); ``cpus``: each actor's ``num_cpus``.

    Raises:
        UsageError: Ray missing, no cluster at ``address``, or one with fewer CPUs than the actors need.
        TaskProcessError: the actors' CPUs still not placed after ``PLACEMENT_TIMEOUT_S``; from :meth:`evaluate`,
            an actor was lost.
    """

    shares_files = False

    def __init__(
        self, address: str, n: int, first: Sequence[Any] = (), cpus: float = TASK_CPUS, keep_data: bool = False
    ) -> None:
        ray = connect(address)
        have = ray.cluster_resources().get("CPU", 0.0)
        if n * cpus > have + 1e-6:
            raise UsageError(f"{n} task actors of {cpus:g} CPU need {n * cpus:g} CPUs; the Ray cluster has {have:g}")
        self._ray, self._cpus = ray, cpus
        self._actor_class = ray.remote(_TaskActor)
        self._pg = ray.util.placement_group([{"CPU": cpus}] * n, strategy="SPREAD")
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self._pg)
            raise TaskProcessError(
                f"Ray could not place {n} task actors of {cpus:g} CPU in {PLACEMENT_TIMEOUT_S:.0f} s; "
                f"available: {ray.available_resources()}"
            ) from None
        try:
            super().__init__(n, first, threads=max(1, int(cpus)), keep_data=keep_data)
        except BaseException:  # an actor that could not be made: the others and the group go with it
            for worker in getattr(self, "_workers", []):
                if worker is not None:
                    worker.kill()
            ray.util.remove_placement_group(self._pg)
            raise

    def _launch(self, k: int, first: bytes | None) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        verbose_and_folder = self._settings[1]
        # The command's verbosity, not its log file: that is a path on the driver's machine.
        logging_as = (verbose_and_folder[0], None) if verbose_and_folder is not None else None
        where = PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=k)
        # Threaded, so that put and where are answered while a take waits for the loop's next message.
        options = {"num_cpus": self._cpus, "max_concurrency": 4, "max_restarts": 0, "scheduling_strategy": where}
        return _Actor(self._ray, self._actor_class.options(**options).remote(first, logging_as, self._settings[0]))

    def _as_sent(self, run: Callable[..., Any], args: tuple, folders: dict[str, str]) -> tuple:
        names = sorted(folders)
        return in_folders_of_its_own, (run, args, names), {}, lambda value: _written(folders, *value)

    def close(self) -> None:
        """Kill every actor (as :meth:`TaskProcesses.close`) and free their placement group. Idempotent."""
        if self._closed:
            return
        super().close()
        try:
            self._ray.util.remove_placement_group(self._pg)
        except Exception as exc:  # the cluster or the connection is gone, and the group with it
            logger.debug("freeing the task actors' placement group: %s", exc)


class _TaskActor:
    """A worker of :class:`RayTaskProcesses` (made remote there): the task processes' loop on a thread, its
    messages in and out through queues that :meth:`put` and :meth:`take` serve to the driver."""

    def __init__(self, first: bytes | None, logging_as: tuple[bool, str | None] | None, threads: int) -> None:
        self._in: queue.Queue = queue.Queue()
        self._out: queue.Queue = queue.Queue()
        args = (first, logging_as, threads)
        threading.Thread(target=self._main, args=args, name="vllm-eval-tasks", daemon=True).start()

    def _main(self, first: bytes | None, logging_as: tuple[bool, str | None] | None, threads: int) -> None:
        try:
            limit_threads(threads)  # a Ray worker has NumPy loaded, its pools sized by the node's environment
            set_up(logging_as)
            serve_tasks(_Queues(self._in, self._out), first)
        except BaseException:  # as a task process that fails to start: the driver hears of a lost actor
            logger.exception("the task actor's loop failed")
            os._exit(1)

    def put(self, message: bytes) -> None:
        """Hand ``message`` (pickled) to the loop."""
        self._in.put(message)

    def take(self) -> bytes:
        """The loop's next message (pickled), once it has one."""
        return self._out.get()

    def where(self) -> tuple[str, int]:
        """This actor's node id and process id."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


class _Queues:
    """The loop's end of an actor's channel: what ``serve_tasks`` and the stand-in model send and receive.

    Messages cross as pickled bytes, as through a task process's pipe, and are unpickled on the loop's thread:
    unpickled by Ray on the actor's own thread, a message's first mteb object imported mteb there while the
    loop imported it too (``cannot import name ... from partially initialized module 'mteb.models'``), and
    arrays from Ray's object store are read-only."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue) -> None:
        self._inbox, self._outbox = inbox, outbox

    def send(self, message: Any) -> None:
        self._outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        return pickle.loads(self._inbox.get())


class _Actor:
    """A :class:`_TaskActor` as :class:`TaskProcesses` sees its workers (as its ``_Process``): messages sent and
    received, whether it is alive, why it ended, killed."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self._ray, self.actor = ray, actor
        self._where = actor.where.remote()
        self._next: Any = None  # the pending take
        self._lost: str | None = None

    def send(self, message: Any) -> None:
        self.actor.put.remote(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))  # see _Queues

    def poll(self, timeout: float) -> bool:
        if self._next is None:
            self._next = self.actor.take.remote()
        ready, _ = self._ray.wait([self._next], timeout=timeout)
        return bool(ready)

    def recv(self) -> Any:
        ref, self._next = self._next, None
        try:
            return pickle.loads(self._ray.get(ref))
        except self._ray.exceptions.RayError as exc:  # the actor, its process or its node is gone
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._lost = f"{type(exc).__name__}: {first}"[:300].rstrip(": ")
            raise EOFError(self._lost) from None

    def alive(self) -> bool:
        return self._lost is None

    def ended(self, name: str) -> str:
        return f"the Ray actor evaluating {name} was lost ({self._lost or 'no reason given'})"

    def where(self) -> str:
        try:
            node, pid = self._ray.get(self._where, timeout=10)
        except Exception:  # only for the record: a lost actor has no answer
            return "Ray actor (lost)"
        return f"Ray actor {pid} on node {node}"

    @staticmethod
    def ship(value: Any) -> Any:
        return value  # Ray's object store carries arrays; shared memory is this machine's only

    def kill(self) -> None:
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone, or the cluster with it
            pass

    def join(self, timeout: float) -> None:
        pass  # Ray reaps its workers

    def close(self) -> None:
        pass


def in_folders_of_its_own(model: Any, task: Any, run: Callable[..., Any], args: tuple, names: list[str]) -> tuple:
    """What a task actor runs: ``run(model, task, *args, **folders)`` with an empty temporary folder for each of
    ``names``; returns ``(what run returned, {name: {relative path: bytes}})``, the files it wrote there."""
    with tempfile.TemporaryDirectory(prefix="vllm-eval-task-") as tmp:
        folders = {name: os.path.join(tmp, name) for name in names}
        for folder in folders.values():
            os.makedirs(folder)
        value = run(model, task, *args, **folders)
        files = {
            name: {p.relative_to(root).as_posix(): p.read_bytes() for p in Path(root).rglob("*") if p.is_file()}
            for name, root in folders.items()
        }
    return value, files


def _written(folders: dict[str, str], value: Any, files: dict[str, dict[str, bytes]]) -> Any:
    """``value``, once ``files`` (as :func:`in_folders_of_its_own` returns them) are written into ``folders``: each
    replaces the driver's, but for a file that every task of a model adds to (:data:`MERGED`), merged into it."""
    for name, entries in files.items():
        root = Path(folders[name])
        for relative, data in entries.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            merge = MERGED.get(path.name)
            if merge is None:
                path.write_bytes(data)
                continue
            with _MERGING:  # two task threads finishing at once
                merge(path, data)
    return value


def _merge_run_settings(path: Path, data: bytes) -> None:
    """mteb's ``run_settings.jsonl`` of a results folder (each task's settings, one file per model): the task's
    entries merged in as mteb merges them when it writes it; replaced, the file kept only the last task's."""
    import json

    entries = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    try:
        from mteb.results.task_result import _write_and_merge_keyed_json
    except ImportError:  # another mteb: keep every line, which mteb reads back all the same
        with path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(e, default=str) + "\n" for e in entries)
        return
    _write_and_merge_keyed_json(path, entries)


#: Files that several tasks write into, by name: how a task's copy is merged into the driver's.
MERGED: dict[str, Callable[[Path, bytes], None]] = {"run_settings.jsonl": _merge_run_settings}
_MERGING = threading.Lock()
