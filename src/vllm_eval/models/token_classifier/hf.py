"""The reference token classifier: transformers ``AutoModelForTokenClassification`` plus softmax (``--backend hf``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import load_torch_model, model_token_limit, torch_dtype_name
from ..classifier.base import labels_of
from ..prompts import PromptResolver
from .base import TokenClassifierBase


class TransformersTokenClassifier(TokenClassifierBase):
    """``AutoModelForTokenClassification`` behind the token-classifier interface: the parity reference.

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        device: torch device; None: CUDA when available, else CPU.
        dtype: ``float32`` (default), ``float16`` or ``bfloat16``.
        max_model_len: token limit; None: the model's ``max_position_embeddings`` (as vLLM).
        chunk_size, show_progress_bar, model_name, trust_remote_code: as for
            :class:`~vllm_eval.models.token_classifier.vllm.VllmTokenClassifier`.

    Raises:
        UsageError: an unknown dtype; a config without labels.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        from transformers import AutoModelForTokenClassification

        ref = ModelRef.resolve(model, revision)
        self.dtype = torch_dtype_name(dtype)
        self.lm, tokenizer, self.device = load_torch_model(
            AutoModelForTokenClassification,
            ref,
            revision=revision,
            dtype=self.dtype,
            device=device,
            trust_remote_code=trust_remote_code,
        )
        config = self.lm.config
        max_length = model_token_limit(config, tokenizer, max_model_len)
        super().__init__(
            model=ref.path,
            model_ref=ref,
            labels=labels_of(config.to_dict()),
            meta=build_model_meta(
                ref, revision=revision, model_name=model_name, max_model_len=max_length, cross_encoder=True
            ),
            prompting=PromptResolver(),
            max_length=max_length,
            tokenizer=tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype and device."""
        return {**super().identity(), "dtype": self.dtype, "device": self.device}

    def _token_probs(self, ids: list[list[int]]) -> list[np.ndarray]:
        import torch

        out = []
        for row in ids:  # one sequence per pass: no padding, so nothing to mask
            x = torch.tensor([row], device=self.device)
            with torch.inference_mode():
                logits = self.lm(input_ids=x).logits[0].float()
            out.append(torch.softmax(logits, dim=-1).cpu().numpy())
        return out

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.lm = None
        super().close()
