"""The layout a command's vLLM backend runs: the user's layout flags, and on a GPU machine whatever they leave
out chosen for the model and the GPUs (:func:`vllm_eval.engine.sizing.default_layout`): every visible GPU used,
small pooling models several replicas per GPU, tensor parallelism only for a model one GPU cannot hold. The CPU
build and Ray clusters keep what is given (1 where nothing is).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..engine.args import on_cpu
from ..engine.sizing import (
    GPU_GENERATE_MAX_NUM_BATCHED_TOKENS,
    GPU_MEMORY_SHARE,
    FitCheck,
    Layout,
    ModelShape,
    default_layout,
    engine_memory_share,
    gpu_memory,
    longest_prompt,
    model_shape,
    pooling_step,
    visible_gpus,
)

__all__ = ["Layout", "resolve_layout"]

logger = logging.getLogger(__name__)


def resolve_layout(
    model: str | os.PathLike | None,
    engine_kwargs: dict[str, Any],
    data_parallel_size: int | None = None,
    replicas_per_gpu: int | None = None,
    ray_address: str | None = None,
) -> Layout:
    """The :class:`~vllm_eval.engine.sizing.Layout` of a vLLM backend of ``model`` with ``engine_kwargs`` (its
    ``runner`` and ``tensor_parallel_size``, dtype and quantisation for the weights' size).

    ``data_parallel_size`` / ``replicas_per_gpu`` None: not given. On the CPU build, with ``ray_address`` (Ray
    places the actors), or where no GPU can be counted, what is not given is 1, as it always was; on a GPU machine
    it is chosen (see the module doc); a model whose size cannot be read gets one replica per GPU.

    Raises:
        UsageError: the tensor-parallel size not given, and the model (weights, one longest sequence's KV cache, a
            step's activations) fits no power of two of the GPUs here at the memory share its engine gets; the
            message says what would make it fit (:func:`vllm_eval.engine.sizing.default_layout`).
    """
    tp = engine_kwargs.get("tensor_parallel_size")
    default = data_parallel_size is None and replicas_per_gpu is None
    given = Layout(data_parallel_size or 1, replicas_per_gpu or 1, tp or 1, chosen=default)
    if on_cpu():
        return Layout(given.data_parallel_size, given.replicas_per_gpu, given.tensor_parallel_size, default, False)
    if ray_address:
        return given
    try:
        gpus = visible_gpus()
        total = gpu_memory(gpus[0])[1] if gpus else 0
    except Exception as exc:  # no NVML, no torch CUDA: nothing to choose from
        logger.info("layout as given: the GPUs could not be counted (%s)", exc)
        return given
    if not gpus:
        return given
    shape = model_shape(model, engine_kwargs) if model is not None else None
    return default_layout(
        shape,
        len(gpus),
        total,
        pooling=engine_kwargs.get("runner") == "pooling",
        data_parallel_size=data_parallel_size,
        replicas_per_gpu=replicas_per_gpu,
        tensor_parallel_size=tp,
        fit=_fit_check(shape, model, engine_kwargs, total),
    )


def _fit_check(shape: ModelShape | None, model: Any, engine_kwargs: dict[str, Any], total: int) -> FitCheck | None:
    """What the layout checks the model against: the memory share its engine will get (the one sizing rule,
    :func:`~vllm_eval.engine.sizing.engine_memory_share`, else the user's), its longest prompt and step; None where
    the user sized the KV cache in bytes or nothing is known."""
    if shape is None or engine_kwargs.get("kv_cache_memory_bytes") is not None:
        return None
    share = engine_kwargs.get("gpu_memory_utilization")
    if share is None:
        share = engine_memory_share(engine_kwargs, str(model)) or GPU_MEMORY_SHARE
    max_len = longest_prompt(shape, engine_kwargs)
    step = engine_kwargs.get("max_num_batched_tokens")
    if step is None and engine_kwargs.get("runner") == "pooling":
        step = pooling_step(shape, max_len, int(float(share) * total))["max_num_batched_tokens"]
    quantized = bool(engine_kwargs.get("quantization"))
    return FitCheck(int(float(share) * total), max_len, int(step or GPU_GENERATE_MAX_NUM_BATCHED_TOKENS), quantized)
