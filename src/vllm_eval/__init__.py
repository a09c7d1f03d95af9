"""vllm-eval: evaluate embedding models, rerankers and generative models with vLLM as the engine."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["VllmEncoder", "SentenceTransformerEncoder", "__version__"]


def __getattr__(name: str):
    # Lazy: `import vllm_eval` must not import vLLM/torch (the CLI's `tasks` and `--help` stay fast).
    if name == "VllmEncoder":
        from .encoder import VllmEncoder

        return VllmEncoder
    if name == "SentenceTransformerEncoder":
        from .st_backend import SentenceTransformerEncoder

        return SentenceTransformerEncoder
    raise AttributeError(f"module 'vllm_eval' has no attribute {name!r}")
