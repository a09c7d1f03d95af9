"""``VllmTokenClassifier``: ``*ForTokenClassification`` through vLLM's ``token_classify`` pooling task."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs
from ...engine.jobs import pooling_info, token_pooling_job
from ...utils.modelinfo import ModelRef, build_model_meta
from ..classifier.base import labels_of
from ..prompts import PromptResolver
from ..vllm_backend import VllmBackend
from .base import TokenClassifierBase


class VllmTokenClassifier(VllmBackend, TokenClassifierBase):
    """Per-token label probabilities from ``LLM.encode(..., pooling_task="token_classify")`` (runner ``pooling``).

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        chunk_size: sentences tokenized and handed to the engine per step.
        show_progress_bar: progress bar over the sentences.
        model_name: name recorded in results.
        trust_remote_code: run the model repository's own code (default False).
        data_parallel_size, replicas_per_gpu, ray_address: engine replicas, as for
            :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`; each chunk of sentences is split over them.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len`` ...).

    Raises:
        UsageError: the model's config names no labels; more replicas than GPUs or cores.
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
        chunk_size: int = 256,
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
            "pooling", engine_kwargs, trust_remote_code=trust_remote_code, revision=revision
        )
        with self.closed_on_error():
            info = self.start(ref, pooling_info, data_parallel_size, replicas_per_gpu, ray_address)
            max_length = info["max_model_len"]
            super().__init__(
                model=ref.path,
                model_ref=ref,
                labels=labels_of(ref.config or info["hf_config"]),
                meta=build_model_meta(
                    ref, revision=revision, model_name=model_name, max_model_len=max_length, cross_encoder=True
                ),
                prompting=PromptResolver(),
                max_length=max_length,
                tokenizer=info["tokenizer"],
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides."""
        return {**super().identity(), **self.engine_identity()}

    def _token_probs(self, ids: list[list[int]]) -> list[np.ndarray]:
        return self.run_split(
            token_pooling_job,
            len(ids),
            lambda lo, hi: ("token_classify", ids[lo:hi]),
            lambda i: f"sentence {i} of the chunk",
        )
