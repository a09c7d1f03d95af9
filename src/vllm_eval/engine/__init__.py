"""The engine layer: build, share and shut down vLLM engines (:mod:`.build`), their options (:mod:`.args`), the jobs
run on one (:mod:`.jobs`, :mod:`.pipeline`, :mod:`.outputs`) and the process environment vLLM reads
(:mod:`.procenv`). The old ``vllm_eval.engine`` module's names are exported here, imported on first use."""

from __future__ import annotations

from ..utils.lazy import lazy_exports

_LAZY = {name: "build" for name in ("acquire_engine", "release_engine", "live_engines", "shutdown_all")}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
