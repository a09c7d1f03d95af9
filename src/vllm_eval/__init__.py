"""vllm-eval: evaluate embedding models, rerankers and generative models with vLLM as the engine."""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "VllmEncoder": "encoder",
    "SentenceTransformerEncoder": "st_backend",
    "VllmCrossEncoder": "reranker",
    "SentenceTransformerCrossEncoder": "reranker",
    "VllmGenerator": "generator",
    "register_model": "registry",
    "ScoreTemplate": "registry",
}
__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    # Lazy: `import vllm_eval` must not import vLLM/torch (the CLI's `tasks` and `--help` stay fast).
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'vllm_eval' has no attribute {name!r}")
