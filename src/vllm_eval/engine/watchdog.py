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

**Progress**: steps that return while requests wait and none of them moves on are a stall too (a livelock: on an
H100 an 8B engine's steps returned for 7 minutes, the GPU idle, with requests pending and none answered). A
request moves on when the engine core hands back any output for it (a pooled vector, a generated token: vLLM's
``engine_core.get_output`` is watched for them, the step's own outputs where it cannot be). When the engine has had
requests and no output for ``progress_timeout`` seconds (default :data:`DEFAULT_PROGRESS_TIMEOUT_S`, or ten times
the longest step it took so far when that is longer) while its steps keep returning, the work stops as for a stalled
step, and the message says what vLLM's scheduler holds (where its core runs in this process).

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
    "DEFAULT_PROGRESS_TIMEOUT_S",
    "DEFAULT_STALL_TIMEOUT_S",
    "EngineStalled",
    "install_handler",
    "progress_timeout_of",
    "stall_timeout_of",
    "unwatch",
    "watch",
]

logger = logging.getLogger(__name__)

#: Seconds one engine step may take when ``stall_timeout`` is not given: twice vLLM's own limit on one
#: tensor-parallel model execution (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``, 300 s); an 8B model's largest
#: pooling step (131,072 tokens) takes ~3 s on an H200.
DEFAULT_STALL_TIMEOUT_S = 600.0
#: Seconds an engine may hold requests without handing back any output while its steps return, when
#: ``progress_timeout`` is not given (ten times its longest step so far where that is longer). Measured steps: an 8B
#: model's largest pooling step (131,072 tokens) ~3 s on an H200; a BERT-base step well under 1 s.
DEFAULT_PROGRESS_TIMEOUT_S = 30.0
#: The longest step an engine took, times this, is its least progress timeout (slow steps: big models on a CPU).
STEP_FACTOR = 10.0
#: An engine counts as being stepped while a step is in flight or the last one ended at most this many seconds ago: a
#: caller busy elsewhere (an engine left with requests while another is used) is not a stall.
STEPPED_GAP_S = 5.0
#: Seconds the signalled process gets to unwind (shut its engines down, write its summary) before it is ended.
GRACE_S = 60.0
#: Seconds after which a progress stop that is not obeyed (the engine still stepped, its requests still held) is
#: signalled again: a caller's code may catch the first one on its way; unwinding does not step the engine.
RESIGNAL_S = 5.0
STALL_SIGNAL = signal.SIGUSR2


class EngineStalled(EngineError):
    """An engine step did not return within the stall timeout (the engine and the step's age are named)."""

    exit_code = 3


class _Watch:
    """One watched engine: its model, step timeout (s), the ``time.monotonic()`` its step in flight began; its
    progress timeout (s, None: not watched for progress), since when it has had requests and no output, whether its
    core handed back outputs in the step in flight, its longest step (s), and the engine (weakly)."""

    def __init__(self, model: str, timeout: float | None, progress: float | None, engine: Any) -> None:
        self.model = model
        self.timeout = timeout
        self.since: float | None = None
        self.progress = progress
        self.quiet_since: float | None = None
        self.moved = False
        self.longest = 0.0
        self.last_end = 0.0
        try:
            self.engine: Any = weakref.ref(engine)
        except TypeError:  # not weakly referable (a test's stand-in): nothing to read from it
            self.engine = lambda: None

    def progress_limit(self) -> float | None:
        """Seconds without output that stop the work: the progress timeout, or :data:`STEP_FACTOR` times the
        longest step where that is longer; None when progress is not watched."""
        return None if self.progress is None else max(self.progress, STEP_FACTOR * self.longest)


_LOCK = threading.Lock()
_WATCHED: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()
_STALLED: list[str] = []
#: Where the main thread last raised :class:`EngineStalled` (``file:line``): named when a stop was caught on its way.
_RAISED_AT: list[str] = []
_THREAD: list[threading.Thread] = []
#: Whether this process's main thread raises :class:`EngineStalled` on :data:`STALL_SIGNAL`.
_HANDLER = [False]


def stall_timeout_of(value: float | None) -> float | None:
    """The watchdog's timeout in seconds from the ``stall_timeout`` engine option (checked by
    :func:`vllm_eval.engine.args.check_engine_values`): None (not given) is :data:`DEFAULT_STALL_TIMEOUT_S`, 0 turns
    the watchdog off (None returned)."""
    return DEFAULT_STALL_TIMEOUT_S if value is None else float(value) or None


def progress_timeout_of(value: float | None) -> float | None:
    """The progress timeout in seconds from the ``progress_timeout`` engine option: None (not given) is
    :data:`DEFAULT_PROGRESS_TIMEOUT_S`, 0 turns the progress watch off (None returned)."""
    return DEFAULT_PROGRESS_TIMEOUT_S if value is None else float(value) or None


def watch(llm: Any, model: str, timeout: float | None, progress: float | None = None) -> None:
    """Watch ``llm``'s engine steps: a step older than ``timeout`` seconds, or steps that return for ``progress``
    seconds (or :data:`STEP_FACTOR` times the longest step) with requests held and no output, stop this process's
    work (see the module doc). Either None: not watched for it. An engine without ``llm_engine.step`` is left alone."""
    engine = getattr(llm, "llm_engine", None)
    step = getattr(engine, "step", None)
    if (timeout is None and progress is None) or not callable(step):
        return
    entry = _Watch(model, timeout, progress, engine)
    _watch_outputs(engine, entry)

    def watched_step(*args: Any, **kwargs: Any) -> Any:
        began = entry.since = time.monotonic()
        if entry.quiet_since is None:
            entry.quiet_since = began
        entry.moved = False
        try:
            outputs = step(*args, **kwargs)
        finally:
            entry.since = None
            entry.last_end = time.monotonic()
            entry.longest = max(entry.longest, entry.last_end - began)
        if outputs or entry.moved or not _pending(engine):
            entry.quiet_since = None
        return outputs

    engine.step = watched_step
    install_handler()
    with _LOCK:
        _WATCHED[llm] = entry
        if not _THREAD or not _THREAD[0].is_alive():
            _THREAD[:] = [threading.Thread(target=_check, name="vllm-eval-stall-watchdog", daemon=True)]
            _THREAD[0].start()


def _watch_outputs(engine: Any, entry: _Watch) -> None:
    """Note in ``entry`` each step whose engine core handed back any output (vLLM's ``engine_core.get_output``:
    every generated token, every pooled request; the step's own outputs keep only finished requests offline)."""
    core = getattr(engine, "engine_core", None)
    get_output = getattr(core, "get_output", None)
    if not callable(get_output):
        return

    def watched_get_output(*args: Any, **kwargs: Any) -> Any:
        out = get_output(*args, **kwargs)
        if getattr(out, "outputs", None):
            entry.moved = True
        return out

    core.get_output = watched_get_output


def _pending(engine: Any) -> bool:
    try:
        return bool(engine.has_unfinished_requests())
    except Exception:  # a dead engine holds nothing to wait for
        return False


def unwatch(llm: Any) -> None:
    """Stop watching ``llm`` (before its shutdown, which may block longer than a step); its ``step`` is vLLM's own
    again (the wrapper holds the engine, a cycle only a full collection would free)."""
    with _LOCK:
        _WATCHED.pop(llm, None)
    engine = getattr(llm, "llm_engine", None)
    if engine is not None and "step" in vars(engine):
        del engine.step
    core = getattr(engine, "engine_core", None)
    if core is not None and "get_output" in vars(core):
        del core.get_output


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
        _RAISED_AT[:] = [f"{frame.f_code.co_filename}:{frame.f_lineno}"] if frame is not None else []
        raise EngineStalled(_STALLED[0])


def _check() -> None:
    while True:
        with _LOCK:  # the entries only: holding an engine here would keep it from being freed at its release
            entries = list(_WATCHED.values())
        now = time.monotonic()
        for entry in entries:
            since, quiet = entry.since, entry.quiet_since  # read once: the step may end meanwhile
            if since is not None and entry.timeout is not None and now - since > entry.timeout:
                _stop(entry, now - since)
                break
            limit = entry.progress_limit()
            # Quiet for longer than the limit over steps that keep coming and returning (one long step is the step
            # timeout's; an engine nobody steps now is not stalled).
            if quiet is not None and limit is not None and now - quiet > limit and _stepped(entry, since, now, limit):
                _stop(entry, now - quiet, progress=True)
                break
        waits = [e.timeout / 4 for e in entries if e.timeout] + [e.progress / 4 for e in entries if e.progress]
        time.sleep(min([1.0, *waits]))


def _stepped(entry: _Watch, since: float | None, now: float, limit: float) -> bool:
    """Whether ``entry``'s engine is being stepped: a step in flight for less than ``limit``, or one that ended at
    most :data:`STEPPED_GAP_S` (a quarter of ``limit`` where that is less) ago."""
    return now - since < limit if since is not None else now - entry.last_end < min(STEPPED_GAP_S, limit / 4)


def _scheduler_state(engine: Any) -> str:
    """What vLLM's scheduler holds, where its engine core runs in this process (vLLM's ``InprocClient``): requests
    waiting and running, the first of each with its tokens computed, the free KV-cache blocks; "" elsewhere."""
    try:
        scheduler = engine.engine_core.engine_core.scheduler
        parts = [f"{len(scheduler.waiting)} waiting, {len(scheduler.running)} running"]
        for name in ("waiting", "running"):
            for request in list(getattr(scheduler, name))[:1]:
                parts.append(
                    f"first {name}: {request.num_computed_tokens} of {request.num_tokens} tokens computed, "
                    f"status {getattr(request.status, 'name', request.status)}"
                )
        free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        parts.append(f"{free} free KV-cache blocks")
        return "; vLLM's scheduler: " + ", ".join(parts)
    except Exception:  # another vLLM, or a core in its own process: nothing to read here
        return ""


def _stop(entry: _Watch, age: float, progress: bool = False) -> None:
    """Record the stall and end the work: the signal first (the main thread raises :class:`EngineStalled`); once
    the stalled step has returned (a stall of progress: the engine holds no request, or its steps stopped) or its
    engine is shut down, the work was stopped and this process goes on. A stall still there :data:`GRACE_S` later
    (a main thread inside native code, where no handler runs), or no handler at all: the process exits at once with
    :attr:`EngineStalled.exit_code`."""
    if progress:
        engine = entry.engine()
        what = (
            f"held requests and answered none for {age:.0f} s while its steps returned (--progress-timeout "
            f"{entry.progress:g}; longest step {entry.longest:.1f} s)"
            + (_scheduler_state(engine) if engine is not None else "")
        )
    else:
        what = f"made no progress for {age:.0f} s (one engine step; --stall-timeout {entry.timeout:g})"
    _STALLED[:] = [
        f"the vLLM engine for {entry.model} {what}: stopped; finished tasks and cached outputs are kept, the same "
        "command resumes"
    ]
    if _HANDLER[0] and signal.getsignal(STALL_SIGNAL) is _raise_stalled:
        os.kill(os.getpid(), STALL_SIGNAL)
        signalled = time.monotonic()
        deadline = signalled + GRACE_S
        while time.monotonic() < deadline:
            with _LOCK:
                watched = any(e is entry for e in _WATCHED.values())
            engine = entry.engine()
            if not watched or (entry.since is None if not progress else engine is None or not _pending(engine)):
                _STALLED.clear()
                entry.quiet_since = None
                return
            now = time.monotonic()
            if progress and now - signalled > RESIGNAL_S and _stepped(entry, entry.since, now, 1.0):
                # Steps still come and requests are still held: the stop was caught on its way (by code between the
                # handler and the caller that swallows exceptions), not obeyed. Ask again.
                where = f" (raised at {_RAISED_AT[0]})" if _RAISED_AT else ""
                logger.warning("the stop was not obeyed%s: the engine is still being stepped; signalling again", where)
                os.kill(os.getpid(), STALL_SIGNAL)
                signalled = now
            time.sleep(0.2)
        logger.error("still stalled %.0f s after the stop was signalled: exiting", GRACE_S)
    logger.error("%s", _STALLED[0])
    sys.stderr.flush()
    os._exit(EngineStalled.exit_code)
