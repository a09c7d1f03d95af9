"""mteb's retrieval metrics computed on arrays, with mteb's numbers.

mteb scores a retrieval or reranking split with ``calculate_retrieval_scores``
(``mteb/_evaluators/retrieval_metrics.py``): pytrec_eval (trec_eval's nDCG, MAP, recall, precision and success
at each cutoff, one query at a time from Python dicts), then its own MRR, then the abstention metrics (nAUC of
each metric against each confidence score, arXiv:2402.12997) over lists made one query at a time;
MindSmallReranking adds ``max_over_subqueries``. On MindSmallReranking (2.36 million queries) that took most of
the task's time. Here every metric is computed for all queries at once from arrays (queries with the same
number of ranked documents as one matrix), by the same arithmetic in the same order, so the numbers are
mteb's: trec_eval's ranking (score as float32, descending, then document id descending), its discount
``log2(rank + 1)`` from the C library as trec_eval calls it, the running sums accumulated rank by rank, the
means summed by Python's ``sum`` as mteb does, and the abstention curves by mteb's own steps
(:mod:`.abstention`). ``tests/test_scoring.py`` checks every metric against mteb's functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
from mteb._evaluators import retrieval_metrics

from ...models.ranked import RankedLists, in_groups, length_groups, on_threads, used_rows, worker_threads
from .abstention import confidence_scores, naucs
from .arrays import Runs, runs_of

# mteb's own function, taken when this module is first imported: before fast_scoring replaces it (it imports this
# module to do so), so the fallback below reaches mteb's code while ours is installed
_MTEBS = retrieval_metrics.calculate_retrieval_scores


def _doc_rank(runs: Runs) -> np.ndarray:
    """Per entry of ``runs.names``: its place among the ids that occur, in Python's string order (trec_eval
    and mteb break equal scores by document id, descending)."""
    used = used_rows(runs.docs, len(runs.names))
    names = runs.names
    order = sorted(range(len(used)), key=lambda i: names[used[i]])
    rank = np.zeros(len(names), dtype=np.int64)
    rank[used[order]] = np.arange(len(used))
    return rank


def _descending(scores: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """uint64 keys whose ascending order is trec_eval's ranking: the score as float32, descending, then the document
    id (its rank), descending. Equal floats (0.0 and -0.0 too) get equal score bits, as C's comparison sees them."""
    with np.errstate(over="ignore"):
        bits = (scores.astype(np.float32) + np.float32(0)).view(np.uint32).astype(np.uint64)
    ascending = np.where(bits >= 1 << 31, (1 << 32) - 1 - bits, bits + (1 << 31))  # the float's order as integers
    return (((1 << 32) - 1 - ascending) << 32) | ((1 << 32) - 1 - ranks.astype(np.uint64))


class _Index(dict):
    """Document id -> row, -1 for a document that was not ranked (looked up in C, a Python call only on a miss)."""

    def __missing__(self, key: str) -> int:
        return -1


def _searched(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.searchsorted(key, values)`` in chunks on threads (NumPy releases the GIL): 97 million lookups for
    MindSmallReranking."""
    chunk = max(len(values) // worker_threads() + 1, 1 << 20)
    if len(values) <= chunk:
        return np.searchsorted(key, values)
    starts = range(0, len(values), chunk)
    return np.concatenate(on_threads(lambda lo: np.searchsorted(key, values[lo : lo + chunk]), starts))


def _relevance(runs: Runs, qrels: Mapping[str, Mapping[str, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair's relevance in ``qrels`` (0 where not judged), and every judgement of the results' queries as
    (query index, relevance) int64 arrays, by query.

    Raises:
        KeyError: a query of the results without qrels (as mteb's MRR does).
    """
    judged = [qrels[qid] for qid in runs.query_ids]
    counts = np.fromiter(map(len, judged), dtype=np.int64, count=len(judged))
    total = int(counts.sum())
    values = np.fromiter(chain.from_iterable(map(dict.values, judged)), dtype=np.int64, count=total)
    query = np.repeat(np.arange(len(judged)), counts)
    local = _Index((runs.names[j], j) for j in used_rows(runs.docs, len(runs.names)).tolist())
    doc = np.fromiter(map(local.__getitem__, chain.from_iterable(judged)), dtype=np.int64, count=total)
    rel = np.zeros(len(runs.docs), dtype=np.int64)
    found = doc >= 0
    if found.any():
        n_names = max(len(runs.names), 1)
        key = query[found] * n_names + doc[found]
        order = np.argsort(key)
        key, value = key[order], values[found][order]
        pair_key = runs.pair_query() * n_names + runs.docs
        at = np.minimum(_searched(key, pair_key), len(key) - 1)
        hit = key[at] == pair_key
        rel[hit] = value[at[hit]]
    return rel, query, values


def _discounts(n: int) -> np.ndarray:
    """``log2(rank + 1)`` for ranks 1..n from the C library's ``log2`` (trec_eval's), not numpy's."""
    return np.array([math.log2(i + 2) for i in range(n)], dtype=np.float64)


def _ideal(query: np.ndarray, values: np.ndarray, n: int, k_values: Sequence[int]) -> dict[int, np.ndarray]:
    """Per cutoff, each of ``n`` queries' ideal DCG: its positive judged relevances (``values`` of ``query``),
    best first, discounted."""
    out = {k: np.zeros(n) for k in k_values}
    positive = values > 0
    query, values = query[positive], values[positive]
    order = np.lexsort((-values, query))
    values = values[order].astype(np.float64)
    counts = np.bincount(query, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    lengths = np.minimum(counts, max(k_values))
    discount = _discounts(int(lengths.max(initial=0)) or 1)
    for length, queries in length_groups(lengths):
        total = np.cumsum(values[offsets[queries][:, None] + np.arange(length)] / discount[:length], axis=1)
        for k in k_values:
            out[k][queries] = total[:, min(k, length) - 1]
    return out


def per_query(
    runs: Runs, rel: np.ndarray, judged: tuple[np.ndarray, ...], k_values: Sequence[int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """pytrec_eval's ``ndcg_cut``, ``map_cut``, ``recall``, ``P`` and ``success`` at each cutoff (keyed ``ndcg_cut_10``
    ... as pytrec_eval names them; relevant: relevance >= 1) and mteb's ``MRR@k`` (relevance > 0), per query,
    float64 (n_queries,) each. Each query's results are ranked in its own row: by the float32 score as
    trec_eval ranks, by the double for the MRR (the same ranking when every score fits a float32), equal scores by
    document id, descending; groups of rows are worked on threads."""
    n, k_max = len(runs.query_ids), max(k_values)
    discount, doc_rank = _discounts(k_max), _doc_rank(runs)
    query, values = judged
    num_rel = np.bincount(query[values >= 1], minlength=n)
    ideal = _ideal(query, values, n, k_values)
    with np.errstate(over="ignore"):
        exact = bool(np.array_equal(runs.scores.astype(np.float32).astype(np.float64), runs.scores, equal_nan=True))
    out = {f"{m}_{k}": np.zeros(n) for m in ("ndcg_cut", "map_cut", "recall", "P", "success") for k in k_values}
    first = np.full(n, np.iinfo(np.int64).max)

    def rows(length: int, queries: np.ndarray) -> None:
        at = runs.offsets[queries][:, None] + np.arange(length)
        ranks, scores, judged_rel = doc_rank[runs.docs[at]], runs.scores[at], rel[at]
        order = np.argsort(_descending(scores, ranks), axis=1)[:, :k_max]  # the keys are unique
        r = np.take_along_axis(judged_rel, order, axis=1)
        _trec_rows(out, queries, r, discount, num_rel[queries], ideal, k_values)
        if not exact:
            r = np.take_along_axis(judged_rel, np.lexsort((-ranks, -scores), axis=-1)[:, :k_max], axis=1)
        hit = r > 0
        first[queries] = np.where(hit.any(axis=1), hit.argmax(axis=1), first[queries])

    in_groups(rows, runs.counts)
    mrr = {}
    for k in k_values:
        with np.errstate(divide="ignore"):
            mrr[f"MRR@{k}"] = np.where(first < k, 1.0 / (first + 1), 0.0)
    return out, mrr


def _trec_rows(
    out: dict[str, np.ndarray],
    queries: np.ndarray,
    r: np.ndarray,
    discount: np.ndarray,
    nrel: np.ndarray,
    ideal: dict[int, np.ndarray],
    k_values: Sequence[int],
) -> None:
    """trec_eval's measures of ``queries`` from their relevances, best first (``r``, one row each), into ``out``:
    the running sums rank by rank, as trec_eval adds them."""
    length = r.shape[1]
    hit = r >= 1
    found = np.cumsum(hit, axis=1)
    ap = np.cumsum(np.where(hit, found / np.arange(1, length + 1), 0.0), axis=1)
    dcg = np.cumsum(np.where(r > 0, r, 0) / discount[:length], axis=1)
    for k in k_values:
        c = min(k, length) - 1
        got = found[:, c]
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"P_{k}"][queries] = got / k
            out[f"recall_{k}"][queries] = np.where(nrel > 0, got / nrel, 0.0)
            out[f"map_cut_{k}"][queries] = np.where(nrel > 0, ap[:, c] / nrel, ap[:, c])
            best = ideal[k][queries]
            out[f"ndcg_cut_{k}"][queries] = np.where(best > 0, dcg[:, c] / best, dcg[:, c])
        out[f"success_{k}"][queries] = (got > 0).astype(np.float64)


def _mean(values: np.ndarray, n: int) -> float:
    return sum(values.tolist()) / n  # Python's sum, as mteb: numpy's pairwise sum rounds otherwise


class PerQueryScores(Mapping):
    """pytrec_eval's per-query output (``{query: {"ndcg_cut_10": ..., ...}}``) over the arrays, each query's dict
    built when read."""

    def __init__(self, query_ids: list[str], metrics: dict[str, np.ndarray]) -> None:
        self.query_ids, self.metrics = query_ids, metrics
        self._row = {q: i for i, q in enumerate(query_ids)}

    def __len__(self) -> int:
        return len(self.query_ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self.query_ids)

    def __getitem__(self, qid: str) -> dict[str, float]:
        i = self._row[qid]
        return {name: float(values[i]) for name, values in self.metrics.items()}


def skip_first(runs: Runs) -> Runs:
    """mteb's ``skip_first_result``: each query's documents sorted by score (descending, equal scores in their
    order) less the first."""
    pq = runs.pair_query()
    order = np.lexsort((np.arange(len(pq)), -runs.scores, pq))
    position = np.arange(len(pq)) - np.repeat(runs.offsets[:-1], runs.counts)
    keep = order[position > 0]
    counts = np.maximum(runs.counts - 1, 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Runs(runs.query_ids, offsets, runs.docs[keep], runs.scores[keep], runs.names)


_Measures = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]


def _measures(runs: Runs, qrels: Mapping[str, Mapping[str, int]], k_values: list[int], lo: int, hi: int) -> _Measures:
    """pytrec_eval's measures, MRR and the confidence scores of queries ``lo:hi`` of ``runs``, per query. A query's
    measures depend on its own results and qrels alone (its ties broken by document id, which keeps its order in
    any range), so ranges concatenate into the whole's."""
    if (lo, hi) != (0, len(runs.query_ids)):
        a, b = int(runs.offsets[lo]), int(runs.offsets[hi])
        offsets = runs.offsets[lo : hi + 1] - a
        runs = Runs(runs.query_ids[lo:hi], offsets, runs.docs[a:b], runs.scores[a:b], runs.names)
    rel, *judged = _relevance(runs, qrels)
    trec, mrr = per_query(runs, rel, tuple(judged), k_values)
    return trec, mrr, confidence_scores(runs)


def _all_measures(runs: Runs, qrels: Mapping[str, Mapping[str, int]], k_values: list[int]) -> _Measures:
    """:func:`_measures` of every query, in :func:`worker_threads` ranges where there are enough queries: the first
    here and the others in forked children meanwhile (:func:`vllm_eval.utils.forked.in_ranges`; MindSmallReranking's
    2.36 million subqueries took about 30 s of one process's Python, qrels read from dicts, on a 2-core CPU)."""
    from ...utils.forked import in_ranges

    parts = in_ranges(_measures, len(runs.query_ids), worker_threads(), runs, qrels, k_values)
    if len(parts) == 1:
        return parts[0]
    return tuple({key: np.concatenate([p[i][key] for p in parts]) for key in parts[0][i]} for i in range(3))


def calculate_retrieval_scores(
    results: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    k_values: Sequence[int],
    skip_first_result: bool = False,
) -> Any:
    """mteb's ``calculate_retrieval_scores`` (same arguments, same ``RetrievalEvaluationResult``, same numbers):
    ``results`` ``{query: {document: score}}`` (or a :class:`RankedLists`), ``qrels`` ``{query: {document: int
    relevance}}``; ``all_scores`` is a read-only mapping of pytrec_eval's per-query dicts.

    Raises:
        KeyError: a query of ``results`` without qrels (as mteb).
        ZeroDivisionError: no query at all (as mteb).
        IndexError: a query of ``results`` with empty qrels, which mteb's function is given (it fails, or scores
            pairing its lists as it does).
    """
    from mteb.types import RetrievalEvaluationResult

    if any(not qrels.get(q, True) for q in results):
        # pytrec_eval skips a query judged on nothing while mteb's MRR and confidence lists keep it: mteb's own
        # function fails or pairs the lists as it does; such queries never reach it from a task (mteb drops them)
        plain = results.to_dict() if isinstance(results, RankedLists) else results
        return _MTEBS(plain, qrels, k_values, skip_first_result)
    runs = runs_of(results)
    if skip_first_result:
        runs = skip_first(runs)
    k_values = list(k_values)
    trec, mrr, confidence = _all_measures(runs, qrels, k_values)
    n = len(runs.query_ids)
    means = {
        name: {f"{label}@{k}": round(_mean(trec[f"{key}_{k}"], n), 5) for k in k_values}
        for name, (label, key) in {
            "ndcg": ("NDCG", "ndcg_cut"), "map": ("MAP", "map_cut"), "recall": ("Recall", "recall"),
            "precision": ("P", "P"), "hit_rate": ("HitRate", "success"),
        }.items()
    }  # fmt: skip
    by_metric = {
        f"{label}@{k}": trec[f"{key}_{k}"]
        for label, key in (("NDCG", "ndcg_cut"), ("MAP", "map_cut"), ("Recall", "recall"), ("P", "P"))
        for k in k_values
    }
    return RetrievalEvaluationResult(
        all_scores=PerQueryScores(runs.query_ids, trec),
        ndcg=means["ndcg"],
        map=means["map"],
        recall=means["recall"],
        precision=means["precision"],
        naucs=naucs(confidence, by_metric),
        mrr={name: _mean(values, len(values)) for name, values in mrr.items()},
        naucs_mrr=naucs(confidence, mrr),
        hit_rate=means["hit_rate"],
    )
