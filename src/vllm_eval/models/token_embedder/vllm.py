"""``VllmTokenEmbedder``: multi-vector models through vLLM's ``token_embed`` pooling task: texts, and images for
late-interaction vision models (ColPali-style: ColModernVBERT, ColPali, ColQwen)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs
from ...engine.jobs import pooling_info, token_pooling_job
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..images import prompted_inputs
from ..presets import ImagePrompts, find_preset
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from ..vllm_backend import VllmBackend
from .base import TokenEmbedderBase

#: Config keys vLLM reads the ColBERT projection width from (``ColBERTMixin.get_colbert_dim_from_config``).
_COLBERT_WIDTH_KEYS = ("colbert_dim", "dim", "projection_dim")


def _colbert_width_overrides(config: dict[str, Any]) -> dict[str, Any] | None:
    """``hf_overrides`` that clear the projection width of a BERT-backbone ColBERT config, else None.

    vLLM 0.32's ``ColBERTModel`` (``HF_ColBERT``) builds its projection before
    ``nn.Module.__init__`` when the config names a width, and fails to start ("cannot assign module
    before Module.__init__() call"); with no width it takes it from the ``linear`` weight's shape,
    which is the same number. The user's own ``hf_overrides`` win over these.
    """
    if not {"HF_ColBERT", "ColBERTModel"} & set(config.get("architectures") or ()):
        return None
    present = [k for k in _COLBERT_WIDTH_KEYS if config.get(k) is not None]
    return {"hf_overrides": dict.fromkeys(present)} if present else None


class VllmTokenEmbedder(VllmBackend, TokenEmbedderBase):
    """Per-token vectors from ``LLM.encode(..., pooling_task="token_embed")`` (runner ``pooling``).

    Texts are tokenized here (special tokens added, truncated to ``max_model_len``, as vLLM's text
    path does) and sent as token ids; vLLM returns every token's projected, L2-normalised vector.

    A late-interaction vision model (vLLM's ``ColModernVBertForRetrieval``, ``ColPaliForRetrieval``,
    ``ColQwen3`` ...; ColPali: Faysse et al. 2024, arXiv:2407.01449) declares mteb's ``["text", "image"]``
    modalities: an image (a page, a photo) goes as a prompt with ``multi_modal_data`` and gives one vector per
    token of the prompt, its image tokens included, so a text query is scored against image documents by
    MaxSim. ``image_prompts`` (default: the preset matching the model, else ``ImagePrompts()``) formats
    every input; ``{image}`` becomes the model's image placeholder, or nothing for a model whose vLLM processor
    puts the image's tokens in front of the prompt itself (ColModernVBERT).

    Args:
        model: local model directory or hub id (``HF_ColBERT``, ``ColBERTModernBertModel`` ... or any
            model whose vLLM pooler offers ``token_embed``).
        revision: hub revision.
        prompts: query and document markers, ``{"query": "...", "document": "..."}``.
        store_dtype, score_batch_size: see :class:`~vllm_eval.models.token_embedder.base.TokenEmbedderBase`.
        image_prompts: a vision model's prompt per input kind (:class:`~vllm_eval.models.presets.ImagePrompts` or a
            dict of its fields); ignored for a text-only model.
        chunk_size, show_progress_bar, model_name, trust_remote_code: as for the other vLLM backends.
        data_parallel_size, replicas_per_gpu, ray_address: engine replicas, as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`; each chunk of texts is split over them.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len`` ...).

    Raises:
        UsageError: the model has no ``token_embed`` pooler in vLLM; more replicas than GPUs or cores.
        ReplicaError: a replica failed to start.
        OptionError: unknown engine options.
        EngineError: vLLM failed to start.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        image_prompts: ImagePrompts | dict[str, str] | None = None,
        store_dtype: str = "float32",
        score_batch_size: int = 1024,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        self.engine_kwargs = backend_engine_kwargs(
            "pooling",
            _colbert_width_overrides(ref.config),
            engine_kwargs,
            trust_remote_code=trust_remote_code,
            revision=revision,
        )
        with self.closed_on_error():
            info = self.start(ref, pooling_info, data_parallel_size, replicas_per_gpu, ray_address)
            if "token_embed" not in info["supported_tasks"]:
                raise UsageError(
                    f"{ref.path}: vLLM runs this model for {', '.join(info['supported_tasks']) or 'nothing'}, "
                    "not token_embed (a multi-vector model such as HF_ColBERT is needed)"
                )
            max_length = info["max_model_len"]
            self.image_prompts = None
            if info["is_multimodal"]:
                found = find_preset(ref.path, "embedding")
                self.image_prompts = ImagePrompts.resolve(image_prompts, found)
                self._placeholder = info["image_placeholder"] or ""
            meta = build_model_meta(
                ref,
                revision=revision,
                model_name=model_name,
                max_model_len=max_length,
                modalities=["text", "image"] if info["is_multimodal"] else None,
            )
            super().__init__(
                model=ref.path,
                model_ref=ref,
                meta=meta,
                prompting=PromptResolver(prompts=prompts),
                max_length=max_length,
                tokenizer=BatchTokenizer(info["tokenizer"], max_length, info["do_lower_case"]),
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
                store_dtype=store_dtype,
                score_batch_size=score_batch_size,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides (and a vision model's prompts)."""
        from ..encoder.vllm import vars_of

        extra = {"image_prompts": vars_of(self.image_prompts)} if self.image_prompts is not None else {}
        return {**super().identity(), **self.engine_identity(), **extra}

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        """A vision model's inputs in their prompts (texts too); otherwise as the encoder base."""
        if self.image_prompts is None:
            return super()._model_inputs(texts, images)
        return prompted_inputs(self.image_prompts, texts, images, self._placeholder)

    def _embed_tokens_chunk(self, texts: list[Any], ids: list[list[int]]) -> list[np.ndarray]:
        # An image chunk comes untokenized (ids empty): each image goes as its prompt with the image.
        inputs = ids or [x.engine_prompt() for x in texts]
        return self.run_split(
            token_pooling_job,
            len(inputs),
            lambda lo, hi: ("token_embed", inputs[lo:hi]),
            lambda i: f"input {i} ({texts[i]!r:.60})",
        )
