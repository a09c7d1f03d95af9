"""Rerankers (mteb ``CrossEncoderProtocol``): the base and one module per backend.

``base`` (:class:`RerankerBase`, :func:`reranker_mode`), ``vllm`` (:class:`VllmReranker`), ``st``
(:class:`SentenceTransformerReranker`), ``remote`` (:class:`RemoteReranker`).
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports

_LAZY = {
    "RerankerBase": "base",
    "reranker_mode": "base",
    "VllmReranker": "vllm",
    "SentenceTransformerReranker": "st",
    "RemoteReranker": "remote",
}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
