"""Encoders (mteb ``EncoderProtocol``): the base and one module per backend.

``base`` (:class:`EncoderBase`), ``vllm`` (:class:`VllmEncoder`), ``st``
(:class:`SentenceTransformerEncoder`), ``remote`` (:class:`RemoteEncoder`).
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports

_LAZY = {"EncoderBase": "base", "VllmEncoder": "vllm", "SentenceTransformerEncoder": "st", "RemoteEncoder": "remote"}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
