"""The stall watchdog without an engine: steps within the timeout pass, however many; one over it ends the process
with exit 3 when no handler could be installed (a Ray actor, an engine built off the main thread). The path through a
real vLLM engine (its core stopped with SIGSTOP) is in test_api.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from vllm_eval.engine.args import check_engine_values
from vllm_eval.engine.watchdog import DEFAULT_STALL_TIMEOUT_S, stall_timeout_of
from vllm_eval.utils.errors import OptionError

_SCRIPT = """
import threading, time, types
from vllm_eval.engine import watchdog

def step(seconds):
    time.sleep(seconds)
    return []

class LLM:  # vllm.LLM's shape, as far as the watchdog looks: llm.llm_engine.step()
    llm_engine = types.SimpleNamespace(step=step)

llm = LLM()

def work():
    watchdog.watch(llm, "tiny-model", 1.5)
    for _ in range(20):  # 2 s of steps, each well within the timeout
        llm.llm_engine.step(0.1)
    print("steps ok", flush=True)
    llm.llm_engine.step(30)  # hangs
    print("not stopped", flush=True)
"""


def _ends_with_exit_3(script: str, stdout: str, message: str) -> None:
    """``script``'s ``work()`` run on a thread (where no handler can be installed, as in a Ray actor): the process
    exits 3 after printing ``stdout``, its stderr matching ``message``."""
    code = script + "\nthread = threading.Thread(target=work)\nthread.start()\nthread.join()\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == stdout
    assert re.search(message, proc.stderr), proc.stderr


def test_a_step_over_the_timeout_ends_the_process_with_exit_3_and_says_why():
    _ends_with_exit_3(
        _SCRIPT,
        "steps ok\n",
        r"the vLLM engine for tiny-model made no progress for \d+ s \(one engine step; --stall-timeout 1.5\)",
    )


def test_the_timeout_option():
    assert stall_timeout_of(None) == DEFAULT_STALL_TIMEOUT_S and stall_timeout_of(0) is None
    assert stall_timeout_of(30) == 30.0
    for bad in (-1, "60", True):
        with pytest.raises(OptionError, match="--stall-timeout must be a number of seconds >= 0"):
            check_engine_values({"stall_timeout": bad})


_PROGRESS_SCRIPT = """
import threading, time, types
from vllm_eval.engine import watchdog

class Engine:  # llm.llm_engine as far as the watchdog looks: step(), has_unfinished_requests()
    def __init__(self):
        self.answer_every = 5
        self.steps = 0

    def step(self):
        time.sleep(0.05)
        self.steps += 1
        return ["out"] if self.answer_every and self.steps % self.answer_every == 0 else []

    def has_unfinished_requests(self):
        return True

class LLM:
    llm_engine = Engine()

llm = LLM()

def work():
    watchdog.watch(llm, "tiny-model", 60, progress=1.0)
    for _ in range(60):  # 3 s of steps, an output every 5th
        llm.llm_engine.step()
    print("answering ok", flush=True)
    llm.llm_engine.answer_every = 0  # steps return, nothing is ever answered again
    llm.llm_engine.step()
    time.sleep(7)  # ... but nobody steps the engine (its caller is busy elsewhere): not a stall
    print("idle ok", flush=True)
    for _ in range(400):
        llm.llm_engine.step()
    print("not stopped", flush=True)
"""


def test_steps_that_return_without_answering_end_the_process_with_exit_3():
    _ends_with_exit_3(
        _PROGRESS_SCRIPT,
        "answering ok\nidle ok\n",
        r"the vLLM engine for tiny-model held requests and answered none for \d+ s while its steps returned "
        r"\(--progress-timeout 1; longest step 0.\d s\)",
    )


def test_the_progress_limit_grows_with_the_longest_step():
    from vllm_eval.engine.watchdog import DEFAULT_PROGRESS_TIMEOUT_S, STEP_FACTOR, _Watch, progress_timeout_of

    assert progress_timeout_of(None) == DEFAULT_PROGRESS_TIMEOUT_S and progress_timeout_of(0) is None
    entry = _Watch("m", 600, 30.0, object.__new__(type("E", (), {})))
    assert entry.progress_limit() == 30.0
    entry.longest = 12.0  # a big model on a CPU: its steps take long, so may a quiet spell
    assert entry.progress_limit() == STEP_FACTOR * 12.0
    for bad in (-1, "30", True):
        with pytest.raises(OptionError, match="--progress-timeout must be a number of seconds >= 0"):
            check_engine_values({"progress_timeout": bad})


def test_a_real_engine_whose_steps_schedule_nothing_is_stopped_and_goes_on_after(vllm_encoder, monkeypatch):
    # vLLM's engine core made to schedule nothing (each step returns, no request ever runs), as an H100's 8B engine
    # did for minutes: the watchdog raises EngineStalled in this (the main) thread within its limit, naming what the
    # scheduler holds; the aborted requests leave the engine usable once it schedules again.
    import time

    from vllm_eval.engine import watchdog

    llm = vllm_encoder.llm
    core = llm.llm_engine.engine_core.engine_core  # the CPU build's engine core runs in this process
    monkeypatch.setattr(watchdog._WATCHED[llm], "progress", 2.0)
    monkeypatch.setattr(watchdog._WATCHED[llm], "longest", 0.0)  # the session's earlier steps do not count here
    monkeypatch.setattr(core, "step_fn", lambda: ({}, False))
    texts = [f"text number {i}" for i in range(40)]
    began = time.monotonic()
    with pytest.raises(watchdog.EngineStalled, match=r"held requests and answered none .*40 waiting, 0 running") as e:
        vllm_encoder.encode_texts(texts)
    # Within its limit, or one re-signal later: the signal lands at any bytecode of the main thread, and code on
    # the way (vLLM's, a finalizer's) may catch the first one (seen once in CI: 7.5 s).
    assert time.monotonic() - began < 2.0 + watchdog.RESIGNAL_S + 5, e.value
    monkeypatch.undo()
    assert not llm.llm_engine.has_unfinished_requests()
    assert vllm_encoder.encode_texts(texts).shape == (40, 384)


_SWALLOWED_SCRIPT = (
    _PROGRESS_SCRIPT.split("def work():")[0]
    + """
from vllm_eval.engine.watchdog import EngineStalled

watchdog.watch(llm, "tiny-model", 60, progress=1.0)  # on the main thread: the stop is raised here
llm.llm_engine.answer_every = 0
swallowed = 0
try:
    while True:
        try:
            llm.llm_engine.step()
        except EngineStalled:  # code between the handler and the caller that catches it and goes on
            if swallowed:
                raise
            swallowed += 1
except EngineStalled as exc:
    print(f"stopped after {swallowed} swallowed: {str(exc)[:40]}", flush=True)
"""
)


def test_a_stop_that_is_caught_on_its_way_is_signalled_again():
    # The engine's caller catches the first EngineStalled and keeps stepping (requests held, none answered): the
    # watchdog sees the engine still stepped and signals again (after RESIGNAL_S), instead of ending the process
    # with exit 3 after its grace period.
    proc = subprocess.run([sys.executable, "-c", _SWALLOWED_SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "stopped after 1 swallowed: the vLLM engine for tiny-model held requ\n", proc.stdout
    assert "signalling again" in proc.stderr
    assert "the stop was not obeyed (raised at " in proc.stderr  # where the caught one was raised
