"""``VllmReranker``: mteb's ``CrossEncoderProtocol`` over vLLM's score API (``LLM.score``).

With ``data_parallel_size`` / ``replicas_per_gpu``, each chunk of pairs is split in order over
engine replicas (:mod:`vllm_eval.replicas.pool`); prompts and templates are applied here, once.

Empty strings are valid input and get a score. One documented difference from
sentence-transformers: for an empty *document* a cross-encoder in vLLM sees ``[CLS] q [SEP]``
(HF's single-pair tokenization drops the empty segment), while sentence-transformers' batched
tokenization gives ``[CLS] q [SEP] [SEP]``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs, merge_engine_kwargs
from ...engine.jobs import reranker_info, score_job
from ...utils.modelinfo import ModelRef, build_model_meta
from ..presets import ModelPreset, ScoreTemplate
from ..prompts import resolve_prompting
from ..vllm_backend import VllmBackend
from .base import RerankerBase, num_labels, reranker_mode


class VllmReranker(VllmBackend, RerankerBase):
    """mteb ``CrossEncoderProtocol`` over vLLM's score API (``LLM.score``, pooling runner).

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        preset: a registered reranker preset name (``"qwen3-reranker"``) or a :class:`ModelPreset`;
            when None, a preset whose pattern matches ``model`` is used (e.g. ``Qwen/Qwen3-Reranker-4B``).
        score_template: a :class:`ScoreTemplate` for any model (overrides the preset's).
        prompts: static query/document prefixes (``{"query": ..., "document": ...}``, mteb keys).
        instructions: per task name / type instruction for templates with ``{instruction}``;
            default: the task's own prompt, else the template's default instruction.
        chunk_size: pairs handed to the engine per call.
        show_progress_bar: progress bar per ``predict``.
        model_name: name recorded in results.
        device: part of mteb's signature; vLLM's build decides the device.
        trust_remote_code: run the model repository's own code (default False).
        data_parallel_size, replicas_per_gpu, ray_address: engine replicas, as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`; each chunk of pairs is split over them.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len``, ``hf_overrides`` ...);
            merged over the preset's (``hf_overrides`` dicts are merged key by key).

    Raises:
        UsageError: no way to score pairs with this model (see :func:`reranker_mode`), an unknown preset.
        ModelNotFoundError, OptionError, EngineError, ReplicaError: as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`.
    """

    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        preset: str | ModelPreset | None = None,
        score_template: ScoreTemplate | None = None,
        prompts: dict[str, str] | None = None,
        instructions: dict[str, str] | None = None,
        chunk_size: int = 512,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        del device  # mteb protocol signature; vLLM's build decides the device
        ref = ModelRef.resolve(model, revision)
        prompting, self.preset = resolve_prompting(
            ref.path, "reranker", preset=preset, prompts=prompts, instructions=instructions
        )
        template = score_template or (self.preset.score_template if self.preset else None)
        # A template makes one prompt of query part + document part; without use_sep_token=False
        # vLLM would tokenize them as a pair with separator tokens between.
        kwargs = merge_engine_kwargs(
            self.preset.engine_kwargs if self.preset else None,
            engine_kwargs,
            {"hf_overrides": {"use_sep_token": False}} if template is not None else None,
            {"revision": revision} if revision is not None else None,
        )
        archs = (kwargs.get("hf_overrides") or {}).get("architectures") or ref.architectures
        if ref.config:
            mode = reranker_mode(
                archs,
                has_template=template is not None,
                is_sentence_transformer=ref.is_sentence_transformer,
                num_labels=num_labels(ref.config),
                model=ref.path,
            )
            convert = "embed" if mode == "bi-encoder" else "classify"
        else:  # a hub id not in the local cache: vLLM decides, checked below
            mode, convert = ("template", "classify") if template else ("cross-encoder", "auto")
        self.engine_kwargs = backend_engine_kwargs(
            "pooling", kwargs, convert=convert, trust_remote_code=trust_remote_code
        )
        with self.closed_on_error():
            info = self.start(ref, reranker_info, data_parallel_size, replicas_per_gpu, ray_address)
            if not ref.config:
                mode = reranker_mode(
                    info["architectures"],
                    has_template=template is not None,
                    is_sentence_transformer=False,
                    num_labels=info["num_labels"],
                    model=ref.path,
                )
            max_length = info["max_model_len"]
            meta = build_model_meta(
                ref,
                revision=revision,
                model_name=model_name,
                max_model_len=max_length,
                cross_encoder=True,
                modalities=["text", "image"] if info["image_placeholder"] else None,
            )
            super().__init__(
                model=ref.path,
                model_ref=ref,
                meta=meta,
                prompting=prompting,
                mode=mode,
                template=template,
                max_length=max_length,
                tokenizer=info["tokenizer"],
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )
            self.image_placeholder = info["image_placeholder"]

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides."""
        return {**super().identity(), **self.engine_identity()}

    def _score_chunk(self, queries: list[Any], documents: list[Any]) -> np.ndarray:
        scores = self.run_split(
            score_job,
            len(queries),
            lambda lo, hi: (queries[lo:hi], documents[lo:hi]),
            lambda i: f"pair {i} (query {queries[i]!r:.60})",
        )
        return np.asarray(scores, dtype=np.float32)
