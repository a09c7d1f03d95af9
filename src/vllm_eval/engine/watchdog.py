"""Stall watchdog: an engine step that does not return within the stall timeout stops the work as stalled.

Why: a vLLM engine core that hangs (a GPU kernel that never ends, a deadlock in the core) leaves ``LLM.encode`` and
our pipeline blocked for good in ``LLMEngine.step`` (vLLM's own ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` covers only
the multi-process executor of tensor-parallel engines). Seen once on an H200: an fp8 8B engine ran a 125,681-token
batch and then nothing for 5 minutes, until the call's limit killed the run.

Every engine :func:`vllm_eval.engine.build.acquire_engine` builds is watched: its ``llm_engine.step`` is wrapped to
note when the step began, and one daemon thread per process checks the steps in flight. A step older than the
timeout:

* in the thread that installed the handler (the main thread of a command, of a replica process): signal
  :data:`STALL_SIGNAL` makes the blocked call raise :class:`EngineStalled` there, so the command unwinds as for
  Ctrl-C (engines shut down, finished tasks and ``summary.json`` kept, exit :data:`EngineStalled.exit_code`) and a
  replica process exits with that code, which its pool counts as a lost replica;
* where no handler could be installed, or when the stalled step is still stuck :data:`GRACE_S` after the signal (a
  main thread inside a native call, as an engine core in this process can be: the CPU build, and big pooling
  models on a GPU): the process exits at once with that code; finished tasks and the ``summary.json`` written
  after each are kept, the engine is not shut down first.

Once the stalled step has returned (the exception went through it) or its engine is shut down, the watchdog goes
on watching: a library caller that catches :class:`EngineStalled` keeps its process.

``LLM.encode``, ``LLM.score``, ``LLM.chat`` and :mod:`vllm_eval.engine.pipeline` all step through
``llm_engine.step`` (vLLM 0.26.0 and 0.32.0), so one wrapper sees them all.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any

from ..utils.errors import EngineError

__all__ = [
    "DEFAULT_STALL_TIMEOUT_S",
    "EngineStalled",
    "install_handler",
    "stall_timeout_of",
    "unwatch",
    "watch",
]

logger = logging.getLogger(__name__)

#: Seconds one engine step may take when ``stall_timeout`` is not given: twice vLLM's own limit on one
#: tensor-parallel model execution (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``, 300 s); an 8B model's largest
#: pooling step (131,072 tokens) takes ~3 s on an H200.
DEFAULT_STALL_TIMEOUT_S = 600.0
#: Seconds the signalled process gets to unwind (shut its engines down, write its summary) before it is ended.
GRACE_S = 60.0
STALL_SIGNAL = signal.SIGUSR2


class EngineStalled(EngineError):
    """An engine step did not return within the stall timeout (the engine and the step's age are named)."""

    exit_code = 3


class _Watch:
    """One watched engine: its model, timeout (s) and the ``time.monotonic()`` its step in flight began."""

    def __init__(self, model: str, timeout: float) -> None:
        self.model = model
        self.timeout = timeout
        self.since: float | None = None


_LOCK = threading.Lock()
_WATCHED: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()
_STALLED: list[str] = []
_THREAD: list[threading.Thread] = []
#: Whether this process's main thread raises :class:`EngineStalled` on :data:`STALL_SIGNAL`.
_HANDLER = [False]


def stall_timeout_of(value: float | None) -> float | None:
    """The watchdog's timeout in seconds from the ``stall_timeout`` engine option (checked by
    :func:`vllm_eval.engine.args.check_engine_values`): None (not given) is :data:`DEFAULT_STALL_TIMEOUT_S`, 0 turns
    the watchdog off (None returned)."""
    return DEFAULT_STALL_TIMEOUT_S if value is None else float(value) or None


def watch(llm: Any, model: str, timeout: float | None) -> None:
    """Watch ``llm``'s engine steps: a step older than ``timeout`` seconds stops this process's work (see the
    module doc). ``timeout`` None: not watched. An engine without ``llm_engine.step`` is left alone."""
    engine = getattr(llm, "llm_engine", None)
    step = getattr(engine, "step", None)
    if timeout is None or not callable(step):
        return
    entry = _Watch(model, timeout)

    def watched_step(*args: Any, **kwargs: Any) -> Any:
        entry.since = time.monotonic()
        try:
            return step(*args, **kwargs)
        finally:
            entry.since = None

    engine.step = watched_step
    install_handler()
    with _LOCK:
        _WATCHED[llm] = entry
        if not _THREAD or not _THREAD[0].is_alive():
            _THREAD[:] = [threading.Thread(target=_check, name="vllm-eval-stall-watchdog", daemon=True)]
            _THREAD[0].start()


def unwatch(llm: Any) -> None:
    """Stop watching ``llm`` (before its shutdown, which may block longer than a step); its ``step`` is vLLM's own
    again (the wrapper holds the engine, a cycle only a full collection would free)."""
    with _LOCK:
        _WATCHED.pop(llm, None)
    engine = getattr(llm, "llm_engine", None)
    if engine is not None and "step" in vars(engine):
        del engine.step


def install_handler() -> None:
    """Have this process's main thread raise :class:`EngineStalled` when a step stalls (called by the command and
    a replica process before their engines start, which may be on another thread; by :func:`watch` too). Does
    nothing off the main thread or where :data:`STALL_SIGNAL` has a handler of someone else's."""
    if _HANDLER[0] or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(STALL_SIGNAL) not in (signal.SIG_DFL, None):
        return
    signal.signal(STALL_SIGNAL, _raise_stalled)
    _HANDLER[0] = True


def _raise_stalled(signum: int, frame: Any) -> None:
    if _STALLED:  # a SIGUSR2 of someone else's (a batch scheduler's warning) is not a stall
        raise EngineStalled(_STALLED[0])


def _check() -> None:
    while True:
        with _LOCK:  # the entries only: holding an engine here would keep it from being freed at its release
            entries = list(_WATCHED.values())
        now = time.monotonic()
        for entry in entries:
            since = entry.since  # read once: the step may end meanwhile
            if since is not None and now - since > entry.timeout:
                _stop(entry, now - since)
                break
        time.sleep(min([1.0, *(e.timeout / 4 for e in entries)]))


def _stop(entry: _Watch, age: float) -> None:
    """Record the stall and end the work: the signal first (the main thread raises :class:`EngineStalled`); once
    the stalled step has returned or its engine is shut down, the work was stopped and this process goes on. A
    step still stuck :data:`GRACE_S` later (a main thread inside native code, where no handler runs), or no
    handler at all: the process exits at once with :attr:`EngineStalled.exit_code`."""
    _STALLED[:] = [
        f"the vLLM engine for {entry.model} made no progress for {age:.0f} s (one engine step; --stall-timeout "
        f"{entry.timeout:g}): stopped; finished tasks and cached outputs are kept, the same command resumes"
    ]
    if _HANDLER[0]:
        os.kill(os.getpid(), STALL_SIGNAL)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            with _LOCK:
                watched = any(e is entry for e in _WATCHED.values())
            if entry.since is None or not watched:
                _STALLED.clear()
                return
            time.sleep(0.2)
        logger.error("still stalled %.0f s after the stop was signalled: exiting", GRACE_S)
    logger.error("%s", _STALLED[0])
    sys.stderr.flush()
    os._exit(EngineStalled.exit_code)
