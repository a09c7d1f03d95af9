"""The reference classifier: transformers ``AutoModelForSequenceClassification`` plus softmax (``--backend hf``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import load_torch_model, model_token_limit, torch_dtype_name
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from .base import ClassifierBase, labels_of


class TransformersClassifier(ClassifierBase):
    """``AutoModelForSequenceClassification`` behind the classifier interface: the parity reference.

    Texts are tokenized as vLLM's text path does (special tokens, truncated to the model's
    ``max_position_embeddings`` or ``max_model_len``), right-padded per batch; probabilities are
    the softmax of the logits (the sigmoid for one label), computed in float32.

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        device: torch device; None: CUDA when available, else CPU.
        dtype: ``float32`` (default), ``float16`` or ``bfloat16``.
        max_model_len: token limit; None: the model's ``max_position_embeddings`` (as vLLM).
        batch_size: texts per forward pass.
        use_activation, add_special_tokens, labels, chunk_size, show_progress_bar, model_name,
        trust_remote_code: as for
            :class:`~vllm_eval.models.classifier.vllm.VllmClassifier`.

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
        use_activation: bool = True,
        add_special_tokens: bool = True,
        labels: list[str] | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        batch_size: int = 32,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        from transformers import AutoModelForSequenceClassification

        ref = ModelRef.resolve(model, revision)
        self.dtype = torch_dtype_name(dtype)
        self.batch_size = batch_size
        self.lm, tokenizer, self.device = load_torch_model(
            AutoModelForSequenceClassification,
            ref,
            revision=revision,
            dtype=self.dtype,
            device=device,
            trust_remote_code=trust_remote_code,
        )
        config = self.lm.config
        max_length = model_token_limit(config, tokenizer, max_model_len)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        meta = build_model_meta(
            ref, revision=revision, model_name=model_name, max_model_len=max_length, cross_encoder=True
        )
        super().__init__(
            model=ref.path,
            model_ref=ref,
            labels=labels or labels_of(config.to_dict()),
            use_activation=use_activation,
            meta=meta,
            prompting=PromptResolver(),
            max_length=max_length,
            tokenizer=BatchTokenizer(tokenizer, max_length, add_special_tokens=add_special_tokens),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype and device."""
        return {**super().identity(), "dtype": self.dtype, "device": self.device}

    def _classify_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        import torch

        rows = []
        for lo in range(0, len(ids), self.batch_size):
            batch = ids[lo : lo + self.batch_size]
            width = max(map(len, batch))
            x = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, row in enumerate(batch):
                x[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
            with torch.inference_mode():
                logits = self.lm(input_ids=x.to(self.device), attention_mask=mask.to(self.device)).logits.float()
            if self.use_activation:
                logits = torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)
            rows.append(logits.cpu().numpy())
        return np.concatenate(rows).astype(np.float32)

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.lm = None
        super().close()
