"""Search results as arrays, and queries grouped by how many results they have: what the fast scoring
(:mod:`vllm_eval.evaluation.scoring`) computes on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...models.ranked import RankedLists


@dataclass
class Runs:
    """Search results as arrays: query ``i``'s documents are ``docs[offsets[i]:offsets[i + 1]]`` (indices into
    ``names``) with float64 ``scores``, in the order of the query's dict."""

    query_ids: list[str]
    offsets: np.ndarray
    docs: np.ndarray
    scores: np.ndarray
    names: list[str]

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def pair_query(self) -> np.ndarray:
        """int64 (n_pairs,): each pair's query index."""
        return np.repeat(np.arange(len(self.query_ids)), self.counts)


def runs_of(results: Mapping[str, Mapping[str, float]]) -> Runs:
    """``results`` (mteb's ``{query: {document: score}}``, or a :class:`RankedLists`) as :class:`Runs`."""
    if isinstance(results, RankedLists):
        scores = results.scores.astype(np.float64)
        return Runs(results.query_ids, results.offsets, results.docs, scores, results.doc_ids)
    query_ids = list(results)
    index: dict[str, int] = {}
    counts, docs, scores = [], [], []
    for qid in query_ids:
        ranked = results[qid]
        counts.append(len(ranked))
        docs.extend(index.setdefault(d, len(index)) for d in ranked)
        scores.extend(ranked.values())
    offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)
    return Runs(query_ids, offsets, np.asarray(docs, dtype=np.int64), np.asarray(scores, dtype=np.float64), list(index))
