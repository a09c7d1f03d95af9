"""``VllmClassifier``: sequence classifiers through vLLM's ``classify`` pooling task (``LLM.classify``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs
from ...engine.jobs import classify_job, pooling_info
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from ..vllm_backend import VllmBackend
from .base import ClassifierBase, labels_of


class VllmClassifier(VllmBackend, ClassifierBase):
    """``*ForSequenceClassification`` models through ``LLM.classify`` (runner ``pooling``, convert ``classify``).

    Inputs are tokenized here in batches (as vLLM's text path would: special tokens added,
    truncated to ``max_model_len``) and sent as token ids; vLLM returns the class probabilities
    (softmax, or sigmoid for one label), or the logits with ``use_activation=False``. A model whose
    vLLM pooler scores every token instead (``token_classify`` only, e.g. ``Qwen2ForRewardModel``)
    is read at its last token, the position a sequence classifier pools.

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        use_activation: False: the logits (a reward model's scores), not probabilities.
        add_special_tokens: False for text that already carries them (rendered by a chat template).
        labels: class names in index order; default the config's ``id2label``.
        chunk_size: texts tokenized and handed to the engine per step.
        show_progress_bar: progress bar over each call's texts.
        model_name: name recorded in results.
        trust_remote_code: run the model repository's own code (default False).
        data_parallel_size, replicas_per_gpu, ray_address: engine replicas, as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`; each chunk of texts is split over them.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len`` ...).

    Raises:
        UsageError: the model's config names no labels; more replicas than GPUs or cores.
        ReplicaError: a replica failed to start.
        OptionError: unknown engine options.
        EngineError: vLLM failed to start (its reason in the message).
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        use_activation: bool = True,
        add_special_tokens: bool = True,
        labels: list[str] | None = None,
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
        if labels is None and ref.config:
            labels = labels_of(ref.config)
        self.engine_kwargs = backend_engine_kwargs(
            "pooling", engine_kwargs, convert="classify", trust_remote_code=trust_remote_code, revision=revision
        )
        with self.closed_on_error():
            info = self.start(ref, pooling_info, data_parallel_size, replicas_per_gpu, ray_address)
            tasks = info["supported_tasks"]
            if "classify" not in tasks and "token_classify" not in tasks:
                raise UsageError(
                    f"{ref.path}: vLLM runs this model for {', '.join(tasks) or 'no pooling task'}, not classify"
                )
            self.pooling_task = "classify" if "classify" in tasks else "token_classify"
            if labels is None:  # a hub id not in the local cache: the engine has read the config
                labels = labels_of(info["hf_config"])
            max_length = info["max_model_len"]
            meta = build_model_meta(
                ref, revision=revision, model_name=model_name, max_model_len=max_length, cross_encoder=True
            )
            super().__init__(
                model=ref.path,
                model_ref=ref,
                labels=labels,
                use_activation=use_activation,
                meta=meta,
                prompting=PromptResolver(),
                max_length=max_length,
                tokenizer=BatchTokenizer(
                    info["tokenizer"], max_length, info["do_lower_case"], add_special_tokens=add_special_tokens
                ),
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides."""
        return {**super().identity(), **self.engine_identity()}

    def _classify_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return self.run_split(
            classify_job,
            len(ids),
            lambda lo, hi: (ids[lo:hi], self.use_activation, self.pooling_task),
            lambda i: f"text {i} ({texts[i]!r:.60})",
        )
