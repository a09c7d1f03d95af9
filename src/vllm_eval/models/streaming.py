"""Streaming helpers every backend shares: chunking, look-ahead preparation, token counting, truncation reports."""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class TruncationWarning(UserWarning):
    """Some inputs were longer than the model's token limit and were cut (right side, special tokens kept)."""


# Ours, so "always" changes nothing else: every call that truncates says so once.
warnings.simplefilter("always", TruncationWarning)


def warn_truncated(n: int, total: int, max_length: int | None, model: str, what: str = "distinct inputs") -> None:
    """Emit the one per-call :class:`TruncationWarning` when ``n`` > 0."""
    if n:
        msg = f"{n} of {total} {what} exceeded {max_length} tokens and were truncated ({model})"
        warnings.warn(msg, TruncationWarning, stacklevel=3)


def chunked(items: Iterable[T], size: int, kind: Callable[[T], Any] | None = None) -> Iterator[list[T]]:
    """Group ``items`` into lists of ``size`` (the last may be shorter), reading lazily; with ``kind``, a list
    also ends where ``kind(item)`` changes, so every list holds one kind (texts or images).

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    it = iter(items)
    if kind is None:
        while chunk := list(itertools.islice(it, size)):
            yield chunk
        return
    chunk: list[T] = []
    for item in it:
        if chunk and (len(chunk) == size or kind(item) != kind(chunk[-1])):
            yield chunk
            chunk = []
        chunk.append(item)
    if chunk:
        yield chunk


def flatten(batches: Iterable[Iterable[T]]) -> Iterator[T]:
    """The items of each batch in turn (mteb hands inputs over as batches)."""
    return itertools.chain.from_iterable(batches)


class Batches:
    """Batches of inputs (dicts of lists, ``{"text": [...]}``) iterated as an mteb ``DataLoader`` is, without one:
    an encoder reads a loader's batches and its item count (``dataset``'s length), nothing else. Built where
    a loader over a ``datasets.Dataset`` would cost a row lookup per item (tens of microseconds each), and
    where a loader's batches cross a process boundary (:mod:`vllm_eval.evaluation.task_processes`)."""

    def __init__(self, batches: list[dict[str, Any]], n_items: int | None) -> None:
        self.batches = batches
        self.dataset = range(n_items) if n_items is not None else None

    @classmethod
    def of_texts(cls, texts: list[str], batch_size: int) -> Batches:
        """``texts`` in batches of ``batch_size``, as mteb hands plain texts to ``encode``."""
        size = max(int(batch_size), 1)
        return cls([{"text": texts[i : i + size]} for i in range(0, len(texts), size)], len(texts))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.batches)


def loader_len(inputs: Any) -> int | None:
    """Number of items behind an mteb ``DataLoader`` (its dataset's length), or None when unknown."""
    try:
        return len(inputs.dataset)
    except (AttributeError, TypeError):
        return None


_END = object()


def prefetched(items: Iterable[T], prepare: Callable[[T], R]) -> Iterator[R]:
    """``prepare(item)`` for each item, in order; the next item's is computed on a worker thread
    while the caller works on the current one (tokenizers release the GIL, so tokenizing chunk k+1
    overlaps the engine's work on chunk k)."""
    it = iter(items)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-eval-prepare") as pool:
        item = next(it, _END)
        pending = pool.submit(prepare, item) if item is not _END else None
        while pending is not None:
            result = pending.result()
            item = next(it, _END)
            pending = pool.submit(prepare, item) if item is not _END else None
            yield result


def private_tokenizer(tokenizer: Any) -> Any:
    """A copy of a Hugging Face tokenizer for the look-ahead thread of :func:`prefetched`.

    A fast tokenizer keeps its truncation and padding settings on the shared Rust object and sets
    them before every call, so two threads calling one tokenizer with different settings get each
    other's (measured: sentence-transformers' padded batches came back ragged while another thread
    tokenized with ``max_length=257``; see huggingface/tokenizers#537 on thread safety). The
    backend's own tokenizer stays with the backend; ours is a deep copy (None stays None).
    """
    return None if tokenizer is None else copy.deepcopy(tokenizer)


class BatchTokenizer:
    """Batch tokenization that yields the token ids vLLM's own text path would produce.

    vLLM's pooling renderer calls the HF tokenizer with ``add_special_tokens=True``,
    ``truncation=True, max_length=max_model_len`` (``truncate_prompt_tokens=-1``) and lower-cases
    first when the sentence-transformers config says ``do_lower_case``. Doing the same here, in
    batches, lets us count what was truncated and feed ``TokensPrompt``s.

    Args:
        tokenizer: a Hugging Face (fast) tokenizer; its ``truncation_side`` is respected. A private
            copy is kept (see :func:`private_tokenizer`), so the backend may go on using its own.
        max_length: token limit including special tokens.
        do_lower_case: lower-case texts before tokenizing.
        add_special_tokens: add the tokenizer's special tokens (False for text a chat template
            rendered, which carries them already).
        pad_to_max_length: pad every text's ids to ``max_length`` with the tokenizer's pad token, as
            SigLIP's text tower was trained (``padding="max_length"``; it pools the last position and has no
            attention mask, so the padding changes the vector).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        do_lower_case: bool = False,
        add_special_tokens: bool = True,
        pad_to_max_length: bool = False,
    ) -> None:
        self.tokenizer = private_tokenizer(tokenizer)
        self.max_length = int(max_length)
        self.do_lower_case = do_lower_case
        self.add_special_tokens = add_special_tokens
        self.pad_id = tokenizer.pad_token_id if pad_to_max_length else None

    def _encode(self, texts: list[str], max_length: int) -> list[list[int]]:
        enc = self.tokenizer(
            texts,
            add_special_tokens=self.add_special_tokens,
            truncation=True,
            max_length=max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return [list(x) for x in enc["input_ids"]]

    def __call__(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids per text, and how many texts were truncated to ``max_length``."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        # One token over the limit tells "too long" apart from "exactly at the limit" without
        # tokenizing long documents in full; only those few are tokenized again, truncated.
        ids = self._encode(texts, self.max_length + 1)
        over = [i for i, x in enumerate(ids) if len(x) > self.max_length]
        if over:
            for i, x in zip(over, self._encode([texts[i] for i in over], self.max_length), strict=True):
                ids[i] = x
        if self.pad_id is not None:
            ids = [x + [self.pad_id] * (self.max_length - len(x)) for x in ids]
        return ids, len(over)
