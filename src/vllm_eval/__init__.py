"""vllm-eval: evaluate embedding models, rerankers and generative models with vLLM as the engine."""

from __future__ import annotations

from ._lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "VllmEncoder": "encoder.vllm",
    "SentenceTransformerEncoder": "encoder.st",
    "RemoteEncoder": "encoder.remote",
    "VllmReranker": "reranker.vllm",
    "SentenceTransformerReranker": "reranker.st",
    "RemoteReranker": "reranker.remote",
    "VllmGenerator": "generator.vllm",
    "RemoteGenerator": "generator.remote",
    "HttpOptions": "http",
    "load_backend": "backends",
    "register_preset": "presets",
    "ModelPreset": "presets",
    "ScoreTemplate": "presets",
    "VllmEvalError": "errors",
}
__all__ = [*_LAZY, "__version__"]
# Lazy: `import vllm_eval` must not import vLLM or torch (the CLI's `tasks` and `--help` stay fast).
__getattr__ = lazy_exports(__name__, _LAZY)
