"""The reference for vision-language embedders: transformers' last hidden state at the last position (``--backend hf``).

vLLM runs a generative vision-language model as an embedder (E5-V, VLM2Vec, Qwen-VL embedders) through its
pooling runner: the last token's hidden state, L2-normalised. This backend computes the same thing directly
with transformers (the model's ``AutoModel`` base, its own processor expanding the image placeholder), one
input per forward pass, so ``vllm-eval compare --backends vllm hf`` checks such a model per task and per input.
Prompts are the same :class:`~vllm_eval.models.presets.ImagePrompts` as the vLLM backend's, with the same placeholder.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import load_torch_weights, torch_dtype_name
from ..images import ImageInput, prompted_inputs
from ..presets import ImagePrompts
from ..prompts import InstructionTemplate, resolve_prompting
from .base import EncoderBase


def vllm_image_placeholder(architectures: list[str]) -> str | None:
    """The image placeholder vLLM writes for one image of a model of these architectures (what the vLLM backend
    puts in prompts), read from vLLM's model class without starting an engine; None when vLLM does not say."""
    try:
        from vllm.model_executor.models import ModelRegistry

        for arch in architectures:
            cls = ModelRegistry._try_load_model_cls(arch)  # no public lookup without a ModelConfig
            if cls is not None and hasattr(cls, "get_placeholder_str"):
                return cls.get_placeholder_str("image", 1)
    except Exception:  # noqa: BLE001 - a registry without that lookup: the caller falls back to the processor's
        return None
    return None


class TransformersEncoder(EncoderBase):
    """mteb ``EncoderProtocol`` over transformers for vision-language embedders: the parity reference.

    Each input (a text, an image, or an image with its text) is formatted by ``image_prompts``, processed by
    the model's own processor (which expands the image placeholder into the image's tokens) and run alone
    through the model's ``AutoModel`` base; its vector is the last position's hidden state, L2-normalised
    (as vLLM's pooling runner does for a converted generative model) unless ``normalize=False``.

    Args:
        model: local model directory or hub id of a vision-language model (a processor with an image processor).
        revision: hub revision.
        preset, model_name, prompts, instruction_template, instructions, apply_instruction_to_documents,
            image_prompts, normalize, chunk_size, show_progress_bar, trust_remote_code: as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`.
        device: torch device; None: CUDA when available, else CPU.
        dtype: ``float32`` (default, the parity reference), ``float16`` or ``bfloat16``.
        max_model_len: recorded token limit (inputs are not truncated); None: the model's.

    Raises:
        UsageError: a model without an image processor (use ``--backend st`` for sentence-transformers
            models); an unknown dtype.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})
    tokenizes_locally: ClassVar[bool] = False

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        preset: Any = None,
        model_name: str | None = None,
        prompts: dict[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        image_prompts: ImagePrompts | dict[str, str] | None = None,
        normalize: bool | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        from transformers import AutoModel, AutoProcessor

        ref = ModelRef.resolve(model, revision)
        self.dtype = torch_dtype_name(dtype)
        self.processor = AutoProcessor.from_pretrained(ref.path, revision=revision, trust_remote_code=trust_remote_code)
        if getattr(self.processor, "image_processor", None) is None:
            raise UsageError(
                f"{ref.path}: the hf encoder is the reference for vision-language embedders (a processor with an "
                "image processor); for a sentence-transformers model use --backend st"
            )
        prompting, found = resolve_prompting(
            ref.path,
            "encoder",
            preset=preset,
            prompts=prompts,
            instruction_template=instruction_template,
            instructions=instructions,
            apply_instruction_to_documents=apply_instruction_to_documents,
        )
        self.preset = found
        self.image_prompts = ImagePrompts.resolve(image_prompts, found)
        self._placeholder = (
            vllm_image_placeholder(ref.architectures or []) or getattr(self.processor, "image_token", None) or "<image>"
        )
        self.normalize = normalize is not False
        self.lm, self.device = load_torch_weights(
            AutoModel, ref, revision=revision, dtype=self.dtype, device=device, trust_remote_code=trust_remote_code
        )
        text_config = getattr(self.lm.config, "text_config", self.lm.config)
        max_length = int(max_model_len or getattr(text_config, "max_position_embeddings", 0) or 0) or None
        meta = build_model_meta(
            ref, revision=revision, model_name=model_name, max_model_len=max_length, modalities=["text", "image"]
        )
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype, device, the image prompts and normalisation."""
        from dataclasses import asdict

        return {
            **super().identity(),
            "dtype": self.dtype,
            "device": self.device,
            "image_prompts": asdict(self.image_prompts),
            "normalize": self.normalize,
        }

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        return prompted_inputs(self.image_prompts, texts, images, self._placeholder)

    def _embed_chunk(self, texts: list[Any], ids: list[list[int]]) -> np.ndarray:
        import torch

        rows = []
        for x in texts:
            image = isinstance(x, ImageInput)
            enc = self.processor(
                text=x.prompt if image else x, images=[x.image] if image else None, return_tensors="pt"
            ).to(self.device)
            with torch.inference_mode():
                last = self.lm(**enc).last_hidden_state[0, -1].float()
            rows.append((torch.nn.functional.normalize(last, dim=-1) if self.normalize else last).cpu().numpy())
        return np.stack(rows).astype(np.float32, copy=False)

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.lm = None
        super().close()
