"""The reference token embedder: a direct transformers computation of ColBERT's vectors (``--backend hf``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import load_torch_model, model_token_limit, torch_dtype_name
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from .base import TokenEmbedderBase


def _projection(directory: str) -> Any:
    """The bias-free ``linear.weight`` (dim, hidden) of an ``HF_ColBERT`` checkpoint, as a float32 tensor."""
    import torch
    from safetensors import safe_open

    for f in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                if key in ("linear.weight", "colbert_linear.weight"):
                    return fh.get_tensor(key).to(torch.float32)
    raise UsageError(
        f"{directory}: no linear.weight projection in its safetensors files; the hf reference computes the "
        "HF_ColBERT layout (a BERT encoder plus a linear projection)"
    )


class TransformersTokenEmbedder(TokenEmbedderBase):
    """``AutoModel`` hidden states -> ColBERT's linear projection -> L2 norm per token: the parity reference.

    Every token of the sequence (special tokens included, as vLLM's ``token_embed`` pooler keeps
    them) gets a vector; one sequence per forward pass, so nothing is padded or masked.

    Args:
        model: a local ``HF_ColBERT`` directory (BERT weights under ``bert.``, ``linear.weight``).
        revision: hub revision.
        device: torch device; None: CUDA when available, else CPU.
        dtype: ``float32`` (default), ``float16`` or ``bfloat16``.
        max_model_len: token limit; None: the model's ``max_position_embeddings``.
        prompts, store_dtype, score_batch_size, chunk_size, show_progress_bar, model_name,
            trust_remote_code: as for :class:`~vllm_eval.models.token_embedder.vllm.VllmTokenEmbedder`.

    Raises:
        UsageError: no projection weight in the checkpoint; an unknown dtype.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        store_dtype: str = "float32",
        score_batch_size: int = 1024,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        from transformers import AutoModel

        ref = ModelRef.resolve(model, revision)
        self.dtype = torch_dtype_name(dtype)
        projection = _projection(ref.path)
        self.lm, tokenizer, self.device = load_torch_model(
            AutoModel, ref, revision=revision, dtype=self.dtype, device=device, trust_remote_code=trust_remote_code
        )
        self.projection = projection.to(self.device)
        max_length = model_token_limit(self.lm.config, tokenizer, max_model_len)
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=build_model_meta(ref, revision=revision, model_name=model_name, max_model_len=max_length),
            prompting=PromptResolver(prompts=prompts),
            max_length=max_length,
            tokenizer=BatchTokenizer(tokenizer, max_length, bool(getattr(tokenizer, "do_lower_case", False))),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
            store_dtype=store_dtype,
            score_batch_size=score_batch_size,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype and device."""
        return {**super().identity(), "dtype": self.dtype, "device": self.device}

    def _embed_tokens_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        import torch

        out = []
        for row in ids:
            x = torch.tensor([row], device=self.device)
            with torch.inference_mode():
                hidden = self.lm(input_ids=x).last_hidden_state[0].float()
                vectors = torch.nn.functional.normalize(hidden @ self.projection.T, dim=-1)
            out.append(vectors.cpu().numpy())
        return out

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.lm = None
        super().close()
