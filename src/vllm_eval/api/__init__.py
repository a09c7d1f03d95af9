"""The library API: one function per command, which the CLI's commands call.

``vllm_eval.evaluate`` (``vllm-eval run``) evaluates an embedding model on mteb tasks with everything the command
does: task selection, the output cache and resume, replicas or Ray, task processes, the timeline, mteb's result
JSON and ``summary.json``. ``vllm_eval.compare`` (``vllm-eval compare``) runs one model under several
configurations against its kind's reference and returns the comparison; ``vllm_eval.bench`` (``vllm-eval bench``)
measures the encoder backends' throughput and latency, or their time to result on a whole suite. Their options
keep the flags' names (``--max-num-seqs`` is ``max_num_seqs=``).
"""

from __future__ import annotations

from ..utils.lazy import lazy_exports

_LAZY = {"evaluate": "evaluate", "EvaluationResult": "evaluate", "compare": "compare", "bench": "bench"}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
