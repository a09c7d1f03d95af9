"""A local replica's process: what runs in it, how one is started, and replicas started with the command.

Each replica (:class:`vllm_eval.replicas.ReplicaPool`) is a spawned process with an inbox (a queue) and a result
pipe of its own: it builds one vLLM engine, answers ``ready`` (or ``failed``), then runs jobs until told to stop.

**Started with the command.** A replica spends its first seconds importing torch and vLLM (on an H100 machine
3-5 s for ``import vllm``, then about 7 s of vLLM's deferred imports before its engine init), while the command
spends its own first seconds importing mteb and ours, checking its options and resolving the model (6.1 s into
a run on an H100 before the replicas were launched, docs/bench/h100-task-processes). :func:`start_ahead`, called
first thing with the command line, starts the replica processes the command's layout flags
(``--data-parallel-size``, ``--replicas-per-gpu``, ``--tensor-parallel-size``) will ask for: they import
meanwhile, then wait for the model, the engine options and the setup function. The pool takes them
(:func:`take_ahead`) when its plan puts replicas exactly where they were started (same count, same
environment), and hands each its order; otherwise they are stopped unused and the pool starts its own, as it
would have anyway. Whatever is not taken is stopped when the command ends (:func:`discard_ahead`).
``VLLMEVAL_START_AHEAD=0`` turns this off.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import VllmEvalError
from .procenv import no_process_locks
from .timeline import process_start

logger = logging.getLogger(__name__)

#: ``0`` starts no replica processes before the command knows its model.
ENV_SWITCH = "VLLMEVAL_START_AHEAD"
#: Commands whose vLLM backend starts local replicas from the layout flags.
ENGINE_COMMANDS = ("run", "rerank", "generate", "classify", "reward", "token-classify")


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
        _kill_group(self.proc.pid)
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
    parent = os.getppid()
    llm = None
    try:
        import vllm  # noqa: F401  (timed on its own: the import is a large share of a start)

        from .engine import acquire_engine

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
        while (job := _next(jobs, parent)) is not None:
            job_id, fn, payload = job
            try:
                results.send(("done", job_id, fn(llm, payload), index))
            except BaseException as exc:  # a bad job must not take the replica down
                logger.debug("job %s failed:\n%s", job_id, traceback.format_exc())
                # Our own errors go back as themselves (they pickle), so a refusal stays a UsageError and
                # a failed request keeps its index; anything else is named with the replica.
                own = isinstance(exc, VllmEvalError)
                results.send(("error", job_id, exc if own else f"replica {index}: {type(exc).__name__}: {exc}", index))
    finally:
        _release(llm)
        # The engine is shut down and our messages are flushed; skip interpreter finalization, where
        # vLLM's background threads (CUDA build) aborted with "PyEval_SaveThread: ... GIL is released".
        results.close()
        os._exit(0)


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


def _kill_group(pid: int) -> None:
    """Stop what a dead replica left behind (its engine core and workers share its process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _release(llm: Any) -> None:
    if llm is not None:
        from .engine import release_engine

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


# --- replicas started with the command ----------------------------------------------------------------

_AHEAD: list[ReplicaProcess] = []


def layout_of(argv: Sequence[str]) -> tuple[int, int, int] | None:
    """``(data_parallel_size, replicas_per_gpu, tensor_parallel_size)`` of a command line (without the program
    name) that will start more than one local vLLM replica; None for any other, or one it cannot read (the
    command's own parser then speaks)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in ENGINE_COMMANDS:
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in ("--data-parallel-size", "--replicas-per-gpu", "--tensor-parallel-size"):
        parser.add_argument(name, type=int, default=1)
    parser.add_argument("--backend", default="vllm")
    for name in ("--ray-address", "--endpoint"):
        parser.add_argument(name, nargs="*")
    parser.add_argument("-h", "--help", action="store_true")
    try:
        args, _ = parser.parse_known_args(list(argv))
    except (argparse.ArgumentError, SystemExit, ValueError):
        return None
    sizes = (args.data_parallel_size, args.replicas_per_gpu, args.tensor_parallel_size)
    if args.help or args.ray_address or args.endpoint or args.backend != "vllm" or min(sizes) < 1:
        return None
    return sizes if sizes[0] * sizes[1] > 1 else None


def start_ahead(argv: Sequence[str]) -> None:
    """Start the replica processes the command line ``argv`` will ask for (see the module doc). Never raises: a
    layout that cannot be placed is the command's to report, once it has checked its options."""
    layout = layout_of(argv)
    if layout is None:
        return
    try:
        from .hub import ensure_offline_if_unreachable
        from .logs import preset_environment
        from .replicas import plan_replicas

        # Read once, when the hub libraries and torch are imported: before the replicas import them.
        ensure_offline_if_unreachable()
        preset_environment("--verbose" in argv or "-v" in argv)
        placements = plan_replicas(layout[0], layout[1], tensor_parallel_size=layout[2])
        for p in placements:
            _AHEAD.append(spawn(None, None, p.env, p.index, None))
    except Exception as exc:  # the command plans (and reports) it again
        logger.debug("no replicas started ahead: %s", exc)
        discard_ahead()


def take_ahead(placements: Sequence[Any]) -> list[ReplicaProcess] | None:
    """The processes started ahead for exactly ``placements`` (one each, in order, same environment), now the
    caller's; None when there are none or they do not match (then they are stopped)."""
    ahead = list(_AHEAD)
    _AHEAD.clear()
    if not ahead:
        return None
    if len(ahead) == len(placements) and all(a.env == p.env for a, p in zip(ahead, placements, strict=True)):
        alive = all(a.proc.is_alive() for a in ahead)
        if alive:
            return ahead
    logger.info("replica processes started ahead do not match the replicas planned: starting new ones")
    for a in ahead:
        a.stop()
    return None


def discard_ahead() -> None:
    """Stop the processes started ahead that no pool took (the command failed, or started no replicas)."""
    while _AHEAD:
        _AHEAD.pop().stop()
