"""The reference sparse encoder: sentence-transformers' ``SparseEncoder`` (``--backend st``) for SPLADE models."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import torch_dtype_name
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from .base import SparseEncoderBase, pack_row, sparse_flavour


class SentenceTransformerSparseEncoder(SparseEncoderBase):
    """``sentence_transformers.SparseEncoder`` (``MLMTransformer`` + ``SpladePooling``) behind the sparse-encoder
    interface: its vectors, top-k'd by its own ``max_active_dims``, then kept as rows.

    Args:
        model: a sentence-transformers ``SparseEncoder`` directory (or hub id).
        revision: hub revision.
        device: torch device; None lets sentence-transformers choose.
        dtype: ``float32`` (default, the parity reference), ``float16`` or ``bfloat16``.
        max_model_len: token limit; None keeps the model's ``max_seq_length``.
        batch_size: sentence-transformers' batch size.
        prompts, max_active_dims, chunk_size, show_progress_bar, model_name, trust_remote_code: as for
            :class:`~vllm_eval.models.sparse_encoder.vllm.VllmSparseEncoder`.

    Raises:
        UsageError: an unknown dtype; a bad ``max_active_dims``; a BGE-M3 model (its sentence-transformers modules
            give the dense vector; its lexical weights' reference is ``--backend hf``).
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        max_active_dims: int | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        batch_size: int = 32,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        from sentence_transformers.sparse_encoder import SparseEncoder

        ref = ModelRef.resolve(model, revision)
        if sparse_flavour(ref) == "bge-m3":
            raise UsageError(
                f"{ref.path}: BGE-M3's lexical weights have no sentence-transformers reference (its modules give the "
                "dense vector); use --backend hf"
            )
        self.dtype = torch_dtype_name(dtype)
        self.st = SparseEncoder(ref.path, revision=revision, device=device, trust_remote_code=trust_remote_code,
                                model_kwargs={"torch_dtype": self.dtype})  # fmt: skip
        if max_model_len is not None:
            self.st.max_seq_length = int(max_model_len)
        max_length = int(self.st.max_seq_length or 512)
        self.batch_size = batch_size
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=build_model_meta(
                ref,
                revision=revision,
                model_name=model_name,
                max_model_len=max_length,
                framework=["Sentence Transformers", "PyTorch"],
            ),  # fmt: skip
            prompting=PromptResolver(prompts=prompts),
            max_length=max_length,
            tokenizer=BatchTokenizer(self.st.tokenizer, max_length, False),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
            vocab_size=int(ref.config["vocab_size"]),
            max_active_dims=max_active_dims,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype and device."""
        return {**super().identity(), "dtype": self.dtype, "device": str(self.st.device)}

    def _sparse_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        del ids  # sentence-transformers tokenizes itself; the ids served the truncation count
        out = self.st.encode(list(texts), batch_size=self.batch_size, show_progress_bar=False,
                             convert_to_sparse_tensor=True, max_active_dims=self.max_active_dims)  # fmt: skip
        coo = out.coalesce().cpu()
        rows, cols = coo.indices().numpy()
        values = coo.values().float().numpy()
        bounds = np.searchsorted(rows, np.arange(len(texts) + 1))
        return [pack_row(cols[lo:hi], values[lo:hi]) for lo, hi in zip(bounds, bounds[1:], strict=False)]

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.st = None
