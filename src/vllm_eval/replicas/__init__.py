"""Replicas: several engines of one model behind one start / run_split interface, as local processes
(:mod:`.process`, :mod:`.pool`, started ahead by :mod:`.ahead`) or Ray actors (:mod:`.ray`), both serving jobs
through :mod:`.jobpool`. The old ``vllm_eval.replicas`` module's names are exported here, imported on first use."""

from __future__ import annotations

from ..utils.lazy import lazy_exports

_LAZY = {
    name: "pool" for name in ("Placement", "ReplicaPool", "plan_replicas", "place_on_node", "pooling_kv_cache_bytes")
}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
