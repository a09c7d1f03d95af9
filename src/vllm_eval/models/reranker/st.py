"""The reference reranker: ``sentence_transformers.CrossEncoder.predict`` behind the same interface."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.modelinfo import ModelRef, build_model_meta
from ..prompts import resolve_prompting
from .base import RerankerBase


class SentenceTransformerReranker(RerankerBase):
    """Reference backend: ``sentence_transformers.CrossEncoder.predict`` (``--backend st``).

    Templates are not supported here (a Qwen3-style recipe has no sentence-transformers form);
    the reference for those is a direct transformers computation, see the tests.

    Args:
        model: local model directory or hub id of a sequence-classification reranker.
        revision: hub revision.
        prompts: static query/document prefixes.
        batch_size: sentence-transformers batch size.
        chunk_size, show_progress_bar, model_name, trust_remote_code: as for
            :class:`~vllm_eval.models.reranker.vllm.VllmReranker`.
        device: torch device; None lets sentence-transformers choose.
        max_model_len: token limit; None keeps the model's.

    Raises:
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"max_model_len", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        batch_size: int = 32,
        chunk_size: int = 512,
        show_progress_bar: bool = True,
        device: str | None = None,
        model_name: str | None = None,
        trust_remote_code: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        from sentence_transformers import CrossEncoder

        ref = ModelRef.resolve(model, revision)
        prompting, self.preset = resolve_prompting(ref.path, "reranker", prompts=prompts)
        self.ce = CrossEncoder(
            ref.path, revision=revision, device=device, trust_remote_code=trust_remote_code, max_length=max_model_len
        )
        self.batch_size = batch_size
        self.dtype = str(self.ce.model.dtype)
        max_length = int(self.ce.max_seq_length)
        meta = build_model_meta(
            ref,
            revision=revision,
            model_name=model_name,
            max_model_len=max_length,
            framework=["Sentence Transformers", "PyTorch"],
            cross_encoder=True,
        )
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=meta,
            prompting=prompting,
            mode="cross-encoder",
            max_length=max_length,
            tokenizer=self.ce.tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the torch device and dtype."""
        return {**super().identity(), "device": str(self.ce.model.device), "dtype": str(self.ce.model.dtype)}

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:
        scores = self.ce.predict(
            list(zip(queries, documents, strict=True)),
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        return np.asarray(scores, dtype=np.float32).reshape(-1)

    def close(self) -> None:
        """Drop the model. Idempotent."""
        self.ce = None
