"""The BGE-M3 reference (``--backend hf``): transformers' encoder and the checkpoint's own heads, as FlagEmbedding.

FlagEmbedding's ``M3Embedder`` (``FlagEmbedding/inference/embedder/encoder_only/m3.py``) computes, from the
encoder's last hidden states ``h`` (n_tokens, hidden) of one text:

* dense: ``h[0]`` (CLS), L2-normalised;
* sparse: ``ReLU(sparse_linear(h))`` per token, each token id kept at its largest weight, CLS/EOS/PAD/UNK and
  weights <= 0 dropped (``_process_token_weights``);
* ColBERT: ``colbert_linear(h[1:])`` (every token but CLS), each vector L2-normalised.

:class:`BgeM3Reference` computes the three (one sequence per forward pass, nothing padded), and
:class:`TransformersBgeM3` is the sparse one as a sparse-encoder backend, or with ``bge_m3_weights`` BGE-M3's
"all" mode (:mod:`~vllm_eval.models.sparse_encoder.hybrid`: the same candidates and weighted sum as the vLLM
backend, every output from this one model).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import load_torch_model, model_token_limit, torch_dtype_name
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from .base import SparseEncoderBase, pack_row
from .hybrid import HybridSearch, check_weights
from .vllm import special_ids


class BgeM3Reference:
    """BGE-M3's three outputs from transformers' ``AutoModel`` and ``sparse_linear.pt`` / ``colbert_linear.pt``.

    Args:
        ref: the resolved model directory.
        dtype: a torch dtype name; device: torch device (None: CUDA when available, else CPU).

    Raises:
        UsageError: a head file missing.
    """

    def __init__(self, ref: ModelRef, *, dtype: str = "float32", device: str | None = None,
                 trust_remote_code: bool = False) -> None:  # fmt: skip
        import torch
        from transformers import AutoModel

        heads = {}
        for name in ("sparse_linear", "colbert_linear"):
            path = Path(ref.path) / f"{name}.pt"
            if not path.is_file():
                raise UsageError(f"{ref.path}: no {name}.pt (BGE-M3's {name.split('_')[0]} head)")
            heads[name] = torch.load(path, map_location="cpu", weights_only=True)
        self.lm, self.tokenizer, self.device = load_torch_model(
            AutoModel, ref, revision=ref.revision, dtype=dtype, device=device, trust_remote_code=trust_remote_code
        )
        hidden = self.lm.config.hidden_size
        self.sparse = torch.nn.Linear(hidden, 1).to(self.device, getattr(torch, dtype))
        self.sparse.load_state_dict(heads["sparse_linear"])
        width = heads["colbert_linear"]["weight"].shape[0]
        self.colbert = torch.nn.Linear(hidden, width).to(self.device, getattr(torch, dtype))
        self.colbert.load_state_dict(heads["colbert_linear"])
        self.special = special_ids(self.tokenizer)

    def outputs(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dense float32 (hidden,), token weights float32 (n_tokens,), ColBERT float32 (n_tokens - 1, dim))``
        of one token-id sequence (special tokens included, as tokenized)."""
        import torch

        with torch.inference_mode():
            h = self.lm(input_ids=torch.tensor([ids], device=self.device)).last_hidden_state[0].float()
            dense = torch.nn.functional.normalize(h[0], dim=-1)
            weights = torch.relu(self.sparse(h)).squeeze(-1)
            colbert = torch.nn.functional.normalize(self.colbert(h[1:]), dim=-1)
        return dense.cpu().numpy(), weights.cpu().numpy(), colbert.cpu().numpy()

    def sparse_row(self, ids: list[int], max_active_dims: int | None = None) -> np.ndarray:
        """FlagEmbedding's lexical weights of one sequence as a packed row (:func:`~.base.pack_row`)."""
        tokens = np.asarray(ids, dtype=np.int64)
        weights = self.outputs(ids)[1]
        kept = ~np.isin(tokens, np.asarray(self.special, dtype=np.int64))
        return pack_row(tokens[kept], weights[kept], max_active_dims)


class TransformersBgeM3(HybridSearch, SparseEncoderBase):
    """BGE-M3's lexical weights computed with transformers (:class:`BgeM3Reference`): the parity reference of
    :class:`~vllm_eval.models.sparse_encoder.vllm.VllmSparseEncoder` on a BGE-M3 model. Retrieval: mteb's own
    search over ``encode`` (sparse), or BGE-M3's "all" mode with ``bge_m3_weights``
    (:class:`~vllm_eval.models.sparse_encoder.hybrid.HybridSearch`).

    Args:
        model: a BGE-M3 directory (``XLMRobertaModel`` weights, ``sparse_linear.pt``, ``colbert_linear.pt``).
        bge_m3_weights: (w_dense, w_sparse, w_colbert) of "all" mode's weighted score; None: the sparse search.
        revision, device, dtype, max_model_len, prompts, max_active_dims, chunk_size, show_progress_bar,
            model_name, trust_remote_code: as for the other reference backends.

    Raises:
        UsageError: a head file missing; an unknown dtype; a bad ``max_active_dims`` or ``bge_m3_weights``.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})
    plain_search_by_mteb: ClassVar[bool] = True

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        max_active_dims: int | None = None,
        bge_m3_weights: Sequence[float] | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        self.bge_m3_weights = check_weights(bge_m3_weights)
        self.dtype = torch_dtype_name(dtype)
        self.m3 = BgeM3Reference(ref, dtype=self.dtype, device=device, trust_remote_code=trust_remote_code)
        tokenizer = self.m3.tokenizer
        # RoBERTa's positions start after the padding id: two fewer tokens than positions, as vLLM derives it.
        max_length = int(max_model_len or model_token_limit(self.m3.lm.config, tokenizer, None) - 2)
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=build_model_meta(ref, revision=revision, model_name=model_name, max_model_len=max_length),
            prompting=PromptResolver(prompts=prompts),
            max_length=max_length,
            tokenizer=BatchTokenizer(tokenizer, max_length, False),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
            vocab_size=int(self.m3.lm.config.vocab_size),
            max_active_dims=max_active_dims,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype and device."""
        return {**super().identity(), "dtype": self.dtype, "device": self.m3.device}

    def _sparse_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        return [self.m3.sparse_row(x, self.max_active_dims) for x in ids]

    def _hybrid_dense(self, texts: list[str]) -> np.ndarray:
        # Tokenized and truncated as the sparse output is (the same ids the vLLM engines get).
        outputs = [self.m3.outputs(x)[0] for x in self.tokenizer(texts)[0]] if texts else []
        return np.stack(outputs) if outputs else np.zeros((0, self.m3.lm.config.hidden_size), dtype=np.float32)

    def _hybrid_colbert(self, texts: list[str]) -> list[np.ndarray]:
        return [self.m3.outputs(x)[2] for x in self.tokenizer(texts)[0]] if texts else []

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.m3 = None
