"""``VllmTokenClassifier``: ``*ForTokenClassification`` through vLLM's ``token_classify`` pooling task."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..classifier.base import labels_of
from ..engine import EngineUser, merge_engine_kwargs, raise_on_request_errors
from ..modelinfo import ModelRef, build_model_meta
from ..prompts import PromptResolver
from .base import TokenClassifierBase


class VllmTokenClassifier(EngineUser, TokenClassifierBase):
    """Per-token label probabilities from ``LLM.encode(..., pooling_task="token_classify")`` (runner ``pooling``).

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        chunk_size: sentences tokenized and handed to the engine per step.
        show_progress_bar: progress bar over the sentences.
        model_name: name recorded in results.
        trust_remote_code: run the model repository's own code (default False).
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len`` ...).

    Raises:
        UsageError: the model's config names no labels.
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
        **engine_kwargs: Any,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        kwargs = merge_engine_kwargs(engine_kwargs, {"revision": revision} if revision is not None else None)
        self.engine_kwargs = {"runner": "pooling", "trust_remote_code": trust_remote_code, **kwargs}
        self._start_engine(ref)
        with self.closed_on_error():
            config = self.llm.model_config
            max_length = int(config.max_model_len)
            super().__init__(
                model=ref.path,
                model_ref=ref,
                labels=labels_of(ref.config or config.hf_config.to_dict()),
                meta=build_model_meta(
                    ref, revision=revision, model_name=model_name, max_model_len=max_length, cross_encoder=True
                ),
                prompting=PromptResolver(),
                max_length=max_length,
                tokenizer=self.llm.get_tokenizer(),
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides."""
        return {**super().identity(), **self.engine_identity()}

    def _token_probs(self, ids: list[list[int]]) -> list[np.ndarray]:
        from vllm.inputs import TokensPrompt

        outputs = self.llm.encode(
            [TokensPrompt(prompt_token_ids=x) for x in ids], pooling_task="token_classify", use_tqdm=False
        )
        raise_on_request_errors(outputs, lambda i: f"sentence {i} of the chunk")
        return [np.asarray(o.outputs.data, dtype=np.float32) for o in outputs]
