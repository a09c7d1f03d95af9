"""A local replica's process: what runs in it and how one is started.

Each replica (:class:`vllm_eval.replicas.pool.ReplicaPool`) is a spawned process with an inbox (a queue) and a result
pipe of its own: it builds one vLLM engine, answers ``ready`` (or ``failed``), then runs jobs until told to stop.
A process spawned without a model (:mod:`vllm_eval.replicas.ahead`, replicas started with the command) imports
vLLM, then waits for its engine's order (:meth:`ReplicaProcess.assign`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..engine.procenv import no_process_locks
from ..engine.watchdog import EngineStalled, install_handler
from ..utils.errors import VllmEvalError
from ..utils.timeline import process_start

logger = logging.getLogger(__name__)


@dataclass
class ReplicaProcess:
    """One replica's process, its inbox (jobs in) and the reading end of its result pipe; ``launched``:
    ``time.time()`` when it was started; ``env``: what its placement set in its environment."""

    proc: Any
    inbox: Any
    reader: Any
    launched: float
    env: dict[str, str] = field(default_factory=dict)

    def assign(self, model: str, engine_kwargs: dict[str, Any], setup: Callable[[Any], Any] | None) -> None:
        """Give a process started ahead its engine; it takes this process's environment as it is now (logging
        configured, offline mode decided) before it builds the engine."""
        self.inbox.put((model, engine_kwargs, setup, dict(os.environ)))

    def stop(self) -> None:
        """Stop a process that never got an engine (it holds no GPU memory): killed, not waited for."""
        try:
            self.proc.kill()
            self.proc.join(2.0)
        except (OSError, ValueError, AssertionError):
            pass
        kill_group(self.proc.pid)
        self.inbox.close()
        self.inbox.cancel_join_thread()
        self.reader.close()


def spawn(
    model: str | None,
    engine_kwargs: dict[str, Any] | None,
    env: dict[str, str],
    index: int,
    setup: Callable[[Any], Any] | None,
) -> ReplicaProcess:
    """Start replica ``index``'s process (``spawn``: a forked CUDA context or OpenMP pool is unusable) with ``env``
    added to its environment; ``model`` None: it imports vLLM, then waits for :meth:`ReplicaProcess.assign`."""
    ctx = mp.get_context("spawn")
    inbox = ctx.Queue()  # one per replica: a replica killed while reading cannot block the others' queue
    # One result pipe per replica, one writer each: a shared queue's write lock, held by a replica killed while
    # writing, would block every other replica's results for ever (seen in CI).
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_worker,
        name=f"vllm-eval-replica-{index}",
        daemon=False,
        args=(model, engine_kwargs, env, index, inbox, writer, setup),
    )
    launched = time.time()
    proc.start()
    writer.close()  # the replica holds the writing end: its death ends the pipe
    return ReplicaProcess(proc, inbox, reader, launched, dict(env))


def _worker(
    model: str | None,
    engine_kwargs: dict[str, Any] | None,
    env: dict[str, str],
    index: int,
    jobs: Any,
    results: Any,
    setup: Callable[[Any], Any] | None,
) -> None:  # jobs: this replica's inbox
    """Replica process: build one engine (``model`` None: import vLLM first, then wait for the engine's order),
    then run jobs ``(job_id, fn, payload)`` until ``None``."""
    # Own process group: if this process is killed, the parent can still stop the engine-core
    # processes it started (they would otherwise live on, holding memory).
    marks = {"worker": time.time()}
    os.setpgrp()
    os.environ.update(env)
    no_process_locks()  # a replica ends with os._exit
    install_handler()
    parent = os.getppid()
    llm = None
    try:
        import vllm  # noqa: F401  (timed on its own: the import is a large share of a start)

        from ..engine.build import acquire_engine

        if model is None:  # started ahead: the rest of vLLM's imports while the command has none to give
            from vllm import LLM  # noqa: F401

            marks["imported"] = time.time()
            order = _next(jobs, parent)
            if order is None:
                os._exit(0)
            model, engine_kwargs, setup, environ = order
            _adopt(environ, env)
        else:
            marks["imported"] = time.time()
        marks["assigned"] = time.time()
        llm = acquire_engine(model, **(engine_kwargs or {}))
        marks["engine"] = time.time()
        info = setup(llm) if setup is not None else None
        marks["setup"] = time.time()
    except BaseException as exc:  # the parent must hear why, not wait forever
        results.send(("failed", index, f"{type(exc).__name__}: {exc}", index))
        _release(llm)
        return
    results.send(("ready", index, (info, {**marks, "created": process_start()}), index))
    try:
        _serve(llm, jobs, results, parent, index)
        if engine_in_this_process():
            llm = None  # nothing outside this process to stop: its exit frees the engine at once
            logging.shutdown()
    finally:
        _release(llm)
        # The engine is shut down (or left to this process's exit) and our messages are flushed; skip interpreter
        # finalization, where vLLM's background threads (CUDA build) aborted with "PyEval_SaveThread: ... GIL is
        # released".
        results.close()
        os._exit(0)


def _serve(llm: Any, jobs: Any, results: Any, parent: int, index: int) -> None:
    """Run jobs ``(job_id, fn, payload)`` on ``llm`` until told to stop, each answered on ``results``; a stalled engine
    (:class:`EngineStalled`, wherever this process was when it came) ends the process with its exit code: the
    replica is lost and its pool stops what it left behind."""
    try:
        while (job := _next(jobs, parent)) is not None:
            job_id, fn, payload = job
            try:
                results.send(("done", job_id, fn(llm, payload), index))
            except EngineStalled:
                raise
            except BaseException as exc:  # a bad job must not take the replica down
                logger.debug("job %s failed:\n%s", job_id, traceback.format_exc())
                # Our own errors go back as themselves (they pickle), so a refusal stays a UsageError and
                # a failed request keeps its index; anything else is named with the replica.
                own = isinstance(exc, VllmEvalError)
                results.send(("error", job_id, exc if own else f"replica {index}: {type(exc).__name__}: {exc}", index))
    except EngineStalled as exc:
        logger.error("replica %d: %s", index, exc)
        logging.shutdown()
        os._exit(EngineStalled.exit_code)


def engine_in_this_process() -> bool:
    """Whether this process's engine lives wholly inside it: vLLM's engine core runs in process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and no worker process was started (one GPU per engine). Such a
    replica, told to stop, exits without vLLM's shutdown: the OS and the GPU driver free what the engine held
    when the process ends, and nothing else (an engine-core process, a worker's shared memory) is left to stop.
    The command's ``shutdown`` phase (stopping its replicas, after the results are written) took 1.7 s with vLLM's
    shutdown and 0.4-0.5 s without, four BERT-base replicas on an H100 (docs/bench/h100-fast-exit); two
    all-MiniLM-L6-v2 replicas on a 2-core CPU, 1.7-1.8 s and 0.1 s."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and not mp.active_children()


def _next(jobs: Any, parent: int) -> Any:
    """The next message from the inbox; None when told to stop or when the parent died without telling us."""
    while True:
        try:
            return jobs.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _adopt(environ: dict[str, str], placed: dict[str, str]) -> None:
    """Take the command's environment as it is now (its placement's own variables kept), and have vLLM read it
    again: its logging was set up at import, before the command had configured it (the log file's handler)."""
    os.environ.update({k: v for k, v in environ.items() if k not in placed})
    from vllm import envs

    clear = getattr(envs, "disable_envs_cache", None)
    if clear is not None:
        clear()
    import vllm.logger

    configure = getattr(vllm.logger, "_configure_vllm_root_logger", None)
    if configure is not None:
        configure()


def kill_group(pid: int) -> None:
    """Stop what a dead replica left behind (its engine core and workers share its process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _release(llm: Any) -> None:
    if llm is not None:
        from ..engine.build import release_engine

        release_engine(llm)


def start_breakdown(started_at: float, marks: dict[str, float]) -> dict[str, float]:
    """Seconds of a replica's start by step: ``process`` (until the OS made it), ``interpreter`` (Python's start
    and unpickling the worker's arguments), ``imports`` (torch and vLLM), ``waiting`` (a replica started ahead,
    for its engine's order), ``engine`` (vLLM's engine start: config, weights, compilation, CUDA graphs) and
    ``setup`` (what the backend reads off the engine)."""
    steps = (
        ("process", started_at, marks["created"]),
        ("interpreter", marks["created"], marks["worker"]),
        ("imports", marks["worker"], marks["imported"]),
        ("waiting", marks["imported"], marks.get("assigned", marks["imported"])),
        ("engine", marks.get("assigned", marks["imported"]), marks["engine"]),
        ("setup", marks["engine"], marks["setup"]),
    )
    return {name: round(max(end - start, 0.0), 2) for name, start, end in steps}
