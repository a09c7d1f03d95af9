"""``ClassifierBase``: what every sequence-classifier backend shares.

A backend implements :meth:`ClassifierBase._classify_chunk` (distinct texts in, one row of class
probabilities per text out) and passes its label names (``id2label`` order), token limit and
tokenizer. The text stream (deduplication, look-ahead tokenization, the output cache, counters,
progress, truncation report) is :class:`~vllm_eval.models.pooling.TextPoolingBase`, the same as encoders'.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ..pooling import TextPoolingBase
from ..prompts import check_texts
from ..streaming import BatchTokenizer


def labels_of(config: dict[str, Any] | None) -> list[str]:
    """Class names in index order from a model's ``config.json`` dict (``id2label``; ``LABEL_i`` when absent).

    Raises:
        UsageError: no ``id2label`` and no ``num_labels``.
    """
    config = config or {}
    id2label = config.get("id2label")
    if id2label:
        return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(len(id2label))]
    n = config.get("num_labels")
    if not n:
        raise UsageError("the model's config has neither id2label nor num_labels: is it a sequence classifier?")
    return [f"LABEL_{i}" for i in range(int(n))]


class ClassifierBase(TextPoolingBase, ABC):
    """Base of the classifier backends: :meth:`classify` over one hook, :meth:`_classify_chunk`.

    Args:
        labels: class names in the model's index order (``id2label``).
        use_activation: return probabilities (softmax, or sigmoid for one label); False returns the
            raw logits, as a reward model's scores are read (vLLM's ``PoolingParams.use_activation``).
        model, meta, prompting, max_length, tokenizer, chunk_size, show_progress_bar, model_ref:
            as for :class:`~vllm_eval.models.encoder.base.EncoderBase`.

    Raises:
        UsageError: no labels, a bad ``chunk_size``, or no tokenizer for a backend that tokenizes locally.
    """

    kind: ClassVar[str] = "classifier"
    stream_label: ClassVar[str] = "classify"

    def __init__(
        self,
        *,
        model: str,
        labels: Sequence[str],
        use_activation: bool = True,
        meta: Any,
        prompting: Any,
        max_length: int | None,
        tokenizer: BatchTokenizer | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        if not labels:
            raise UsageError(f"{model}: a classifier needs at least one label")
        self.labels = [str(x) for x in labels]
        self.use_activation = bool(use_activation)
        super().__init__(
            model=model,
            model_ref=model_ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            tokenizer=tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the label names (their order gives the columns) and the activation."""
        return {**super().identity(), "labels": self.labels, "use_activation": self.use_activation}

    @abstractmethod
    def _classify_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        """Class probabilities for distinct ``texts`` (token ids when the backend tokenizes locally, else ``[]``).

        Returns:
            float32 (len(texts), len(labels)): softmax over the logits, or the sigmoid of the one
            logit of a single-label model (transformers' and vLLM's default activation); the
            logits themselves when :attr:`use_activation` is False.
        """

    def _pool_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return self._classify_chunk(texts, ids)

    def _output_width(self) -> int:
        return len(self.labels)

    def classify(self, texts: Sequence[str], *, show_progress_bar: bool | None = None) -> np.ndarray:
        """Class probabilities (logits without :attr:`use_activation`) of ``texts`` as given, float32
        (n_texts, n_labels), columns in :attr:`labels` order.

        Raises:
            OptionError: an input that is not a str (named by index).
        """
        texts = check_texts(texts)
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        return self._pooled_stream(iter(texts), total=len(texts), show_progress_bar=show)
