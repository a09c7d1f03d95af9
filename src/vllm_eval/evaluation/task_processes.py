"""Tasks scored in processes of their own, while this process's backend encodes for all of them.

Tasks evaluated at once on threads (:mod:`vllm_eval.evaluation.concurrency`) share one interpreter: mteb's scoring is
mostly Python (retrieval metrics, ranking, k-means set-up) and on one H100 held the GIL about 70 % of the
time tasks were scoring, so four tasks at once took 76 s where one after another took 118 s, not a quarter
(docs/bench/h100-concurrent-tasks). Here each task thread hands its task to a process of its own
(``multiprocessing``'s spawn start, as the replicas): the process loads the task's data and runs the same
``mteb.evaluate`` (:func:`vllm_eval.evaluation.results.run_task_at`) with a proxy model whose ``encode`` (and, for a
model
with its own retrieval search, ``index``/``search``) calls come back over a pipe to the task thread, which runs
them on the real backend; a search among given candidates (``top_ranked``) is run in the process itself, only its
two encode calls crossing (MindSmall at 2 %: 2 million candidate pairs that no longer go there and back). The
backend and its engine or replicas, its cache, counters and timeline stay in this process and serve its calls as
before (one at a time; on replicas that tokenize, two: :meth:`~vllm_eval.models.base.BackendBase._one_call`); only the
scoring moves. On one H100, 4 tasks at once of the 2 % MTEB(eng, v2) replica took a
run from 90.1 s (threads) to 62.0 s (docs/bench/h100-task-processes).

A process is started per task thread when the run starts, before the engine: it imports mteb and
sentence-transformers (what ``mteb.evaluate`` imports) and loads the data of the task it will evaluate first
while the engine starts. Each process's BLAS and OpenMP pools have one thread (:data:`SCORING_THREADS`). With
``--ray-address`` the workers are Ray actors on the cluster instead (:mod:`vllm_eval.evaluation.ray_tasks`): the
same messages and loop, another launcher.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..utils import timeline
from ..utils.errors import VllmEvalError

logger = logging.getLogger(__name__)

#: BLAS/OpenMP threads of each task process. mteb's scoring is many small fits (MiniBatchKMeans in batches of 512 of
#: 16,384 x 768 points per clustering experiment, LogisticRegression on 8 samples per label): more threads made each
#: fit slower, not faster, and processes sharing cores with several threads each oversubscribed them. On a 2-core
#: CPU, 4 of mteb's clustering fits alone took 0.61 s with 1 thread and 0.91 s with 2; two processes at once took
#: 0.64-0.83 s each with 1 thread and 2.93-3.02 s with 2 (the same v-measures); 3 logistic regressions on 1,000 x
#: 768 took 0.41 s with 1 thread, 0.94 s with 2 (the same predictions). On one H200 host (16 cores, 4 processes of 4
#: threads beside 4 BERT-base replicas) a clustering task of the 5 % MTEB(eng, v2) replica scored in 16-18 s. That
#: host's CPU alone (scripts/scoring_threads_bench.py, docs/bench/h200-scoring-threads): one clustering and one
#: classification task's fits took 2.9 and 0.6 s in each of 4 processes of 1 thread, 4.8 and 2.1-3.2 s with 4.
SCORING_THREADS = 1

#: ``0`` evaluates concurrent tasks on threads of this process instead (for comparison).
ENV_SWITCH = "VLLMEVAL_TASK_PROCESSES"


class TaskProcessError(VllmEvalError, RuntimeError):
    """A process evaluating a task died or could not start (the message names the task and why)."""


def wanted(workers: int, model: Any = None) -> bool:
    """Whether tasks evaluated ``workers`` at once are scored in processes: more than one at once, not switched
    off by ``VLLMEVAL_TASK_PROCESSES=0``, and (when given) a model whose every mteb call the stand-in answers
    alike: an encoder (``encode``, optionally ``index``/``search``, forwarded) with mteb's own ``similarity``
    (computed where the task runs from the model's metadata). A cross-encoder's ``predict`` and a similarity of
    the model's own (the token embedders' batched MaxSim) keep the tasks on threads."""
    if workers <= 1 or os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    return model is None or stands_in_for(model)


def stands_in_for(model: Any) -> bool:
    """Whether a task process's stand-in answers every mteb call as ``model`` would (see :func:`wanted`);
    ``model`` may be a backend class (decided before it is built) or an instance."""
    from mteb.models.abs_encoder import AbsEncoder

    cls = model if isinstance(model, type) else type(model)
    mtebs = all(getattr(cls, n, None) is getattr(AbsEncoder, n) for n in ("similarity", "similarity_pairwise"))
    built = isinstance(model, type) or hasattr(model, "mteb_model_meta")
    return mtebs and built and hasattr(cls, "encode") and not hasattr(cls, "predict")


class TaskProcesses:
    """``n`` processes evaluating one task at a time each; :meth:`evaluate` is called from a task thread. One
    protocol for every kind of worker: :class:`~vllm_eval.evaluation.ray_tasks.RayTaskProcesses` starts Ray actors
    instead (``_launch``) and gives their tasks folders of their own (``_as_sent``).

    Args:
        n: processes (the tasks evaluated at once).
        first: the tasks to be evaluated first, in the order the task threads take them: process ``k`` loads
            ``first[k]``'s data at once (while the engine starts) and is given that task.
        threads: BLAS/OpenMP threads per process (default :data:`SCORING_THREADS`).
        keep_data: each process keeps the data of the tasks it evaluated, and a task goes back to a process that
            holds it (a sweep evaluates every task once per model: its data is loaded once).

    Raises:
        TaskProcessError: from :meth:`evaluate`, a process died (its exit code in the message).
    """

    #: Whether the processes read and write this machine's folders (a Ray actor's node may be another machine).
    shares_files = True

    def __init__(self, n: int, first: Sequence[Any] = (), threads: int | None = None, keep_data: bool = False) -> None:
        from ..utils.logs import settings

        self.keep_data = keep_data
        #: The tasks whose data each process holds (``keep_data``).
        self._held: dict[int, set[str]] = {}
        self._settings = (threads or SCORING_THREADS, settings())
        self._gpus = scoring_gpus()
        self._lock = threading.Condition()
        self._idle: list[int] = list(range(n))
        self._preloaded: dict[int, str] = {}
        self._workers: list[Any] = [None] * n
        self._closed = False
        #: Where each task was scored (``process PID``, or a Ray actor's pid and node), for logs and tests.
        self.ran: dict[str, str] = {}
        for k in range(n):
            self._start(k, first[k] if k < len(first) else None)

    def _start(self, k: int, task: Any) -> None:
        self._workers[k] = self._launch(k, pickle.dumps(task) if task is not None else None)
        self._held[k] = set()
        if task is not None:
            self._preloaded[k] = task.metadata.name

    def _launch(self, k: int, first: bytes | None) -> Any:
        """Start worker ``k`` (loading ``first``'s data): a :class:`_Process` here, a Ray actor in a subclass."""
        return _Process(k, first, (*self._settings, self._gpus[k % len(self._gpus)] if self._gpus else None))

    def _as_sent(self, run: Callable[..., Any], args: tuple, folders: dict[str, str]) -> tuple:
        """``(run, args, kwargs, finish)`` as sent to a worker, ``finish`` applied to what it returns: here the
        worker writes into ``folders`` itself."""
        return run, args, folders, lambda value: value

    def evaluate(
        self, model: Any, task: Any, run: Callable[..., Any], args: tuple, folders: dict[str, str] | None = None
    ) -> Any:
        """``run(proxy, task, *args, **folders)`` in an idle process (the one that loaded ``task`` where there is
        one), serving its model calls with ``model`` on this thread until it ends. ``run``: a module-level function
        (it is pickled by name), e.g. :func:`vllm_eval.evaluation.results.run_task_at`; ``folders``: keyword
        arguments of ``run`` naming folders it writes into (a worker on another machine writes into folders of
        its own, whose files are copied into these when it ends).

        Returns:
            What ``run`` returned (it must pickle).

        Raises:
            What ``model`` raised for the task (as itself), else what the task raised in its process;
            TaskProcessError: the process died.
        """
        name = task.metadata.name
        k = self._take(name)
        try:
            preloaded = self._preloaded.pop(k, None) == name or name in self._held[k]
            searches = hasattr(model, "search") and hasattr(model, "index")
            payload = None if preloaded else pickle.dumps(task)
            run, args, kwargs, finish = self._as_sent(run, args, folders or {})
            message = ("task", name, payload, self.keep_data, model.mteb_model_meta, searches, run, args, kwargs)
            self._workers[k].send(message)
            value = finish(self._serve(k, name, model))
            if self.keep_data:
                self._held[k].add(name)
            self.ran[name] = self._workers[k].where()
            return value
        finally:
            if not self._closed and not self._workers[k].alive():  # the next task gets a live one
                self._workers[k].kill()
                self._workers[k].close()
                self._start(k, None)
            with self._lock:
                self._idle.append(k)
                self._lock.notify_all()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _take(self, name: str) -> int:
        with self._lock:
            while not self._idle:
                self._lock.wait()
            mine = [k for k in self._idle if self._preloaded.get(k) == name or name in self._held[k]]
            if not mine and any(name in held for held in self._held.values()):  # its holder is busy: wait for it
                while not mine:
                    self._lock.wait()
                    mine = [k for k in self._idle if name in self._held[k]]
                    if not any(name in held for held in self._held.values()):
                        break
            free = [k for k in self._idle if k not in self._preloaded]
            k = (mine or free or self._idle)[0]
            self._idle.remove(k)
            return k

    def _serve(self, k: int, name: str, model: Any) -> Any:
        worker = self._workers[k]
        failure: BaseException | None = None
        while True:
            kind, *rest = self._receive(k, name)
            if kind == "loaded":
                timeline.current().add("load", rest[1], rest[2], task=rest[0])
            elif kind == "call":
                method, args, kwargs = rest
                try:
                    reply = ("value", worker.ship(_call(model, method, args, kwargs)))
                except BaseException as exc:  # told to the task, which fails; raised here as itself
                    failure = exc
                    reply = ("error", _portable(exc))
                try:
                    worker.send(reply)
                except OSError:  # the process died meanwhile
                    raise TaskProcessError(worker.ended(name)) from None
            elif kind == "done":
                return rest[0]
            else:  # failed
                raise failure if failure is not None else rest[0]

    def _receive(self, k: int, name: str) -> tuple:
        worker = self._workers[k]
        while not worker.poll(0.5):
            if self._closed:
                raise TaskProcessError(f"stopped while evaluating {name}")
            if not worker.alive():
                raise TaskProcessError(worker.ended(name))
        try:
            return worker.recv()
        except (EOFError, OSError):
            raise TaskProcessError(worker.ended(name)) from None

    def close(self) -> None:
        """Stop every process at once (a task still running in one is abandoned; a finished task's results are
        on disk before its process answers). Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Killed, not asked to exit: a process holding mteb, torch and a task's data took 1-2 s to finish
        # exiting, time the command's user waited for.
        for worker in self._workers:
            worker.kill()
        for worker in self._workers:
            worker.join(5.0)
        for worker in self._workers:
            worker.close()


def scoring_gpus() -> list[str]:
    """The GPUs task processes score on in turn (process k on the (k mod n)-th), so that each GPU holds at most
    its share of them beside its engines (``engine.sizing.SCORING_PROCESSES``): the visible GPUs where there are
    several, else none (each process as the command: one GPU or the CPU build)."""
    from ..engine.args import on_cpu
    from ..engine.sizing import visible_gpus

    try:
        gpus = [] if on_cpu() else visible_gpus()
    except Exception:  # no vLLM, NVML or torch to ask
        return []
    return gpus if len(gpus) > 1 else []


class _Process:
    """A task process (``multiprocessing``'s spawn start) and this end of its pipe: what :class:`TaskProcesses`
    sends messages to, watches and kills."""

    def __init__(self, k: int, first: bytes | None, settings: tuple) -> None:
        ours, theirs = mp.get_context("spawn").Pipe()  # spawn: a forked CUDA context or OpenMP pool is unusable
        self.proc = mp.get_context("spawn").Process(
            target=_child,
            args=(theirs, first, *settings),
            name=f"vllm-eval-tasks-{k}",
            daemon=False,  # mteb or datasets may start processes of their own
        )
        self.proc.start()
        theirs.close()
        self.conn = ours

    def send(self, message: Any) -> None:
        self.conn.send(message)

    def poll(self, timeout: float) -> bool:
        return self.conn.poll(timeout)

    def recv(self) -> Any:
        return self.conn.recv()

    def alive(self) -> bool:
        return self.proc.is_alive()

    def ended(self, name: str) -> str:
        from multiprocessing.connection import wait

        wait([self.proc.sentinel], 1.0)  # not join(): close() may be reaping it on another thread
        return f"the process evaluating {name} exited with code {self.proc.exitcode}"

    def where(self) -> str:
        return f"process {self.proc.pid}"

    @staticmethod
    def ship(value: Any) -> Any:
        return shipped(value)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except (OSError, ValueError):  # already ended (and reaped)
            pass

    def join(self, timeout: float) -> None:
        self.proc.join(timeout)

    def close(self) -> None:
        self.conn.close()


def _call(model: Any, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    if method == "encode":
        return model.encode(*args, **kwargs)
    if method == "search":  # index and search in one call: the index is kept per thread (CorpusSearch)
        from ..models.ranked import columnar
        from .scoring import eager_similarity

        corpus, queries, index_kwargs = args
        model.index(corpus, **index_kwargs)
        # arrays cross the pipe (the task process makes dicts if its scoring wants them); no torch.compile here
        with columnar(), eager_similarity():
            return model.search(queries, **kwargs)
    raise ValueError(f"not a forwarded model method: {method}")


#: Arrays of at least this many bytes cross to a task process through shared memory, not the pipe.
SHARED_BYTES = 1 << 26


class SharedArray:
    """An array handed to a task process in shared memory (its block's name, dtype and shape): pickling MindSmall's
    2.4 million query embeddings (7 GB at 768 dimensions) through the pipe copied them four times and took 20 s."""

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape


def shipped(value: Any) -> Any:
    """``value`` as it is sent to a task process: an array of :data:`SHARED_BYTES` or more copied into a shared
    memory block (the receiver copies it out and removes the block), anything else as it is."""
    if not isinstance(value, np.ndarray) or value.nbytes < max(SHARED_BYTES, 1) or value.dtype.hasobject:
        return value
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(create=True, size=value.nbytes)
    try:
        np.ndarray(value.shape, value.dtype, buffer=block.buf)[...] = value
    except BaseException:
        block.close()
        block.unlink()
        raise
    block.close()
    return SharedArray(block.name, value.dtype.str, value.shape)


def received(value: Any) -> Any:
    """A value sent by :func:`shipped`: a shared array copied out of its block, which is then removed."""
    if not isinstance(value, SharedArray):
        return value
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(name=value.name)
    try:
        return np.ndarray(value.shape, np.dtype(value.dtype), buffer=block.buf).copy()
    finally:
        block.close()
        block.unlink()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError naming it (the other side only needs to raise something)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# --- the process -------------------------------------------------------------------------------------


def _child(
    conn: Any, first: bytes | None, threads: int, logging_as: tuple[bool, str | None] | None, gpu: str | None = None
) -> None:
    """A task process: import what mteb.evaluate imports, load ``first``'s data, then evaluate the tasks it is
    sent until ``None`` or the parent's end of the pipe closes. ``logging_as``: the command's logging settings
    (:func:`vllm_eval.utils.logs.settings`): third-party warnings go where the command sends its own; ``gpu``: the
    one GPU its scoring may use (:func:`scoring_gpus`), None: as the command."""
    # Ctrl-C reaches the whole process group: the command stops these processes itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_threads(threads)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before torch counts the GPUs
    set_up(logging_as)
    serve_tasks(conn, first)


def limit_threads(threads: int) -> None:
    """Give this process's BLAS and OpenMP pools ``threads`` threads (a task process, a Ray task actor): the
    environment for the libraries not loaded yet (scikit-learn's OpenMP, SciPy's BLAS, torch), and threadpoolctl for
    those loaded already. NumPy is: this module imports it, so a spawned task process has it before :func:`_child`
    runs (a Ray worker before its actor starts), and its OpenBLAS had taken every core from the environment: 2
    threads in each task process on this repository's 2-core machine, where six tasks of the MTEB(eng, v2) replica
    then scored in 45.2 s in two processes against 12.4 s with the limit (the same scores)."""
    from threadpoolctl import threadpool_limits

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    threadpool_limits(limits=threads)  # not as a context: for the process's life


def serve_tasks(conn: Any, first: bytes | None) -> None:
    """A worker's loop, in a task process or a Ray actor: load ``first``'s data, then evaluate the tasks ``conn``
    brings (``send``/``recv`` of messages) until ``None`` or ``conn`` closes; a task sent with ``keep`` keeps its
    data loaded for the next time it is sent (by name, without its payload)."""
    from .prefetch import fresh_task

    preloaded, load_error, first_data = None, None, {}
    held: dict[str, tuple[bytes, dict[str, Any]]] = {}  # a kept task: its state before loading, its data
    if first is not None:
        try:
            preloaded = pickle.loads(first)
            first_data = _load(conn, preloaded)
        except Exception as exc:  # raised where the task is evaluated, as its own failure
            load_error = exc
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        _, name, payload, keep, meta, searches, run, args, kwargs = message
        task, pristine, data = preloaded, first, first_data
        try:
            if name in held:  # loaded for an earlier model: a fresh task holding that data
                task, pristine = fresh_task(*held[name]), None
            elif payload is not None:
                task, pristine = pickle.loads(payload), payload
            elif load_error is not None:
                raise load_error
            data = _load(conn, task) or data
            conn.send(("done", run(_proxy(conn, meta, searches), task, *args, **kwargs)))
        except BaseException as exc:  # the parent raises it where the task was evaluated
            conn.send(("failed", _portable(exc)))
        finally:
            preloaded, load_error, first_data = None, None, {}
            if keep and pristine is not None and data:
                held[name] = (pristine, data)
            elif task is not None and name not in held:
                _unload(task)


def set_up(logging_as: tuple[bool, str | None] | None) -> None:
    """A worker's logging as the command's (``logging_as``, else warnings only) and, off the first task's time,
    what ``mteb.evaluate`` imports."""
    from ..engine.procenv import no_process_locks

    no_process_locks()
    if logging_as is not None:
        from ..utils.logs import configure

        configure(*logging_as, child=True)
    else:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import mteb  # noqa: F401

    try:
        import sentence_transformers  # noqa: F401  (mteb.evaluate's first import; here, off the task's time)
    except Exception:  # mteb reports it when it needs it
        pass


def _load(conn: Any, task: Any) -> dict[str, Any]:
    """Load ``task``'s data (timed for the parent's timeline); what loading set
    (:func:`~vllm_eval.evaluation.prefetch.load_keeping`), empty when it was loaded."""
    from .prefetch import load_keeping

    start = time.time()
    data = load_keeping(task, task.load_data)
    if data:
        conn.send(("loaded", task.metadata.name, start, time.time()))
    return data


def _unload(task: Any) -> None:
    try:
        task.unload_data()
    except Exception as exc:  # freeing memory is best effort
        logger.debug("unloading %s raised %s", task.metadata.name, exc)


def _proxy(conn: Any, meta: Any, searches: bool) -> Any:
    """The model a task process hands to ``mteb.evaluate``: mteb's ``AbsEncoder`` (similarity from ``meta``) whose
    ``encode`` (and ``search``, when the real model has its own) runs in the parent."""
    from mteb.models.abs_encoder import AbsEncoder

    from ..models.streaming import Batches, loader_len

    class Proxy(AbsEncoder):
        def __init__(self) -> None:
            self.mteb_model_meta = meta
            self.model = None  # AbsEncoder.similarity looks here for a similarity of the model's own

        def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
            conn.send(("call", method, args, kwargs))
            kind, value = conn.recv()
            if kind == "error":
                raise value
            return received(value)

        def encode(self, inputs: Any, **kwargs: Any) -> Any:
            return self.call("encode", Batches(list(inputs), loader_len(inputs)), **kwargs)

    if not searches:
        return Proxy()

    class SearchingProxy(Proxy):
        _corpus: Any = None

        def index(self, corpus: Any, **kwargs: Any) -> None:
            self._corpus = (corpus, kwargs)

        def search(self, queries: Any, **kwargs: Any) -> Any:
            if self._corpus is None:
                raise ValueError("Corpus must be indexed before searching.")
            (corpus, index_kwargs), self._corpus = self._corpus, None
            if kwargs.get("top_ranked") is not None:  # ranked here: the candidates and the lists stay here
                from ..models.encoder.search import search_candidates

                return search_candidates(self, corpus, queries, **kwargs)
            from ..models.ranked import as_results

            return as_results(self.call("search", corpus, queries, index_kwargs, **kwargs))

    return SearchingProxy()


def sendable(task: Any) -> bool:
    """Whether ``task`` can go to a task process: its class pickles by name. A task class made at run time (each
    ``--data`` file's own task) does not; such a task is evaluated on a thread of the command's process."""
    try:
        pickle.dumps(type(task))
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def start_for(
    tasks: Sequence[Any],
    workers: int,
    backend: type,
    *,
    skip: Sequence[str] = (),
    start: Callable[..., TaskProcesses] = TaskProcesses,
    keep_data: bool = False,
) -> TaskProcesses | None:
    """The :class:`TaskProcesses` of a run of ``backend`` (its class, before it is built) evaluating ``workers``
    tasks at once (None when :func:`wanted` says no), each process loading one of the first tasks in run order
    (those in ``skip`` left out) while the engine starts. ``start(workers, first)`` makes them: local processes,
    or e.g. :class:`~vllm_eval.evaluation.ray_tasks.RayTaskProcesses` of a cluster; ``keep_data``: see
    :class:`TaskProcesses`."""
    from .concurrency import in_run_order

    if not wanted(workers, backend):
        return None
    first = [t for t in in_run_order(tasks, workers) if t.metadata.name not in set(skip) and sendable(t)][:workers]
    return start(workers, first, keep_data=keep_data)
