"""The library API: one function per command, which the CLI's commands call.

``evaluate`` (``vllm-eval run``) evaluates an embedding model on mteb tasks with everything the command does: task
selection, the output cache and resume, replicas or Ray, task processes, the timeline, mteb's result JSON and
``summary.json``. ``rerank`` retrieves then reranks; ``generate`` runs a chat LLM or VLM on multiple-choice tasks.
``classify``, ``reward`` and ``token_classify`` run the classifier kinds on labelled data; ``transcribe`` runs a
speech-to-text model on recordings. ``compare`` runs one
model under several configurations against its kind's reference; ``bench`` measures the encoder backends'
throughput, or their time to result on a whole suite. Options keep the flags' names (``--max-num-seqs`` is
``max_num_seqs=``).

The functions are bound here by name (a module of this package shares each one's name, as ``mteb.evaluate`` does);
none of these modules imports vLLM, torch or mteb until a function runs.
"""

from __future__ import annotations

from .bench import bench
from .classify import TaskResults, classify, reward, token_classify
from .compare import compare
from .evaluate import EvaluationResult, evaluate
from .generate import GenerationResult, generate
from .rerank import RerankResult, rerank
from .transcribe import transcribe

__all__ = [
    "EvaluationResult",
    "GenerationResult",
    "RerankResult",
    "TaskResults",
    "bench",
    "classify",
    "compare",
    "evaluate",
    "generate",
    "rerank",
    "reward",
    "token_classify",
    "transcribe",
]
