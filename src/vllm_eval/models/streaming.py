"""Streaming helpers every backend shares: chunking, look-ahead preparation, token counting, truncation reports.

:class:`BatchTokenizer` lives in :mod:`vllm_eval.engine.tokenizing` (a replica tokenizes with it too) and is
re-exported here."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..engine.tokenizing import PROBE_TEXTS, BatchTokenizer, private_tokenizer

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


__all__ = [
    "PROBE_TEXTS",
    "BatchTokenizer",
    "Batches",
    "TruncationWarning",
    "chunked",
    "flatten",
    "loader_len",
    "prefetched",
    "private_tokenizer",
    "warn_truncated",
]
