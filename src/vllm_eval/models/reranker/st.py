"""The reference reranker: ``sentence_transformers.CrossEncoder.predict`` behind the same interface.

A score template (a preset's, e.g. ``qwen3-reranker``, or one given) on a causal LM runs through
sentence-transformers' own causal reranker path (v6): ``CrossEncoder`` loads a ``*ForCausalLM`` as a
``text-generation`` Transformer followed by ``LogitScore``, whose score is ``logit(yes) - logit(no)`` at the last
position; the default sigmoid activation makes that P(yes) = softmax(logit_no, logit_yes)[yes], the Qwen3-Reranker
model card's score and vLLM's (``classifier_from_token``). The pair reaches the model as a ``query`` and a
``document`` message rendered by a chat template, which here concatenates the two parts the base class has
already formatted with the template: one prompt, the same text vLLM scores.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta
from ..base import torch_dtype_name
from ..presets import ScoreTemplate
from ..prompts import resolve_prompting
from .base import RerankerBase

#: The chat template a templated pair is rendered with: the query message's text, then the document's
#: (sentence-transformers maps a pair to a ``query`` and a ``document`` message; content is a string, or a
#: list of ``{"type": "text", "text": ...}`` parts, depending on the format it picked for the tokenizer).
CONCAT_PAIR_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}{{ part['text'] }}{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
)


class SentenceTransformerReranker(RerankerBase):
    """Reference backend: ``sentence_transformers.CrossEncoder.predict`` (``--backend st``).

    A cross-encoder (``*ForSequenceClassification``) scores text pairs as sentence-transformers does. A causal LM
    with a score template (``preset`` named, or matched by the model's name) is scored by P(yes) through
    sentence-transformers' ``LogitScore`` (see the module docstring), on the prompt vLLM scores.

    Args:
        model: local model directory or hub id of a sequence-classification reranker, or of a causal-LM
            reranker with a template.
        revision: hub revision.
        preset: a reranker preset name or :class:`~vllm_eval.models.presets.ModelPreset` (None: the one matching
            ``model``, if any); its score template and ``classifier_from_token`` (false, true) apply.
        score_template: a template for any causal LM (overrides the preset's).
        prompts: static query/document prefixes.
        dtype: ``float32`` (default, the parity reference), ``float16``, ``bfloat16`` or ``auto``.
        batch_size: sentence-transformers batch size.
        chunk_size, show_progress_bar, model_name, trust_remote_code: as for
            :class:`~vllm_eval.models.reranker.vllm.VllmReranker`.
        device: torch device; None lets sentence-transformers choose.
        max_model_len: token limit; None keeps the model's.

    Raises:
        ModelNotFoundError: a model path that does not exist.
        UsageError: an unknown dtype or preset; a template for a model that is not a causal LM.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "max_model_len", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        preset: Any = None,
        score_template: ScoreTemplate | None = None,
        prompts: dict[str, str] | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
        chunk_size: int = 512,
        show_progress_bar: bool = True,
        device: str | None = None,
        model_name: str | None = None,
        trust_remote_code: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        from sentence_transformers import CrossEncoder

        torch_dtype = torch_dtype_name(dtype, allow_auto=True)
        ref = ModelRef.resolve(model, revision)
        prompting, self.preset = resolve_prompting(ref.path, "reranker", preset=preset, prompts=prompts)
        template = score_template or (self.preset.score_template if self.preset else None)
        causal = any(a.endswith("ForCausalLM") for a in ref.architectures)
        if template is not None and ref.config and not causal:
            raise UsageError(
                f"the st reranker applies score templates to causal LMs (sentence-transformers' LogitScore); "
                f"{ref.path!r} is {', '.join(ref.architectures) or 'of unknown architecture'}"
            )
        self.ce = CrossEncoder(
            ref.path,
            revision=revision,
            device=device,
            trust_remote_code=trust_remote_code,
            max_length=max_model_len,
            model_kwargs={"torch_dtype": torch_dtype},
            processor_kwargs={"chat_template": CONCAT_PAIR_TEMPLATE} if template is not None else None,
        )
        if template is not None:
            self._use_judge_tokens()
        self.batch_size = batch_size
        self.dtype = str(self.ce.model.dtype)
        max_length = int(self.ce.max_seq_length)
        meta = build_model_meta(
            ref,
            revision=revision,
            model_name=model_name,
            max_model_len=max_length,
            framework=["Sentence Transformers", "PyTorch"],
            cross_encoder=True,
        )
        super().__init__(
            model=ref.path,
            model_ref=ref,
            meta=meta,
            prompting=prompting,
            mode="template" if template is not None else "cross-encoder",
            template=template,
            max_length=max_length,
            tokenizer=self.ce.tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def _use_judge_tokens(self) -> None:
        """Point ``LogitScore`` at the preset's (false, true) tokens (``classifier_from_token``, the tokens vLLM
        reads), where sentence-transformers' default is ``no`` / ``yes``.

        Raises:
            UsageError: the model did not load as a causal reranker, or a token is not one id of its tokenizer.
        """
        from sentence_transformers.cross_encoder.modules import LogitScore

        head = self.ce[-1]
        if not isinstance(head, LogitScore):
            raise UsageError(f"sentence-transformers did not load {self.ce.model.name_or_path!r} as a causal reranker")
        overrides = (self.preset.engine_kwargs.get("hf_overrides") or {}) if self.preset else {}
        false_true = overrides.get("classifier_from_token") or ["no", "yes"]
        ids = [self.ce.tokenizer.convert_tokens_to_ids(t) for t in false_true]
        if len(ids) != 2 or any(i is None or i == self.ce.tokenizer.unk_token_id for i in ids):
            raise UsageError(f"the tokenizer has no single tokens for {false_true} (the reranker's no/yes)")
        head.false_token_id, head.true_token_id = ids

    def identity(self) -> dict[str, Any]:
        """The base identity plus the torch device and dtype."""
        return {**super().identity(), "device": str(self.ce.model.device), "dtype": str(self.ce.model.dtype)}

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:
        scores = self.ce.predict(
            list(zip(queries, documents, strict=True)),
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        return np.asarray(scores, dtype=np.float32).reshape(-1)

    def close(self) -> None:
        """Drop the model. Idempotent."""
        self.ce = None
