"""kaiko-eva's registered vLLM models (``alibaba/qwen2-5-vl-7b-instruct-vllm`` ...) as model presets.

eva registers each with its own ``VllmModel`` settings (``max_num_seqs``, ``enable_prefix_caching``,
``mm_processor_kwargs``, the image position); those are read from eva's installed source
(:func:`vllm_eval.utils.eva_source.registered_vllm_models`) when kaiko-eva is installed, and registered under eva's
names the first time one is asked for. ``tensor_parallel_size`` is taken only when ``VLLM_TENSOR_PARALLEL_SIZE`` is
set (eva's default of 1 or 4 stands in for a layout eva cannot choose; here the engine sizing chooses it). eva's
``VllmModel`` defaults ``gpu_memory_utilization`` 0.9 and ``max_model_len`` 32768 are not applied: they are engine
sizing, which this project does for every model. Its ``enforce_eager`` is, for eva's image tasks, by
:func:`vllm_eval.api.eva_tasks.eva_engine_default`.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any


def eva_presets() -> list[dict[str, Any]]:
    """eva's registered vLLM models as keyword arguments of :class:`~vllm_eval.models.presets.ModelPreset`
    (``kind`` ``multimodal`` or ``language``); [] without kaiko-eva."""
    if importlib.util.find_spec("eva") is None:
        return []
    from ..utils.eva_source import eva_root, registered_vllm_models

    out = []
    for kind in ("multimodal", "language"):
        for path in sorted((eva_root() / kind / "models" / "networks").glob("*.py")):
            relative = path.relative_to(eva_root()).as_posix()
            for name, kw in registered_vllm_models(relative).items():
                engine = dict(kw.get("model_kwargs") or {})
                if "VLLM_TENSOR_PARALLEL_SIZE" not in os.environ:
                    engine.pop("tensor_parallel_size", None)
                position = "before" if kw.get("image_position") == "before_text" else "after"
                out.append(
                    {
                        "name": name,
                        "kind": kind,
                        "model": str(kw.get("model_name_or_path", "")),
                        "engine_kwargs": engine,
                        "image_position": position,
                        "description": f"kaiko-eva's registered vLLM model ({relative})",
                    }
                )
    return out
