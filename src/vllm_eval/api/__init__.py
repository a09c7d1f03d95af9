"""The library API: one function per command, which the CLI's commands call.

``vllm_eval.evaluate`` (``vllm-eval run``) evaluates an embedding model on mteb tasks with everything the command
does: task selection, the output cache and resume, replicas or Ray, task processes, the timeline, mteb's result
JSON and ``summary.json``. ``vllm_eval.rerank`` (``vllm-eval rerank``) evaluates a reranker in two stages (a
first stage retrieves, the reranker reorders each query's top-k); ``vllm_eval.generate`` (``vllm-eval generate``)
a generative model on multiple-choice tasks. Their options keep the flags' names (``--max-num-seqs`` is
``max_num_seqs=``).
"""

from __future__ import annotations

from ..utils.lazy import lazy_exports

_LAZY = {
    "evaluate": "evaluate",
    "EvaluationResult": "evaluate",
    "rerank": "rerank",
    "RerankResult": "rerank",
    "generate": "generate",
    "GenerationResult": "generate",
}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
