"""mteb's ``max_over_subqueries`` (MindSmallReranking's main score) on arrays.

MindSmallReranking splits each impression into subqueries ``<impression>_<n>``; mteb merges each impression's
results (every document once, its best score over the subqueries, in the order documents first appear) and
scores the merged lists against the last subquery's qrels, building a dict per document in Python. Here the
merge is a sort of (impression, document) keys; the merged lists are scored by
:func:`~vllm_eval.evaluation.scoring.retrieval.calculate_retrieval_scores`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...models.ranked import RankedLists
from ...utils import forked as ahead
from .arrays import Runs, runs_of
from .retrieval import calculate_retrieval_scores


def merge_subqueries(qrels: Mapping[str, Any], results: Mapping[str, Mapping[str, float]]) -> tuple[RankedLists, dict]:
    """The merged results and qrels of mteb's ``max_over_subqueries``: one query per prefix of the qrels' query
    ids (all but the last ``_``-separated part), in order of first appearance.

    Raises:
        KeyError: a query of ``qrels`` without results (as mteb).
    """
    runs: Runs = runs_of(results)
    ids = list(qrels)
    index: dict[str, int] = {}
    # "_".join(qid.split("_")[:-1]), mteb's prefix, is everything before the last "_" ("" without one)
    bases = np.fromiter((index.setdefault(q.rpartition("_")[0], len(index)) for q in ids), np.int64, len(ids))
    names = list(index)
    last = dict(zip((names[b] for b in bases.tolist()), ids, strict=True))  # mteb keeps the last subquery's qrels
    merged_qrels = {b: qrels[q] for b, q in last.items()}
    if runs.query_ids == ids and len(names) == len(ids):  # one subquery each: nothing to merge
        return RankedLists(names, runs.offsets, runs.docs, runs.scores, runs.names), merged_qrels
    row = {q: i for i, q in enumerate(runs.query_ids)}
    rows = np.fromiter((row[q] for q in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(bases, kind="stable")  # each base's subqueries together, in qrels order
    rows, bases = rows[order], bases[order]
    counts = runs.counts[rows]
    pairs = np.repeat(runs.offsets[rows] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    base, doc, score = np.repeat(bases, counts), runs.docs[pairs], runs.scores[pairs]
    # one entry per (base, document): its best score, at the place where the document first appears
    key = base * max(len(runs.names), 1) + doc
    by_key = np.argsort(key, kind="stable")
    starts = np.flatnonzero(np.r_[True, key[by_key][1:] != key[by_key][:-1]]) if len(key) else by_key
    best = np.maximum.reduceat(score[by_key], starts) if len(key) else score
    first = by_key[starts]
    keep = np.argsort(first)  # bases are concatenated in order: first appearance orders bases, then documents
    merged_base = base[first][keep]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(merged_base, minlength=len(names)))]).astype(np.int64)
    return RankedLists(names, offsets, doc[first][keep], best[keep], runs.names), merged_qrels


def max_over_subqueries(
    qrels: Mapping[str, Any], results: Mapping[str, Mapping[str, float]], k_values: Sequence[int]
) -> dict[str, float]:
    """mteb's ``max_over_subqueries``: the retrieval scores of the merged subqueries (:func:`merge_subqueries`),
    each named ``max_over_subqueries_<score>``, the same numbers as mteb's; taken from a child process where
    :func:`start_ahead` began them with these same objects."""
    found, scores = ahead.take(_max_over_subqueries, qrels, results, k_values)
    return scores if found else _max_over_subqueries(qrels, results, k_values)


def start_ahead(qrels: Mapping[str, Any], results: Mapping[str, Mapping[str, float]], k_values: Sequence[int]) -> bool:
    """Begin :func:`max_over_subqueries` of these objects in a forked child (:mod:`vllm_eval.utils.forked`) while
    this process scores the subqueries themselves; False where no child was started."""
    return ahead.start(_max_over_subqueries, qrels, results, k_values)


def _max_over_subqueries(
    qrels: Mapping[str, Any], results: Mapping[str, Mapping[str, float]], k_values: Sequence[int]
) -> dict[str, float]:
    from mteb._evaluators.retrieval_metrics import make_score_dict

    merged, merged_qrels = merge_subqueries(qrels, results)
    _, ndcg, _map, recall, precision, naucs, mrr, naucs_mrr, hit_rate = calculate_retrieval_scores(
        merged, merged_qrels, k_values
    )
    scores = make_score_dict(
        ndcg=ndcg, _map=_map, recall=recall, precision=precision, naucs=naucs, mrr=mrr, naucs_mrr=naucs_mrr,
        hit_rate=hit_rate, task_scores={},
    )  # fmt: skip
    return {"max_over_subqueries_" + k: v for k, v in scores.items()}
