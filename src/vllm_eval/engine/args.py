"""vLLM engine options: their names, the values we can check before an engine starts, our platform
defaults, and how layers of options (a preset's, the user's) merge. Nothing here starts an engine.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from ..utils.errors import OptionError

#: KV-cache reserve on the CPU build when the user names neither ``gpu_memory_utilization`` nor
#: ``kv_cache_memory_bytes``. vLLM's default (0.92 of *total* RAM) fails on any shared machine;
#: pooling models need almost no KV cache and small decoders little.
CPU_KV_CACHE_BYTES = 2 * 1024**3


#: Machines with at most this many cores compute on all of them (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``).
SMALL_CPU_CORES = 4


#: EngineArgs names the commands list as flags of their own (typed there): known names, so checking them needs no
#: vLLM import (8 s on an H100 machine, which a parent of replicas never needs otherwise). ``head_dtype`` is
#: ours: it becomes ``hf_overrides["head_dtype"]``; so are ``stall_timeout`` and ``progress_timeout``
#: (:mod:`vllm_eval.engine.watchdog`).
LISTED_ENGINE_ARGS = frozenset(
    {
        "dtype",
        "head_dtype",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "seed",
        "hf_overrides",
        "pooler_config",
        "quantization",
        "kv_cache_dtype",
        "load_format",
        "enforce_eager",
        "enable_prefix_caching",
        "trust_remote_code",
        "io_processor_plugin",
        "stall_timeout",
        "progress_timeout",
    }
)
#: Engine options of ours, not ``EngineArgs`` fields (:func:`normalize_engine_kwargs` folds them away).
OWN_ENGINE_OPTIONS = frozenset({"head_dtype", "stall_timeout", "progress_timeout"})
#: The entry-point group vLLM loads IO-processor plugins from (``vllm.plugins.IO_PROCESSOR_PLUGINS_GROUP``).
IO_PROCESSOR_GROUP = "vllm.io_processor_plugins"


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
)
_BOOLS = ("enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_chunked_prefill")
#: Numeric engine options: name -> (types, rule, what the message says it must be).
_NUMBERS: dict[str, tuple[Any, Callable[[Any], bool], str]] = {
    "gpu_memory_utilization": (int | float, lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
    "stall_timeout": (int | float, lambda v: v >= 0, "a number of seconds >= 0 (0: no watchdog)"),
    "progress_timeout": (int | float, lambda v: v >= 0, "a number of seconds >= 0 (0: no progress watch)"),
    "seed": (int, lambda v: True, "an integer"),
}
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
    for name, (kinds, ok, what) in _NUMBERS.items():
        value = kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds) or not ok(value)):
            raise bad(name, value, what)
    for name in ("dtype", "head_dtype"):
        value = kwargs.get(name)
        if value is not None and value not in DTYPES:
            raise bad(name, value, f"one of {', '.join(DTYPES)}")
    overrides = kwargs.get("hf_overrides")
    if overrides is not None and not isinstance(overrides, dict):
        raise bad("hf_overrides", overrides, "a JSON object")
    if kwargs.get("io_processor_plugin") is not None:
        check_io_processor_plugin(kwargs["io_processor_plugin"])


def check_io_processor_plugin(name: Any) -> None:
    """Refuse, before an engine starts, an IO-processor plugin vLLM would not load: no entry point of that name in
    :data:`IO_PROCESSOR_GROUP`, one ``VLLM_PLUGINS`` leaves out, or one whose entry point fails to load, to give
    its processor's qualified name, or to resolve it (vLLM fails on each only once the engine is built, or, for a
    plugin that raises, logs a warning and then refuses it as "not installed").

    Raises:
        OptionError: naming the plugin and what is wrong with it.
    """
    import importlib
    import os
    from importlib.metadata import entry_points

    flag = "--io-processor-plugin"
    if not isinstance(name, str) or not name:
        raise OptionError(f"{flag} must be a plugin name, got {name!r}")
    found = {ep.name: ep for ep in entry_points(group=IO_PROCESSOR_GROUP)}
    if name not in found:
        names = ", ".join(sorted(found)) or "none"
        raise OptionError(f"{flag} {name!r}: no such plugin installed (entry points {IO_PROCESSOR_GROUP}: {names})")
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and name not in allowed.split(","):
        raise OptionError(f"{flag} {name!r}: left out by VLLM_PLUGINS={allowed!r}")
    try:
        qualname = found[name].load()()
        module, _, attr = str(qualname).rpartition(".")
        processor = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - whatever a user's plugin raises is named in one line
        raise OptionError(f"{flag} {name!r} is broken: {type(exc).__name__}: {exc}") from None
    if not isinstance(processor, type):
        raise OptionError(f"{flag} {name!r} is broken: {qualname!r} is not a class")


def normalize_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Fold our conveniences into vLLM's own options.

    ``head_dtype`` is not an ``EngineArgs`` field: vLLM reads it from the HF config, so it goes into
    ``hf_overrides["head_dtype"]``. ``stall_timeout`` and ``progress_timeout`` (ours too:
    :mod:`vllm_eval.engine.watchdog`) are left out. A ``pooler_config`` given as a dict becomes vLLM's ``PoolerConfig``.
    """
    out = dict(kwargs)
    out.pop("stall_timeout", None)  # the watchdog's (engine.watchdog), not vLLM's
    out.pop("progress_timeout", None)
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


def backend_engine_kwargs(
    runner: str,
    *layers: dict[str, Any] | None,
    convert: str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> dict[str, Any]:
    """The engine options a vLLM backend starts with: its ``runner`` (and ``convert``), ``trust_remote_code``,
    then ``layers`` merged in order (:func:`merge_engine_kwargs`: a preset's, the user's ...), then ``revision``.
    The one place every kind assembles them."""
    head: dict[str, Any] = {"runner": runner}
    if convert is not None:
        head["convert"] = convert
    head["trust_remote_code"] = trust_remote_code
    return {**head, **merge_engine_kwargs(*layers, {"revision": revision} if revision is not None else None)}


@functools.cache
def on_cpu() -> bool:
    """True when the installed vLLM is the CPU build.

    Read from the installed distribution (``vllm-cpu``, or a ``vllm`` whose version carries ``+cpu``, as
    vLLM's own CPU build names itself) when there is one, so that asking does not import vLLM: a parent of
    replicas never needs it (8 s of imports on an H100 machine). Otherwise vLLM's platform decides.
    """
    import importlib.metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name == "vllm-cpu" or "cpu" in version
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def default_engine_kwargs(user: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """Engine options we set when the user has not: safe offline defaults per platform.

    - ``trust_remote_code=False`` always (mteb's wrapper defaults to True; running a model
      repository's code must be asked for).
    - GPU, pooling runner: ``max_num_batched_tokens`` / ``max_num_seqs`` sized for ``model`` (a folder or a cached
      hub id) and the GPU (:func:`vllm_eval.engine.sizing.pooling_step`: BERT-base's 131,072 tokens a step, an 8B
      model's 32,768), ``gpu_memory_utilization`` of what was free before this process's engines (other programs'
      memory left out: :func:`vllm_eval.engine.sizing.first_gpu_memory`), leaving room for the command's own
      scoring on that GPU (:func:`vllm_eval.engine.sizing.memory_share`) unless ``gpu_memory_utilization`` or
      ``kv_cache_memory_bytes`` is given, ``enable_chunked_prefill=False`` where a step holds the longest prompt
      (vLLM 0.26 never finished a chunked prompt of exactly ``max_model_len`` tokens: docs/vllm-issues.md), and
      ``enforce_eager=True`` (no compile at start: faster to results end to end, measured on a whole benchmark).
    - GPU, generate runner (decoder-only models): ``max_num_batched_tokens``
      :data:`~vllm_eval.engine.sizing.GPU_GENERATE_MAX_NUM_BATCHED_TOKENS` and ``gpu_memory_utilization`` of vLLM's
      share of what was free before this process's engines, less the room a step's prompt log-probabilities take
      over the vocabulary, which vLLM's profile leaves out (:func:`vllm_eval.engine.sizing.prompt_logprob_reserve`),
      unless ``gpu_memory_utilization`` or ``kv_cache_memory_bytes`` is given.
    - CPU build: ``dtype="float32"`` (vLLM's ``auto`` picks float16 there for fp32 checkpoints,
      whose matmuls fall back from oneDNN to a slow path: the demo ran ~8x slower), ``enforce_eager=True``
      (engine start ~21 s instead of ~40 s, same throughput) and a fixed KV-cache reserve
      (:data:`CPU_KV_CACHE_BYTES`) unless ``gpu_memory_utilization`` or ``kv_cache_memory_bytes`` is given.

    (Weights that exceed an engine's share are refused when this process starts that engine:
    :func:`vllm_eval.engine.sizing.check_engine_fits`; options are also read where no engine starts, such as a
    parent of replicas recording them, after its replicas took their memory.)
    """
    out: dict[str, Any] = {"trust_remote_code": False}
    if user.get("runner") == "pooling" and not on_cpu():
        out.update(_gpu_pooling_defaults(user, model))
        # A first run compiles (a BERT-base's 4 replicas ready after 39 s on a fresh H200, 19 s with a warm cache,
        # 17 s eager) and gains nothing back: the whole MTEB(eng, v2) replica took 307 s compiled on a fresh
        # machine, 304 s with a warm cache, 274 s eager (docs/bench/h200-full-benchmark). --no-enforce-eager compiles.
        out["enforce_eager"] = True
    if user.get("runner") == "generate" and not on_cpu():
        out.update(_gpu_generate_defaults(user, model))
    if on_cpu():
        out["dtype"] = "float32"
        out["enforce_eager"] = True
        if "gpu_memory_utilization" not in user and "kv_cache_memory_bytes" not in user:
            out["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return out


def _gpu_pooling_defaults(user: dict[str, Any], model: str | None) -> dict[str, Any]:
    """A pooling engine's step and memory share on a GPU (see :func:`default_engine_kwargs`); the fixed maxima when
    the model's config or the GPU cannot be read."""
    from . import sizing

    out: dict[str, Any] = {}
    shape = sizing.model_shape(model, user) if model else None
    try:
        total = sizing.first_gpu_memory()[1]
    except Exception:  # no GPU to ask (options read where no engine runs): vLLM's own default share
        total = 0
    share = user.get("gpu_memory_utilization")
    if share is None and (share := sizing.engine_memory_share(user, model)) is not None:
        out["gpu_memory_utilization"] = share
    memory = int(float(share or sizing.GPU_MEMORY_SHARE) * total) or None
    max_len = sizing.longest_prompt(shape, user)
    out.update(sizing.pooling_step(shape, max_len, memory))
    budget = user.get("max_num_batched_tokens") or out["max_num_batched_tokens"]
    if "enable_chunked_prefill" not in user and max_len and budget >= max_len:
        # vLLM 0.26's scheduler never finishes a chunked prompt of exactly max_model_len tokens: it stops one token
        # short (docs/vllm-issues.md). Whole prompts per step, the budget holding the longest.
        out["enable_chunked_prefill"] = False
    return out


def _gpu_generate_defaults(user: dict[str, Any], model: str | None) -> dict[str, Any]:
    """A generation engine's step and memory share on a GPU (see :func:`default_engine_kwargs`): vLLM's own share
    where the model's config or the GPU cannot be read."""
    from . import sizing

    out: dict[str, Any] = {}
    if model and sizing.is_encoder_decoder(model, user.get("revision")):
        return (
            out  # speech-to-text: no prompt log-probabilities to make room for; vLLM's step, as its RTFx was measured
        )
    if "max_num_batched_tokens" not in user:
        out["max_num_batched_tokens"] = sizing.GPU_GENERATE_MAX_NUM_BATCHED_TOKENS
    share = sizing.engine_memory_share(user, model)  # None: the user's memory, or no GPU to ask (vLLM's share)
    if share is not None:
        out["gpu_memory_utilization"] = share
    return out


def effective_engine_kwargs(engine_kwargs: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The engine options in force: the user's (checked, normalized) over our platform defaults.

    This is what :func:`acquire_engine` builds engines with, and what results record as provenance.

    Raises:
        OptionError: an unknown option or a bad value.
    """
    check_engine_values(engine_kwargs)
    check_engine_kwargs(normalize_engine_kwargs(engine_kwargs))
    return engine_options_in_force(engine_kwargs, model)


def engine_options_in_force(engine_kwargs: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """:func:`effective_engine_kwargs` of options already checked (those an engine was built with), without
    checking their names again: that imports vLLM, which a parent of GPU replicas has no other use for (its
    first summary.json took 8 s on an H100 while four tasks waited for the GIL)."""
    engine_kwargs = normalize_engine_kwargs(engine_kwargs)
    return {**default_engine_kwargs(engine_kwargs, model), **engine_kwargs}
