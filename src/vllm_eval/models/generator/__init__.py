"""Generators (chat LLMs and VLMs): the base and one module per backend.

``base`` (:class:`GeneratorBase`, :class:`Generation`, sampling defaults), ``vllm``
(:class:`VllmGenerator`), ``remote`` (:class:`RemoteGenerator`).
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports

_LAZY = {
    "GeneratorBase": "base",
    "Generation": "base",
    "DEFAULT_SAMPLING": "base",
    "sampling_params": "base",
    "to_pil": "base",
    "VllmGenerator": "vllm",
    "RemoteGenerator": "remote",
}
__all__ = list(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
