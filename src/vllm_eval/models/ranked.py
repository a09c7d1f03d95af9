"""Search results held as arrays: mteb's ``{query id: {document id: score}}`` without a dict per query.

A search hands mteb one dict per query (``RetrievalOutputType``); MindSmallReranking at full size has 2.36
million queries and 97 million (query, candidate) scores, and building, pickling and reading those dicts took
longer than computing them. :class:`RankedLists` keeps the same content as arrays and reads as the same
mapping (each query's dict built when asked for), so mteb code that reads results still works, while this
package's scoring (:mod:`vllm_eval.evaluation.scoring`) reads the arrays. A search returns one only where the
scoring that reads it is on (:func:`columnar`, per thread); elsewhere it returns the plain dicts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..engine.procenv import cpu_cores

_state = threading.local()

#: Entries per matrix of one length group (queries x ranks): bounds the memory of each piece of work.
CHUNK_ENTRIES = 1 << 22


class RankedLists(Mapping):
    """Each query's ranked documents with their scores, as arrays; a read-only ``Mapping[str, dict[str, float]]``.

    Args:
        query_ids: the queries, in order (n_queries).
        offsets: int64 (n_queries + 1): query ``i``'s pairs are ``[offsets[i], offsets[i + 1])``.
        docs: int64 (n_pairs): each pair's document, an index into ``doc_ids``.
        scores: float32 or float64 (n_pairs): each pair's score; a query's pairs in the order its dict lists them.
        doc_ids: the documents' ids.

    A query's dict is built anew on each read: changing it changes nothing here (mteb's code only reads
    results, except ``ignore_identical_ids``, see :meth:`drop_identical_ids`).
    """

    def __init__(
        self, query_ids: list[str], offsets: np.ndarray, docs: np.ndarray, scores: np.ndarray, doc_ids: list[str]
    ) -> None:
        self.query_ids, self.doc_ids = list(query_ids), doc_ids
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.docs = np.asarray(docs, dtype=np.int64)
        self.scores = np.asarray(scores)
        self._row: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.query_ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self.query_ids)

    def __getitem__(self, qid: str) -> dict[str, float]:
        if self._row is None:
            self._row = {q: i for i, q in enumerate(self.query_ids)}
        i = self._row[qid]
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        ids = self.doc_ids
        return dict(zip([ids[j] for j in self.docs[lo:hi].tolist()], self.scores[lo:hi].tolist(), strict=True))

    def __contains__(self, qid: object) -> bool:
        if self._row is None:
            self._row = {q: i for i, q in enumerate(self.query_ids)}
        return qid in self._row

    def to_dict(self) -> dict[str, dict[str, float]]:
        """mteb's plain form: one dict per query, in order (Python floats made at once, not one per score)."""
        ids, values, bounds = self.doc_ids, self.scores.tolist(), self.offsets.tolist()
        names = [ids[j] for j in self.docs.tolist()]
        return {
            qid: dict(zip(names[lo:hi], values[lo:hi], strict=True))
            for qid, lo, hi in zip(self.query_ids, bounds, bounds[1:], strict=False)
        }

    def drop_identical_ids(self) -> None:
        """Remove, in place, each query's document whose id is the query's (mteb's ``ignore_identical_ids``,
        which pops them from each query's dict)."""
        index = {self.doc_ids[j]: j for j in used_rows(self.docs, len(self.doc_ids)).tolist()}  # ranked, not all
        own = np.array([index.get(q, -1) for q in self.query_ids], dtype=np.int64)
        counts = np.diff(self.offsets)
        keep = self.docs != np.repeat(own, counts)
        if keep.all():
            return
        pair_query = np.repeat(np.arange(len(self.query_ids)), counts)[keep]
        self.offsets = np.concatenate([[0], np.cumsum(np.bincount(pair_query, minlength=len(self.query_ids)))])
        self.docs, self.scores = self.docs[keep], self.scores[keep]

    def __reduce__(self) -> tuple:
        return RankedLists, (self.query_ids, self.offsets, self.docs, self.scores, self.doc_ids)


@contextmanager
def columnar(enabled: bool = True) -> Iterator[None]:
    """Within this block, on this thread, a search returns :class:`RankedLists` (``enabled``) or plain dicts."""
    before = getattr(_state, "on", False)
    _state.on = enabled
    try:
        yield
    finally:
        _state.on = before


def as_results(ranked: Any) -> Any:
    """``ranked`` as this thread's scoring reads results: itself under :func:`columnar`, else plain dicts."""
    if isinstance(ranked, RankedLists) and not getattr(_state, "on", False):
        return ranked.to_dict()
    return ranked


def length_groups(lengths: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(length, query indices) per distinct length > 0, in chunks of at most :data:`CHUNK_ENTRIES` entries: the
    queries of one chunk make one (queries, length) matrix, whose rows numpy sorts or sums each on its own."""
    order = np.argsort(lengths, kind="stable")
    values, starts = np.unique(lengths[order], return_index=True)
    bounds = [*starts.tolist(), len(order)]
    for length, lo, hi in zip(values.tolist(), bounds, bounds[1:], strict=False):
        if length == 0:
            continue
        step = max(CHUNK_ENTRIES // length, 1)
        for at in range(lo, hi, step):
            yield length, order[at : min(at + step, hi)]


def used_rows(rows: np.ndarray, n: int) -> np.ndarray:
    """The distinct values of ``rows`` (int indices in ``[0, n)``), ascending, as ``np.unique`` returns them: by
    a count per row, linear where ``np.unique`` sorts or hashes (97 million ranked pairs of MindSmallReranking)."""
    return np.flatnonzero(np.bincount(rows, minlength=n)) if len(rows) else np.zeros(0, dtype=np.int64)


def worker_threads() -> int:
    """Threads for numpy work that releases the GIL: this process's cores, at most 8."""
    return max(1, min(8, len(cpu_cores())))


def on_threads(work: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``work(item)`` for every item, on up to :func:`worker_threads` threads (for NumPy work, which releases the
    GIL), results in the items' order; one item runs on this thread."""
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(worker_threads(), len(items))) as pool:
        return list(pool.map(work, items))


def in_groups(work: Callable[[int, np.ndarray], Any], lengths: np.ndarray) -> list[Any]:
    """``work(length, queries)`` for every :func:`length_groups` chunk, on threads (numpy releases the GIL while it
    sorts, gathers and sums), results in the chunks' order."""
    return on_threads(lambda g: work(*g), list(length_groups(lengths)))


def best_first(offsets: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's pairs (``[offsets[i], offsets[i + 1])``) by score, descending, equal scores in their order, at
    most ``k``: (pair indices int64, in that order; the number kept per query int64)."""
    counts = np.diff(offsets)
    kept = np.minimum(counts, k)
    starts = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    out = np.empty(int(starts[-1]), dtype=np.int64)

    def rows(length: int, queries: np.ndarray) -> None:
        at = offsets[queries][:, None] + np.arange(length)
        order = np.argsort(-scores[at], axis=1, kind="stable")[:, :k]
        out[starts[queries][:, None] + np.arange(order.shape[1])] = np.take_along_axis(at, order, axis=1)

    in_groups(rows, counts)
    return out, kept


def refuse_other_task_types(tasks: Sequence[Any], allowed: Sequence[str], reason: str, advice: str = "") -> None:
    """Refuse, before anything loads, the first task whose mteb type is not in ``allowed`` (a model that only
    ranks documents for queries has no single vector for the other types).

    Raises:
        UsageError: ``reason``, then the task's name and type, then ``advice``.
    """
    from ..utils.errors import UsageError

    for task in tasks:
        if task.metadata.type not in allowed:
            raise UsageError(f"{reason}; {task.metadata.name} is {task.metadata.type}{advice}")
