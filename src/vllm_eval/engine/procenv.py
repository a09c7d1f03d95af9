"""The process environment vLLM reads, as this package sets it: where an engine core runs (in this
process on the CPU build), the cores it computes on, and the user's own environment for peers.

vLLM reads most of its settings from environment variables; this module sets the ones the user has
not (remembering which, so a peer such as mteb's wrapper can run "as its users get it") and decides,
per engine, whether its core may run in this process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

#: Environment variables this module set (not the user): the bench unsets them to run mteb's
#: wrapper as its users get it.
ENV_SET_HERE: set[str] = set()


def set_by_user(name: str) -> bool:
    """Whether environment variable ``name`` is set, and not by this module: the user's choice, which stands."""
    return name in os.environ and name not in ENV_SET_HERE


def set_env_default(name: str, value: str) -> None:
    """Set a vLLM environment variable the user has not set, and remember that we did."""
    if name not in os.environ:
        os.environ[name] = value
        ENV_SET_HERE.add(name)


def cpu_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity mask; every core where the OS has none), ascending."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


#: Torch threads for vLLM's rendering of multimodal inputs in this process (``OMP_NUM_THREADS``). Measured with a
#: model of Whisper large-v3-turbo's shape on a 16-core H200 host, 4,064 recordings (``scripts/gpu_speech.sh run``,
#: docs/speech.md): 52.8 s to transcribe at 1 thread (vLLM's default), 31.1 s at 4, 34.5 s at 8; at 16 the command
#: had not finished its engine start after 215 s (with a cold compile cache, so not told apart from a slow compile).
RENDERING_THREADS = 4


def set_rendering_threads() -> None:
    """Let vLLM render multimodal inputs in this process on :data:`RENDERING_THREADS` cores (``OMP_NUM_THREADS``,
    unless the user set it; fewer where this process may use fewer).

    vLLM computes each request's multimodal input (Whisper's log-mel, an image's resizing) inside
    ``set_default_torch_num_threads()`` (``vllm/renderers/base.py``), which runs torch at ``OMP_NUM_THREADS`` threads,
    **one** where it is unset: Whisper's log-mel of a 30 s recording took 11.05 ms at one thread on a 16-core H200
    host, 3.52 ms at 4 (``scripts/gpu_speech.sh features``). Replicas get their own share of the cores
    (:mod:`vllm_eval.replicas.pool`).
    """
    set_env_default("OMP_NUM_THREADS", str(max(1, min(RENDERING_THREADS, len(cpu_cores())))))


#: Modules that break vLLM's in-process kernel walk yet may be left out of ``sys.modules`` while an
#: engine starts: llvmlite's library wrapper (loaded with numba, which bm25s loads) answers ``vars()``
#: with a C function. Nothing in an engine's start uses it.
_HIDEABLE_PREFIXES = ("llvmlite.",)


def modules_breaking_kernel_scan() -> list[str]:
    """The loaded modules holding an object whose ``vars()`` has no ``get`` (empty: none).

    An in-process engine core on the CPU build walks every module's namespace and calls
    ``vars(value).get(...)`` on each object with a ``__dict__`` (vLLM's triton kernel dispatcher,
    ``_rebind_kernels``); one such object makes the engine fail to start.
    """
    import warnings

    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # touching deprecated attributes warns; vLLM's walk touches them too
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            if not namespace:
                continue
            for value in list(namespace.values()):
                try:
                    broken = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
                except Exception:  # an object that refuses vars() breaks the walk too
                    broken = True
                if broken:
                    found.append(name)
                    break
    return found


#: On a GPU, a pooling engine of a model with at least this many parameters runs its core in this process: an 8B
#: embedder (Qwen3-Embedding-8B's shape, one H200) was ready after 46.1 s in process against 62.3 s with vLLM's
#: engine-core process (which imports torch and vLLM again), and embedded as fast (40,672 / 40,338 tok/s on fixed
#: 512 / mixed 16-2000 against 41,083 / 40,006; docs/bench/h200-start8b). A small model keeps the core process:
#: our pipeline overlaps its host work with the core's (BERT-base on an H100: docs/bench/h100-pipeline).
GPU_IN_PROCESS_MIN_PARAMS = 4_000_000_000


def choose_engine_core_process(in_process: bool = True) -> list[str]:
    """Run vLLM's engine core in this process (``in_process``; else in its own, vLLM's default) unless the user
    chose (``VLLM_ENABLE_V1_MULTIPROCESSING``).

    CPU build: in process always. MiniLM's engine started in 6.7 s instead of 22.2 s on 2 cores (no second process
    re-importing vLLM and torch) and embedded as fast (13,871 vs 12,607 tok/s, fixed 130 tokens). GPU: for big
    pooling models (:data:`GPU_IN_PROCESS_MIN_PARAMS`). Loaded modules that would break vLLM's in-process start
    (:func:`modules_breaking_kernel_scan`) are returned when they may be hidden while the engine starts
    (:data:`_HIDEABLE_PREFIXES`); any other gives this engine its own process, as vLLM's default.

    Returns:
        Names of the modules to leave out of ``sys.modules`` while the engine starts.
    """
    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    if set_by_user(name):
        return []
    culprits = modules_breaking_kernel_scan() if in_process else []
    other = [m for m in culprits if not m.startswith(_HIDEABLE_PREFIXES)]
    if other:
        logger.debug("engine core in its own process: module %s would break vLLM's in-process start", other[0])
    here = in_process and not other
    os.environ[name] = "0" if here else "1"
    ENV_SET_HERE.add(name)
    reread_vllm_env()
    return culprits if here else []


def generation_core_apart() -> bool:
    """Whether a generation engine's core will run in a process of its own, as :func:`choose_engine_core_process`
    decides for it: the user's ``VLLM_ENABLE_V1_MULTIPROCESSING`` where set, else on a GPU (vLLM's default) and not
    on the CPU build. Work of this process then overlaps the core's start (its imports, weights and profiling) with
    no sharing of ``sys.modules`` while that start hides modules."""
    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    if set_by_user(name):
        return os.environ[name].strip().lower() not in ("0", "false", "")
    from .args import on_cpu

    return not on_cpu()


def big_pooling_model(model: str, engine_kwargs: dict) -> bool:
    """Whether ``model`` (a local folder, or a hub id whose snapshot is cached here) is a text-only pooling model of
    at least :data:`GPU_IN_PROCESS_MIN_PARAMS` parameters (its safetensors headers) on one GPU (no tensor or pipeline
    parallelism)."""
    from ..utils.modelinfo import local_snapshot, model_json, safetensors_stats

    if engine_kwargs.get("runner") != "pooling":
        return False
    if (engine_kwargs.get("tensor_parallel_size") or 1) > 1 or (engine_kwargs.get("pipeline_parallel_size") or 1) > 1:
        return False
    folder = local_snapshot(model, engine_kwargs.get("revision"))
    if folder is None or not (folder / "config.json").is_file():
        return False
    config = model_json(folder / "config.json")
    if any(key in config for key in ("vision_config", "audio_config")):
        return False  # measured on text: a multimodal model's preprocessing overlaps the core's work in vLLM's process
    n_params, _ = safetensors_stats(folder)
    return (n_params or 0) >= GPU_IN_PROCESS_MIN_PARAMS


@contextmanager
def modules_hidden(names: list[str]) -> Iterator[None]:
    """Leave ``names`` out of ``sys.modules`` inside the block; the same module objects afterwards."""
    hidden = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)


def reread_vllm_env() -> None:
    """Make vLLM read the environment again: an in-process engine core freezes its reading of it."""
    from vllm import envs

    clear = getattr(envs, "disable_envs_cache", None)
    if clear is not None:
        clear()


def user_environment() -> dict[str, str]:
    """This process's environment without the variables this module set: the user's own."""
    return {k: v for k, v in os.environ.items() if k not in ENV_SET_HERE}


@contextmanager
def without_our_env() -> Iterator[None]:
    """Inside: the environment as the user set it (for running a peer "as its users get it"),
    read afresh by vLLM on the way in and out."""
    saved = {k: os.environ.pop(k) for k in list(ENV_SET_HERE) if k in os.environ}
    try:
        reread_vllm_env()
        yield
    finally:
        os.environ.update(saved)
        reread_vllm_env()


def no_process_locks() -> None:
    """Give tqdm a thread lock before anything makes one of its bars: by default it makes a ``multiprocessing``
    lock, a named semaphore that a process of ours ended by a kill (or ``os._exit``) leaves registered, and the
    command then printed ``resource_tracker: There appear to be N leaked semaphore objects`` at exit. Our
    processes write no bar another process shares."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
