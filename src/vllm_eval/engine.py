"""The one place that builds, shares and shuts down vLLM engines.

Every backend (encoder, reranker, generator) asks :func:`acquire_engine` for a ``vllm.LLM``.
Engines are keyed by model and options, so two wrappers of the same model with the same options
share one engine, and an engine is shut down when its last user calls :func:`release_engine`
(or at interpreter exit). The explicit shutdown matters: without it the CPU build's engine-core
process is torn down mid-flight and the process aborts ("terminate called without an active
exception") with a non-zero exit code.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .errors import EngineError, OptionError, UsageError
from .modelinfo import ModelRef, resolve_model

__all__ = ["EngineError", "acquire_engine", "release_engine", "resolve_model"]

logger = logging.getLogger(__name__)

#: KV-cache reserve on the CPU build when the user names neither ``gpu_memory_utilization`` nor
#: ``kv_cache_memory_bytes``. vLLM's default (0.92 of *total* RAM) fails on any shared machine;
#: pooling models need almost no KV cache and small decoders little.
CPU_KV_CACHE_BYTES = 2 * 1024**3


#: Pooling defaults on GPU (vLLM's are 256 / 8192-16384, sized for generation). With them an H100
#: embedded 2x more tokens/s for BERT-base fp16 (253k -> 505k tok/s, ``vllm-eval bench``).
GPU_POOLING_MAX_NUM_SEQS = 1024
GPU_POOLING_MAX_NUM_BATCHED_TOKENS = 131072
#: Machines with at most this many cores compute on all of them (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``).
SMALL_CPU_CORES = 4


@lru_cache(maxsize=1)
def engine_arg_names() -> frozenset[str]:
    """Names of every ``vllm.EngineArgs`` field (the keywords ``vllm.LLM`` accepts)."""
    import dataclasses

    from vllm import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_"))


def check_engine_kwargs(kwargs: dict[str, Any]) -> None:
    """Reject keywords that are not vLLM engine options, suggesting the closest names.

    Raises:
        OptionError: naming each unknown keyword and up to three close ``EngineArgs`` names.
    """
    names = engine_arg_names()
    bad = [k for k in kwargs if k not in names]
    if bad:
        hints = []
        for k in bad:
            close = difflib.get_close_matches(k, sorted(names), n=3, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
        raise OptionError(f"unknown vLLM engine option(s): {', '.join(hints)}")


#: Engine options whose values can be checked before vLLM starts: name -> (kind, bounds).
_POSITIVE_INTS = (
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "kv_cache_memory_bytes",
    "max_logprobs",
    "swap_space",
)
_BOOLS = ("enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_chunked_prefill")
#: ``dtype`` values vLLM's ``ModelConfig`` accepts.
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def check_engine_values(kwargs: dict[str, Any]) -> None:
    """Check the values of the engine options whose type and range are known, before any engine starts.

    Raises:
        OptionError: naming the option, the value and what it must be.
    """

    def bad(name: str, value: Any, what: str) -> OptionError:
        return OptionError(f"--{name.replace('_', '-')} must be {what}, got {value!r}")

    for name in _POSITIVE_INTS:
        value = kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise bad(name, value, "a positive integer")
    for name in _BOOLS:
        value = kwargs.get(name)
        if value is not None and not isinstance(value, bool):
            raise bad(name, value, "true or false")
    util = kwargs.get("gpu_memory_utilization")
    if util is not None and (isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1):
        raise bad("gpu_memory_utilization", util, "a fraction in (0, 1]")
    seed = kwargs.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("seed", seed, "an integer")
    for name in ("dtype", "head_dtype"):
        value = kwargs.get(name)
        if value is not None and value not in DTYPES:
            raise bad(name, value, f"one of {', '.join(DTYPES)}")
    overrides = kwargs.get("hf_overrides")
    if overrides is not None and not isinstance(overrides, dict):
        raise bad("hf_overrides", overrides, "a JSON object")


def normalize_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Fold our conveniences into vLLM's own options.

    ``head_dtype`` is not an ``EngineArgs`` field: vLLM reads it from the HF config, so it goes into
    ``hf_overrides["head_dtype"]``. A ``pooler_config`` given as a dict becomes vLLM's ``PoolerConfig``.
    """
    out = dict(kwargs)
    head_dtype = out.pop("head_dtype", None)
    if head_dtype is not None:
        out["hf_overrides"] = {**(out.get("hf_overrides") or {}), "head_dtype": head_dtype}
    if isinstance(out.get("pooler_config"), dict):
        from vllm.config import PoolerConfig

        try:
            out["pooler_config"] = PoolerConfig(**out["pooler_config"])
        except TypeError as exc:
            raise OptionError(f"pooler_config: {exc}") from None
    return out


def merge_engine_kwargs(*layers: dict[str, Any] | None) -> dict[str, Any]:
    """Engine options from several layers (e.g. a preset's, then the user's), later layers winning.

    ``hf_overrides`` dicts are merged key by key rather than replaced, so a user's
    ``{"head_dtype": ...}`` keeps a preset's ``architectures`` override.
    """
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if key == "hf_overrides" and isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def on_cpu() -> bool:
    """True when the installed vLLM is the CPU build."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def default_engine_kwargs(user: dict[str, Any]) -> dict[str, Any]:
    """Engine options we set when the user has not: safe offline defaults per platform.

    - ``trust_remote_code=False`` always (mteb's wrapper defaults to True; running a model
      repository's code must be asked for).
    - GPU, pooling runner: ``max_num_seqs`` / ``max_num_batched_tokens`` raised to
      :data:`GPU_POOLING_MAX_NUM_SEQS` / :data:`GPU_POOLING_MAX_NUM_BATCHED_TOKENS`.
    - CPU build: ``dtype="float32"`` (vLLM's ``auto`` picks float16 there for fp32 checkpoints,
      whose matmuls fall back from oneDNN to a slow path: the demo ran ~8x slower), ``enforce_eager=True``
      (engine start ~21 s instead of ~40 s, same throughput) and a fixed KV-cache reserve
      (:data:`CPU_KV_CACHE_BYTES`) unless ``gpu_memory_utilization`` or ``kv_cache_memory_bytes`` is given.
    """
    out: dict[str, Any] = {"trust_remote_code": False}
    if user.get("runner") == "pooling" and not on_cpu():
        # Encoder-sized models on a GPU are bound by per-request overhead, not FLOPs: admit many
        # more sequences and tokens per step than vLLM's generation-oriented defaults.
        out["max_num_seqs"] = GPU_POOLING_MAX_NUM_SEQS
        out["max_num_batched_tokens"] = GPU_POOLING_MAX_NUM_BATCHED_TOKENS
    if on_cpu():
        out["dtype"] = "float32"
        out["enforce_eager"] = True
        if "gpu_memory_utilization" not in user and "kv_cache_memory_bytes" not in user:
            out["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return out


def effective_engine_kwargs(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The engine options in force: the user's (checked, normalized) over our platform defaults.

    This is what :func:`acquire_engine` builds engines with, and what results record as provenance.

    Raises:
        OptionError: an unknown option or a bad value.
    """
    check_engine_values(engine_kwargs)
    engine_kwargs = normalize_engine_kwargs(engine_kwargs)
    check_engine_kwargs(engine_kwargs)
    return {**default_engine_kwargs(engine_kwargs), **engine_kwargs}


@dataclass
class _Entry:
    llm: Any
    refs: int


#: Environment variables this module set (not the user): the bench unsets them to run mteb's
#: wrapper as its users get it.
ENV_SET_HERE: set[str] = set()


def _set_env_default(name: str, value: str) -> None:
    """Set a vLLM environment variable the user has not set, and remember that we did."""
    if name not in os.environ:
        os.environ[name] = value
        ENV_SET_HERE.add(name)


#: Modules that break vLLM's in-process kernel walk yet may be left out of ``sys.modules`` while an
#: engine starts: llvmlite's library wrapper (loaded with numba, which bm25s loads) answers ``vars()``
#: with a C function. Nothing in an engine's start uses it.
_HIDEABLE_PREFIXES = ("llvmlite.",)


def _modules_breaking_kernel_scan() -> list[str]:
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


def _choose_engine_core_process() -> list[str]:
    """CPU build: run vLLM's engine core in this process unless the user chose (``VLLM_ENABLE_V1_MULTIPROCESSING``).

    In-process, MiniLM's engine started in 6.7 s instead of 22.2 s on 2 cores (no second process
    re-importing vLLM and torch) and embedded as fast (13,871 vs 12,607 tok/s, fixed 130 tokens).
    Loaded modules that would break vLLM's in-process start (:func:`_modules_breaking_kernel_scan`)
    are returned when they may be hidden while the engine starts (:data:`_HIDEABLE_PREFIXES`);
    any other gives this engine its own process, as vLLM's default.

    Returns:
        Names of the modules to leave out of ``sys.modules`` while the engine starts.
    """
    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    if name in os.environ and name not in ENV_SET_HERE:
        return []
    culprits = _modules_breaking_kernel_scan()
    other = [m for m in culprits if not m.startswith(_HIDEABLE_PREFIXES)]
    if other:
        logger.debug("engine core in its own process: module %s would break vLLM's in-process start", other[0])
    os.environ[name] = "1" if other else "0"
    ENV_SET_HERE.add(name)
    _reread_vllm_env()
    return [] if other else culprits


@contextmanager
def _modules_hidden(names: list[str]) -> Iterator[None]:
    """Leave ``names`` out of ``sys.modules`` inside the block; the same module objects afterwards."""
    hidden = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _reread_vllm_env() -> None:
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
        _reread_vllm_env()
        yield
    finally:
        os.environ.update(saved)
        _reread_vllm_env()


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

    ``head_dtype`` and a dict ``pooler_config`` are accepted too (see :func:`normalize_engine_kwargs`).

    Raises:
        ModelNotFoundError: a model path that does not exist (see :func:`resolve_model`).
        OptionError: an option that is not a vLLM engine option.
        EngineError: vLLM failed to build the engine (its reason is in the message).
    """
    global _ATEXIT
    model = model.path if isinstance(model, ModelRef) else resolve_model(model)
    kwargs = effective_engine_kwargs(engine_kwargs)
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
            hide = _choose_engine_core_process()
            if (os.cpu_count() or 1) <= SMALL_CPU_CORES:
                # vLLM's CPU worker keeps one core for its scheduler and computes on the rest: on a
                # 2-core machine that is half the machine. The scheduler is idle while a pooling batch
                # runs, so compute on every core (measured here: 3,791 -> 6,971 tok/s, MiniLM fp32).
                _set_env_default("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        from vllm import LLM

        logger.info("starting a vLLM engine for %s", model)
        logger.debug("engine options: %s", kwargs)
        try:
            with _modules_hidden(hide):
                llm = LLM(model=model, **kwargs)
        except Exception as exc:  # vLLM raises many types; the user needs the model and the reason
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise EngineError(f"vLLM could not start an engine for {model!r}: {reason}") from exc
        _ENGINES[key] = _Entry(llm=llm, refs=1)
        if not _ATEXIT:
            atexit.register(shutdown_all)
            _ATEXIT = True
        return llm


def _in_process(llm) -> bool:
    """Whether ``llm``'s engine core runs in this process (vLLM's ``InprocClient``)."""
    return type(getattr(llm.llm_engine, "engine_core", None)).__name__ == "InprocClient"


@contextmanager
def _distributed_state_kept() -> Iterator[None]:
    """Inside the block, vLLM's engine-core shutdown leaves this process's distributed state alone.

    An in-process engine core tears down the process's model-parallel groups when it shuts down
    (``EngineCore.shutdown`` → ``cleanup_dist_env_and_memory``); another in-process engine of this
    process still uses them and would fail its next step ("pipeline model parallel group is not
    initialized"). Memory is still collected.
    """
    from vllm.v1.engine import core

    original = getattr(core, "cleanup_dist_env_and_memory", None)
    if original is None:  # another vLLM layout: nothing to keep
        yield
        return
    core.cleanup_dist_env_and_memory = lambda *args, **kwargs: gc.collect()
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = original


def _shutdown(llm) -> None:
    """Shut ``llm`` down (already out of the engine table); other in-process engines keep working."""
    keep = _in_process(llm) and any(_in_process(entry.llm) for entry in _ENGINES.values())
    try:
        with _distributed_state_kept() if keep else contextlib.nullcontext():
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
                    _shutdown(llm)
                    gc.collect()
                return


def live_engines() -> int:
    """How many engines are running in this process (for tests and diagnostics)."""
    return len(_ENGINES)


def shutdown_all() -> None:
    """Shut down every engine this process started (registered with ``atexit``)."""
    with _LOCK:
        entries = list(_ENGINES.values())
        _ENGINES.clear()
    for entry in entries:
        _shutdown(entry.llm)
    gc.collect()


class Resource:
    """Context-manager base: ``with X(...) as x:`` calls ``x.close()`` on exit."""

    def close(self) -> None:
        """Release what the object holds. Idempotent."""

    @contextmanager
    def closed_on_error(self) -> Iterator[None]:
        """Around the part of a constructor that acquires things: on any error, release them and re-raise."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EngineUser(Resource):
    """Base of the wrappers that hold one shared engine in ``self.llm`` (encoder, reranker, generator),
    or engine replicas in ``self.pool`` (:class:`~vllm_eval.replicas.ReplicaPool`)."""

    llm: Any = None
    pool: Any = None
    engine_kwargs: dict[str, Any]

    def _start_engines(
        self, ref: Any, setup: Callable[[Any], dict[str, Any]], data_parallel_size: int = 1, replicas_per_gpu: int = 1
    ) -> dict[str, Any]:
        """One shared engine in this process (:meth:`_start_engine`), or ``data_parallel_size`` ×
        ``replicas_per_gpu`` > 1 replicas in ``self.pool``; returns ``setup(llm)`` of the engine (of the
        first replica: ``setup`` must be a picklable module-level function returning picklable values,
        ``dtype`` and ``quantization`` among them, which are kept here).

        Raises:
            UsageError: a replica layout the machine cannot hold.
            ReplicaError: a replica failed to start.
            EngineError: the in-process engine failed to start.
        """
        if data_parallel_size * replicas_per_gpu <= 1:
            info = setup(self._start_engine(ref))
            self.dtype, self.quantization = info["dtype"], info["quantization"]
            return info
        from .replicas import ReplicaPool, plan_replicas

        placements = plan_replicas(
            data_parallel_size,
            replicas_per_gpu,
            tensor_parallel_size=self.engine_kwargs.get("tensor_parallel_size") or 1,
            engine_kwargs=self.engine_kwargs,
            model=ref.path,
        )
        self.pool = ReplicaPool(ref.path, self.engine_kwargs, placements, setup=setup)
        self._engine_start_s = self.pool.start_seconds
        info = self.pool.info
        self.dtype, self.quantization = info["dtype"], info["quantization"]
        return info

    def _start_engine(self, ref: Any) -> Any:
        """Acquire the shared engine for ``ref`` with ``self.engine_kwargs`` into ``self.llm``, and record
        the seconds waited (``_engine_start_s``, for telemetry) and the engine's ``dtype`` and
        ``quantization``. Raises what :func:`acquire_engine` raises."""
        started = time.perf_counter()
        self.llm = acquire_engine(ref, **self.engine_kwargs)
        self._engine_start_s = time.perf_counter() - started
        config = self.llm.model_config
        self.dtype, self.quantization = str(config.dtype), config.quantization
        return self.llm

    def engine_identity(self) -> dict[str, Any]:
        """What of the engine changes outputs, for the backend's identity: dtype, quantization, ``hf_overrides``."""
        return {
            "dtype": self.dtype,
            "quantization": self.quantization,
            "hf_overrides": self.engine_kwargs.get("hf_overrides"),
        }

    def close(self) -> None:
        """Stop the replicas, or release this wrapper's engine (shut down when no other wrapper shares
        it). Idempotent."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
        llm, self.llm = self.llm, None
        if llm is not None:
            release_engine(llm)


def first_request_error(outputs: list[Any]) -> tuple[int, str] | None:
    """``(index, vLLM's reason)`` of the first output that carries an error, or None."""
    for i, out in enumerate(outputs):
        error = getattr(out, "error", None)
        if error is not None:
            return i, str(getattr(error, "message", error))
    return None


@contextmanager
def refusals_as_usage_errors(what: str) -> Iterator[None]:
    """Turn vLLM's refusal of a request before it runs (``VLLMValidationError``: a prompt longer than
    ``max_model_len``, an out-of-vocabulary token ...) into a one-line :class:`UsageError` naming ``what``."""
    from vllm.exceptions import VLLMValidationError

    try:
        yield
    except VLLMValidationError as exc:
        raise UsageError(f"vLLM refused {what}: {' '.join(str(exc).split())}") from None


def raise_on_request_errors(outputs: list[Any], describe: Any) -> None:
    """Raise :class:`EngineError` for the first vLLM output that carries an error.

    ``describe(i)`` names input ``i`` in the message (e.g. its text), so the user sees which input
    failed and vLLM's reason, not an empty result.
    """
    failed = first_request_error(outputs)
    if failed is not None:
        raise EngineError(f"vLLM failed on {describe(failed[0])}: {failed[1]}")
