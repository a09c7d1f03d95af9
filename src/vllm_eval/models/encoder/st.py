"""The reference encoder: sentence-transformers behind the same interface (``--backend st``).

Prompts, instructions, input checks, chunking, truncation reports and metadata are the ones of
:class:`~vllm_eval.models.encoder.base.EncoderBase`; only the model call differs. Parity tests compare
this backend with :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import torch_dtype_name
from ..images import ImageInput
from ..prompts import InstructionTemplate, resolve_prompting
from ..streaming import BatchTokenizer
from .base import EncoderBase


class SentenceTransformerEncoder(EncoderBase):
    """mteb ``EncoderProtocol`` over ``sentence_transformers.SentenceTransformer``.

    Args:
        model: local model directory or hub id; defaults to the packaged all-MiniLM-L6-v2.
        revision: hub revision.
        device: torch device (``"cpu"``, ``"cuda"``); None lets sentence-transformers choose.
        dtype: ``float32`` (default, the parity reference), ``float16``, ``bfloat16`` or ``auto``.
        max_model_len: token limit (sentence-transformers' ``max_seq_length``); None keeps the model's.
        batch_size: sentence-transformers batch size.
        dimensions: matryoshka width (sentence-transformers' ``truncate_dim``).
        normalize: force L2 normalisation; None follows the model's modules (a CLIP-style model: raw projections).
            A CLIP-style model (sentence-transformers lists its modalities as text and image, nothing combined)
            embeds an image with its text as the sum of the two vectors, as the vLLM backend does (see
            :meth:`~vllm_eval.models.encoder.base.EncoderBase.encode`); sentence-transformers itself refuses it.
        trust_remote_code: allow the model repository's own code (default False).
        preset, model_name, prompts, instruction_template, instructions,
        apply_instruction_to_documents, chunk_size, show_progress_bar: as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`.

    Raises:
        UsageError: an unknown dtype, a bad ``dimensions``, an unknown preset.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef | None = None,
        revision: str | None = None,
        *,
        preset: Any = None,
        model_name: str | None = None,
        prompts: dict[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        dimensions: int | None = None,
        normalize: bool | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        batch_size: int = 32,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        torch_dtype = torch_dtype_name(dtype, allow_auto=True)
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise UsageError(f"dimensions must be a positive int, got {dimensions!r}")
        ref = ModelRef.resolve(model, revision)
        prompting, self.preset = resolve_prompting(
            ref.path,
            "encoder",
            preset=preset,
            prompts=prompts,
            instruction_template=instruction_template,
            instructions=instructions,
            apply_instruction_to_documents=apply_instruction_to_documents,
        )
        self.st = SentenceTransformer(
            ref.path,
            revision=revision,
            device=device,
            trust_remote_code=trust_remote_code,
            truncate_dim=dimensions,
            model_kwargs={"torch_dtype": torch_dtype},
        )
        if max_model_len is not None:
            self.st.max_seq_length = int(max_model_len)
        max_length = int(self.st.max_seq_length or getattr(self.st.tokenizer, "model_max_length", 0) or 512)
        takes_images = "image" in self.st.modalities  # CLIP-style: text and image towers
        # Text and image apart, nothing combined (sentence-transformers refuses a fused input then): two towers
        # into one space, so a fused input is the sum of its two vectors, as mteb's CLIP wrapper computes it.
        self.sums_fused = set(self.st.modalities) == {"text", "image"}
        self.dtype = torch_dtype
        self.normalize = normalize
        self.batch_size = batch_size
        lower = bool(getattr(self.st[0], "do_lower_case", False))
        meta = build_model_meta(
            ref,
            revision=revision,
            model_name=model_name,
            embed_dim=dimensions,
            max_model_len=max_length,
            framework=["Sentence Transformers", "PyTorch"],
            use_instructions=prompting.instruction_template is not None,
            modalities=["text", "image"] if takes_images else None,
        )
        self.dimensions = dimensions
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            tokenizer=BatchTokenizer(self.st.tokenizer, max_length, lower),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus dtype, device, ``dimensions`` and normalisation."""
        return {
            **super().identity(),
            "dtype": self.dtype,
            "device": str(self.st.device),
            "dimensions": self.dimensions,
            "normalize": self.normalize,
        }

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        del ids  # sentence-transformers tokenizes itself; ids only served the truncation count
        emb = self.st.encode(
            [x.image if isinstance(x, ImageInput) else x for x in texts],  # PIL images: its image modality
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
            normalize_embeddings=bool(self.normalize),
        )
        return np.asarray(emb, dtype=np.float32)

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.st = None
