"""``TokenClassifierBase``: word-level labels from a token classifier, the same way for every backend.

Words are tokenized here (``is_split_into_words``, special tokens added, truncated to the token limit)
on a private tokenizer copy; a backend implements one hook, :meth:`TokenClassifierBase._token_probs`
(token ids in, one (n_tokens, n_labels) probability array per sequence out). Each word takes the label
of its first sub-token (as the transformers token-classification examples and seqeval-based NER
evaluations do); words cut off by truncation get the label ``O`` and are counted. Outputs are cached
per sequence of token ids.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import OptionError, UsageError
from ...utils.progress import input_bar
from ..base import PoolingBackendBase
from ..streaming import chunked, private_tokenizer, warn_truncated


class TokenClassifierBase(PoolingBackendBase, ABC):
    """Base of the token-classifier backends: :meth:`tag` over one hook, :meth:`_token_probs`.

    Args:
        labels: label names in the model's index order (``id2label``).
        tokenizer: the model's Hugging Face fast tokenizer (a private copy is kept).
        model, meta, prompting, max_length, chunk_size, show_progress_bar, model_ref: as for
            :class:`~vllm_eval.models.base.PoolingBackendBase`.

    Raises:
        UsageError: no labels; a tokenizer that cannot map tokens back to words (not a fast tokenizer).
    """

    kind: ClassVar[str] = "token_classifier"

    def __init__(
        self,
        *,
        model: str,
        labels: Sequence[str],
        meta: Any,
        prompting: Any,
        max_length: int,
        tokenizer: Any,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        if not labels:
            raise UsageError(f"{model}: a token classifier needs at least one label")
        if not getattr(tokenizer, "is_fast", False):
            raise UsageError(f"{model}: word-level labels need a fast tokenizer (word_ids)")
        self.labels = [str(x) for x in labels]
        super().__init__(
            model=model,
            model_ref=model_ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            tokenizer=private_tokenizer(tokenizer),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the label names."""
        return {**super().identity(), "labels": self.labels}

    @abstractmethod
    def _token_probs(self, ids: list[list[int]]) -> list[np.ndarray]:
        """Per sequence of token ids, float32 (len(ids[i]), n_labels) label probabilities (softmax)."""

    def word_probs(
        self, sentences: Sequence[Sequence[str]], *, show_progress_bar: bool | None = None
    ) -> list[np.ndarray]:
        """Per sentence (a list of words), float32 (n_words, n_labels): each word's first sub-token's
        probabilities; words past the token limit get a one-hot ``O`` row (or label 0 without ``O``).

        Raises:
            OptionError: a sentence that is not a list of str (named by index).
        """
        for i, words in enumerate(sentences):
            if isinstance(words, str) or not all(isinstance(w, str) for w in words):
                raise OptionError(f"sentence {i} must be a list of str words, got {type(words).__name__}")
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        outside = self.labels.index("O") if "O" in self.labels else 0
        out: list[np.ndarray] = []
        cut_sentences = 0
        start = time.perf_counter()
        with input_bar("token-classify", len(sentences), "sentences", enabled=show) as advance:
            for chunk in chunked(sentences, self.chunk_size):
                enc = self.tokenizer(
                    [list(w) for w in chunk],
                    is_split_into_words=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_attention_mask=False,
                    return_token_type_ids=False,
                )
                ids = [list(x) for x in enc["input_ids"]]
                self._record(chunk)
                keys, hits = self._cached(ids)
                c = self.counters
                c.inputs += len(chunk)
                c.distinct += len(chunk)
                c.tokens += sum(map(len, ids))
                c.compute_tokens += sum(len(x) for x, k in zip(ids, keys or [None] * len(ids)) if k not in hits)
                merged = self._merge_cached(
                    keys, hits, len(ids), lambda miss, ids=ids: self._token_probs([ids[i] for i in miss])
                )
                for j, words in enumerate(chunk):
                    probs = merged[j]
                    rows = np.zeros((len(words), len(self.labels)), dtype=np.float32)
                    rows[:, outside] = 1.0
                    seen: set[int] = set()
                    for pos, w in enumerate(enc.word_ids(j)):
                        if w is not None and w not in seen:
                            seen.add(w)
                            rows[w] = probs[pos]
                    cut_sentences += len(seen) < len(words)
                    out.append(rows)
                advance(len(chunk))
        self.counters.add_compute(time.perf_counter() - start)
        self.counters.truncated += cut_sentences
        warn_truncated(cut_sentences, len(sentences), self.max_length, self.name, what="sentences")
        return out

    def tag(self, sentences: Sequence[Sequence[str]], *, show_progress_bar: bool | None = None) -> list[list[str]]:
        """Per sentence, one label name per word (argmax of :meth:`word_probs`)."""
        return [
            [self.labels[k] for k in p.argmax(axis=1)] if len(p) else []
            for p in self.word_probs(sentences, show_progress_bar=show_progress_bar)
        ]
