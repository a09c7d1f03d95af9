"""The one place that builds, shares and shuts down vLLM engines.

Every backend asks :func:`acquire_engine` for a ``vllm.LLM``. Engines are keyed by model and options,
so two wrappers of the same model with the same options share one engine, and an engine is shut down
when its last user calls :func:`release_engine` (or at interpreter exit). The explicit shutdown
matters: without it the CPU build's engine-core process is torn down mid-flight and the process
aborts ("terminate called without an active exception") with a non-zero exit code.

Engine options are checked and completed in :mod:`vllm_eval.engine.args`; the process environment
vLLM reads is set in :mod:`vllm_eval.engine.procenv`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..utils.errors import EngineError
from ..utils.modelinfo import ModelRef, resolve_model
from .args import SMALL_CPU_CORES, effective_engine_kwargs, on_cpu
from .procenv import (
    big_pooling_model,
    choose_engine_core_process,
    modules_hidden,
    set_env_default,
    set_rendering_threads,
)
from .watchdog import progress_timeout_of, stall_timeout_of, unwatch, watch

__all__ = [
    "EngineError",
    "acquire_engine",
    "live_engines",
    "release_engine",
    "reload_engine",
    "resolve_model",
    "shutdown_all",
]

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    llm: Any
    refs: int


_LOCK = threading.Lock()
_ENGINES: dict[str, _Entry] = {}
_ATEXIT = False


#: Engine options that change what is displayed, not the engine: an engine built without them serves.
_DISPLAY_ONLY = frozenset({"use_tqdm_on_load"})


def _key(model: str, kwargs: dict[str, Any]) -> str:
    kept = {k: v for k, v in kwargs.items() if k not in _DISPLAY_ONLY}
    return json.dumps({"model": model, **kept}, sort_keys=True, default=repr)


def acquire_engine(model: str | os.PathLike | ModelRef, **engine_kwargs: Any):
    """A shared ``vllm.LLM`` for ``model`` built with ``engine_kwargs`` (vLLM's ``EngineArgs`` names).

    The same model and options return the same engine (its use count goes up); pair every call
    with :func:`release_engine`. ``runner`` and ``convert`` pick vLLM's pooling or generation
    path, e.g. ``runner="pooling", convert="embed"``.

    ``head_dtype`` and a dict ``pooler_config`` are accepted too (see :func:`normalize_engine_kwargs`), and
    ``stall_timeout``: seconds one engine step may take before the work stops as stalled (default
    :data:`~vllm_eval.engine.watchdog.DEFAULT_STALL_TIMEOUT_S`, 0 never; :mod:`vllm_eval.engine.watchdog`) and
    ``progress_timeout``: seconds the engine may hold requests without answering any while its steps return (default
    :data:`~vllm_eval.engine.watchdog.DEFAULT_PROGRESS_TIMEOUT_S`, 0 never); an engine shared by later callers keeps
    its first caller's.

    Raises:
        ModelNotFoundError: a model path that does not exist (see :func:`resolve_model`).
        OptionError: an option that is not a vLLM engine option.
        EngineError: vLLM failed to build the engine (its reason is in the message).
    """
    global _ATEXIT
    model = model.path if isinstance(model, ModelRef) else resolve_model(model)
    kwargs = effective_engine_kwargs(engine_kwargs, model)  # checks stall_timeout and leaves it out
    stall = stall_timeout_of(engine_kwargs.get("stall_timeout"))
    progress = progress_timeout_of(engine_kwargs.get("progress_timeout"))
    key = _key(model, kwargs)
    with _LOCK:
        entry = _ENGINES.get(key)
        if entry is not None:
            entry.refs += 1
            return entry.llm
        # vLLM starts its engine core with `spawn` on CPU anyway; forcing it everywhere keeps a
        # CUDA context or OpenMP pool of ours from being forked into it.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        hide: list[str] = []
        if on_cpu():
            hide = choose_engine_core_process()
            if (os.cpu_count() or 1) <= SMALL_CPU_CORES:
                # vLLM's CPU worker keeps one core for its scheduler and computes on the rest: on a
                # 2-core machine that is half the machine. The scheduler is idle while a pooling batch
                # runs, so compute on every core (measured here: 3,791 -> 6,971 tok/s, MiniLM fp32).
                set_env_default("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        else:
            from .sizing import check_engine_fits

            check_engine_fits(model, kwargs)  # weights beyond the engine's share: one line, before vLLM loads
            collect_released_on_gpu()
            hide = choose_engine_core_process(in_process=big_pooling_model(model, kwargs))
            set_rendering_threads()  # else vLLM renders audio and images here at one torch thread
        if not on_cpu() and kwargs.get("runner") == "generate":
            # FlashInfer's top-k/top-p sampler is compiled with nvcc while the engine warms up, on every machine
            # without its kernel cache: a tiny Qwen2-VL's engine took 93.4 s to warm up with it on an H100,
            # 7.2 s without, same scores (greedy decoding and prompt log-probabilities do not sample).
            set_env_default("VLLM_USE_FLASHINFER_SAMPLER", "0")
        logger.info("starting a vLLM engine for %s", model)
        logger.debug("engine options: %s", kwargs)
        llm = _start_llm(model, kwargs, hide)
        watch(llm, model, stall, progress)
        _ENGINES[key] = _Entry(llm=llm, refs=1)
        if not _ATEXIT:
            # Last (atexit runs in reverse): a heap left frozen (:func:`_collect`) is freed by the interpreter's exit,
            # not reported as leaked native objects.
            atexit.register(gc.unfreeze)
            atexit.register(shutdown_all)
            _ATEXIT = True
        return llm


#: Times an engine start is tried again after its port was taken between vLLM's check and its listen
#: (EADDRINUSE from torch.distributed's store): 16 BERT-base replicas as Ray actors on one four-H100 node failed so
#: once in two starts, with each replica searching for free ports from its own ``VLLM_PORT``.
PORT_RETRIES = 2
#: How far each retry moves ``VLLM_PORT`` (within the 100 ports a replica's range spans: replicas.pool).
PORT_STEP = 37


def _start_llm(model: str, kwargs: dict[str, Any], hide: list[str]) -> Any:
    """``vllm.LLM(model=model, **kwargs)`` with ``hide``'s modules hidden, tried again (``VLLM_PORT`` moved by
    :data:`PORT_STEP` where it is set) when the start lost a port race.

    Raises:
        EngineError: vLLM failed to build the engine (its reason in the message).
    """
    from vllm import LLM

    attempt = 0
    while True:
        try:
            with modules_hidden(hide):
                return LLM(model=model, **kwargs)
        except Exception as exc:  # vLLM raises many types; the user needs the model and the reason
            _RELEASED_ON_GPU[0] |= _cuda_initialized()  # a start that failed after loading weights leaves them too
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if attempt >= PORT_RETRIES or "EADDRINUSE" not in reason:
                raise EngineError(f"vLLM could not start an engine for {model!r}: {reason}") from exc
        attempt += 1
        if os.environ.get("VLLM_PORT", "").isdigit():
            os.environ["VLLM_PORT"] = str(int(os.environ["VLLM_PORT"]) + PORT_STEP)
        logger.warning("engine start for %s lost a port race (EADDRINUSE): trying again", model)


def _in_process(llm) -> bool:
    """Whether ``llm``'s engine core runs in this process (vLLM's ``InprocClient``)."""
    return type(getattr(llm.llm_engine, "engine_core", None)).__name__ == "InprocClient"


@contextmanager
def _distributed_state_kept() -> Iterator[None]:
    """Inside the block, vLLM's engine-core shutdown leaves this process's distributed state alone.

    An in-process engine core tears down the process's model-parallel groups when it shuts down
    (``EngineCore.shutdown`` → ``cleanup_dist_env_and_memory``); another in-process engine of this
    process still uses them and would fail its next step ("pipeline model parallel group is not
    initialized"). Memory is collected afterwards (:func:`_collect`).
    """
    from vllm.v1.engine import core

    original = getattr(core, "cleanup_dist_env_and_memory", None)
    if original is None:  # another vLLM layout: nothing to keep
        yield
        return
    core.cleanup_dist_env_and_memory = lambda *args, **kwargs: None
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = original


@contextmanager
def _collections_deferred() -> Iterator[None]:
    """Inside the block, ``gc.collect()`` does nothing: the caller collects once afterwards (:func:`_collect`).

    An in-process engine core's shutdown unfreezes the heap (vLLM's ``EngineCore`` freezes it when it starts) and
    then collects twice (its model runner's cleanup, ``cleanup_dist_env_and_memory``), each a walk over every object
    of the process: 0.5 s each with MiniLM's CPU engine and mteb loaded (~1.0 M objects), more in a bigger process.
    One collection afterwards (:func:`_collect`) frees the same.
    """
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect


def _shutdown(llm) -> None:
    """Shut ``llm`` down (already out of the engine table); other in-process engines keep working."""
    unwatch(llm)
    keep = _in_process(llm) and any(_in_process(entry.llm) for entry in _ENGINES.values())
    try:
        with _distributed_state_kept() if keep else contextlib.nullcontext(), _collections_deferred():
            llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # shutdown must never mask the caller's own error
        logger.warning("vLLM engine shutdown raised %s: %s", type(exc).__name__, exc)


def release_engine(llm) -> None:
    """Drop one use of ``llm``; the last use shuts the engine down. Unknown engines are ignored."""
    with _LOCK:
        for key, entry in list(_ENGINES.items()):
            if entry.llm is llm:
                entry.refs -= 1
                if entry.refs <= 0:
                    del _ENGINES[key]
                    frozen = gc.get_freeze_count() > 0
                    _RELEASED_ON_GPU[0] |= _in_process(llm) and _cuda_initialized()
                    _shutdown(llm)
                    _collect(refreeze=frozen)
                return


def reload_engine(llm: Any, model: str) -> bool:
    """Load ``model``'s weights into ``llm`` in place (vLLM's ``reload_weights`` on every worker), when this is
    the engine's only user: the engine then serves ``model`` (:func:`acquire_engine` of ``model`` with the same
    options returns it). ``model``: a local folder of a checkpoint of the same architecture and shapes as the
    engine's (the caller checks that: :func:`vllm_eval.models.handoff.reuse_key`).

    Why: a sweep of checkpoints of one training run needs one engine, not one per checkpoint: all-MiniLM-L6-v2's
    weights went in in 0.10 s on this 2-core CPU against 2.7 s for a fresh engine (imports already done), and the
    embeddings were equal to the fresh engine's bit for bit.

    Returns:
        False, leaving the engine as it is, when another caller shares it or it is not one of ours.

    Raises:
        EngineError: vLLM failed to load the weights (the engine is shut down: its weights are a mix).
    """
    with _LOCK:  # out of the table while it loads: nobody acquires an engine of either model meanwhile
        found = [(key, entry) for key, entry in _ENGINES.items() if entry.llm is llm]
        if not found or found[0][1].refs != 1:
            return False
        key, entry = found[0]
        del _ENGINES[key]
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": model, "is_checkpoint_format": True})
        if hasattr(llm, "reset_prefix_cache"):  # a generator's cached prefixes hold the old weights' keys
            llm.reset_prefix_cache()
    except Exception as exc:  # vLLM raises many types; the user needs the model and the reason
        _shutdown(llm)
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EngineError(f"vLLM could not load the weights of {model!r} into the running engine: {reason}") from exc
    with _LOCK:
        _ENGINES[json.dumps({**json.loads(key), "model": model}, sort_keys=True)] = entry
    return True


#: Whether an engine whose core ran in this process on a GPU was released since the last collection.
_RELEASED_ON_GPU = [False]


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def collect_released_on_gpu() -> None:
    """Before a GPU engine is built, here or in replicas of this process: collect what engines released in this
    process left once their callers let go (nothing to do, and nothing done, when none was released on a GPU).

    Why: the collection at release runs while the caller still holds the ``LLM``, and vLLM 0.26's in-process engine
    keeps its weights in reference cycles: measured on an H200 with an 8B (``scripts/engine_release_check.py``), 15.1
    GiB stayed allocated after the caller dropped the ``LLM`` until a ``gc.collect()``; a second engine started
    beside them ran out of memory, as vLLM counted them as its own (and its start freezes the heap, so they would
    never be collected). Replicas on that GPU count them too: `bench --data-parallel-size 1 2` of the 8B on two
    H100s had the second layout's replica 0 refused (62.77 of 79.18 GiB free, 0.92 asked) while the first layout's
    in-process engine's weights were still held."""
    if _RELEASED_ON_GPU[0]:
        _RELEASED_ON_GPU[0] = False
        _collect(refreeze=False)


def live_engines() -> int:
    """How many engines are running in this process (for tests and diagnostics)."""
    return len(_ENGINES)


def shutdown_all() -> None:
    """Shut down every engine this process started (registered with ``atexit``)."""
    with _LOCK:
        entries = list(_ENGINES.values())
        _ENGINES.clear()
    _RELEASED_ON_GPU[0] |= _cuda_initialized() and any(_in_process(entry.llm) for entry in entries)
    for entry in entries:
        _shutdown(entry.llm)
    _collect(refreeze=False)


def _collect(refreeze: bool) -> None:
    """Collect what shut-down engines left (the one collection :func:`_collections_deferred` leaves); give the GPU
    memory it freed back to the device (vLLM's own ``empty_cache`` ran before it); and, in a process that uses no
    GPU, freeze the heap again if ``refreeze`` (an in-process engine core had frozen it: vLLM's ``EngineCore``
    calls ``gc.freeze()`` when it starts and ``gc.unfreeze()`` when it shuts down).

    Why freeze: unfrozen, every full collection walks every object of the process, 0.51 s against 0.00 s frozen
    with MiniLM's CPU engine and mteb loaded (~1.0 M objects), more in a bigger process, and vLLM's next engine start
    makes one. Six engine-heavy test modules took 222.5 s as vLLM leaves it, 211.0 s with the one collection, 186.6 s
    with the heap frozen again. The cost: what the released engine's caller still holds (the ``LLM`` object, its
    tokenizer; vLLM has dropped the KV cache) and drops later is freed at the next engine shutdown that unfreezes, or
    at exit, not at once. Never with a GPU in use: there that would be device memory the next engine needs."""
    gc.collect()
    if _cuda_initialized():
        sys.modules["torch"].cuda.empty_cache()
    elif refreeze:
        gc.freeze()
