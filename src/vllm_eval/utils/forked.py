"""A step computed ahead in a forked child process while this process computes another.

mteb scores MindSmallReranking in two steps, one after the other in one process: the retrieval metrics of its 2.4
million subqueries, then (``task_specific_scores``) the same metrics of the subqueries merged per impression. The
second needs only the qrels and the search results, which the first has too, so it is started in a child forked at
the first (:func:`start`): the child shares the arrays and dicts copy-on-write, so nothing is pickled on the way in,
and sends back only its few hundred floats. On four H100s (BERT-base, the whole replica) the two steps took about
65 s of the task's scoring, which ended the run (docs/bench/h100x4-scaling-2).

MindSmallReranking's first step is split the same way, its queries in ranges of forked children
(``evaluation.scoring.retrieval``), and so is the pairing of its 97 million candidates with their documents
(``models.encoder.search.rank_candidates``).

Where the child cannot be had (no ``os.fork``) or fails, the step is computed in this process when asked, so the
numbers never depend on the child: it runs the same function on the same objects.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds to wait for a child's answer once it is asked for: a child deadlocked by a lock another thread held at
#: the fork is given up (and its step computed here) instead of waited on for ever.
GRACE_S = 600.0

#: Items (queries) from which a step is worth a forked child (:func:`worth_forking`): a fork of a process that holds
#: a task's data costs milliseconds; MindSmallReranking's 2.4 million subqueries cost tens of seconds of Python per
#: step.
MIN_ITEMS = 200_000

_lock = threading.Lock()
_pending: dict[tuple, _Child] = {}


def worth_forking(n: int) -> bool:
    """Whether a step over ``n`` items is worth a forked child (:data:`MIN_ITEMS`)."""
    return n >= MIN_ITEMS


class _Child:
    """A forked child computing ``fn(*args)``: its pid, the read end of its pipe, and the arguments (kept alive so
    their ids key :data:`_pending` while it runs)."""

    def __init__(self, pid: int, fd: int, fn: Callable[..., Any], args: tuple) -> None:
        self.pid, self.fd, self.fn, self.args = pid, fd, fn, args

    def result(self) -> Any:
        """The child's value, or ``fn(*args)`` computed here when the child failed or outlived :data:`GRACE_S`."""
        data, deadline = bytearray(), time.monotonic() + GRACE_S
        try:
            while True:
                ready, _, _ = select.select([self.fd], [], [], max(deadline - time.monotonic(), 0.0))
                if not ready:
                    raise TimeoutError(f"no answer in {GRACE_S:.0f} s")
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
            status, value = pickle.loads(bytes(data))
            if status != "ok":
                raise RuntimeError(value)
            return value
        except Exception as exc:  # the step itself decides: computed here, its own errors raised here
            logger.warning("a step computed ahead in a child failed (%s): computing it here", exc)
            return self.fn(*self.args)
        finally:
            self.close()

    def close(self) -> None:
        os.close(self.fd)
        try:
            os.kill(self.pid, 9)
        except OSError:  # ended already
            pass
        os.waitpid(self.pid, 0)


def _key(fn: Callable[..., Any], args: tuple) -> tuple:
    """A step is taken on the thread that started it (a task is evaluated on one thread) with the same objects."""
    return (threading.get_ident(), fn, *(id(a) for a in args))


def start(fn: Callable[..., Any], *args: Any) -> bool:
    """Start ``fn(*args)`` in a forked child; :func:`take` with the same function and the same objects then
    returns its value. False where no child was started (no ``os.fork``, or the fork failed): ``take`` then
    finds nothing and the caller computes as always."""
    if not hasattr(os, "fork"):
        return False
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():  # 3.12+ warns of fork beside threads: the child runs only fn, then exits
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as exc:
        os.close(read)
        os.close(write)
        logger.debug("no child for a scoring step: %s", exc)
        return False
    if pid == 0:  # the child: compute, answer, and leave without running the parent's exit handlers
        global _lock
        _lock = threading.Lock()  # another thread of the parent may have held it at the fork
        _pending.clear()  # the parent's children, not this one's
        code = 0
        try:
            os.close(read)
            try:
                answer = pickle.dumps(("ok", fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which computes it itself
                answer = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
            view = memoryview(answer)
            while view:
                view = view[os.write(write, view) :]
        except BaseException:  # noqa: BLE001 - the parent sees the pipe close and computes the step itself
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    child = _Child(pid, read, fn, args)
    with _lock:
        old = _pending.pop(_key(fn, args), None)
        _pending[_key(fn, args)] = child
    if old is not None:
        old.close()
    return True


def take(fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """``(True, value)`` of a step :func:`start` began with this function and these same objects (waiting for
    it), else ``(False, None)``."""
    with _lock:
        child = _pending.pop(_key(fn, args), None)
    if child is None:
        return False, None
    return True, child.result()


def in_ranges(fn: Callable[..., Any], n: int, parts: int, *args: Any) -> list[Any]:
    """``[fn(*args, lo, hi) for lo, hi in ranges]`` over ``parts`` contiguous ranges splitting ``range(n)`` (one
    range, ``fn(*args, 0, n)`` here, where :func:`worth_forking` says no): the first computed here while the others
    run in forked children (:func:`start`), each computed here where its child failed. ``fn``'s own errors are
    raised here, as if every range ran here."""
    parts = max(1, min(parts, n)) if worth_forking(n) else 1
    bounds = [n * i // parts for i in range(parts + 1)]
    ranges = list(zip(bounds, bounds[1:], strict=False))
    started = [r for r in ranges[1:] if start(fn, *args, *r)]
    try:
        out = [fn(*args, *ranges[0])]
        for r in ranges[1:]:
            found, value = take(fn, *args, *r) if r in started else (False, None)
            out.append(value if found else fn(*args, *r))
    finally:
        for r in started:
            cancel(fn, *args, *r)
    return out


def cancel(fn: Callable[..., Any], *args: Any) -> None:
    """End the child :func:`start` began with this function and these objects, if it was not taken."""
    with _lock:
        child = _pending.pop(_key(fn, args), None)
    if child is not None:
        child.close()


def drop() -> None:
    """End this thread's children not taken (its task failed between :func:`start` and :func:`take`)."""
    me = threading.get_ident()
    with _lock:
        children = [_pending.pop(key) for key in [k for k in _pending if k[0] == me]]
    for child in children:
        child.close()
