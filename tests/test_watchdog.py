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

thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


def test_a_step_over_the_timeout_ends_the_process_with_exit_3_and_says_why():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "steps ok\n"
    assert re.search(
        r"the vLLM engine for tiny-model made no progress for \d+ s \(one engine step; --stall-timeout 1.5\)",
        proc.stderr,
    ), proc.stderr


def test_the_timeout_option():
    assert stall_timeout_of(None) == DEFAULT_STALL_TIMEOUT_S and stall_timeout_of(0) is None
    assert stall_timeout_of(30) == 30.0
    for bad in (-1, "60", True):
        with pytest.raises(OptionError, match="--stall-timeout must be a number of seconds >= 0"):
            check_engine_values({"stall_timeout": bad})
