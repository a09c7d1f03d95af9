"""mteb's abstention metrics (``evaluate_abstention``, ``nauc``, ``confidence_scores`` in
``mteb/_evaluators/retrieval_metrics.py``; the method: Gisserot-Boukhlef et al., "Towards trustworthy reranking",
arXiv:2402.12997) for all queries at once.

mteb computes each query's confidence scores from a Python list and, for every (metric, confidence)
pair, sorts the queries by confidence again. Here the confidence scores come from matrices of the
queries with the same number of results (``np.std`` of each row of a matrix is bit for bit ``np.std`` of
that row alone), each confidence is sorted once for all metrics, and each curve is then made by mteb's own
steps (a stable sort, the mean metric of each group of equal confidences, the mean above each cutoff).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...models.ranked import length_groups, worker_threads

#: mteb's abstention rates: 0.0, 0.1, ..., 0.9.
RATES = np.linspace(0, 1, 11)[:-1]
#: mteb's confidence functions, in its order.
FUNCTIONS = ("max", "std", "diff1")


def confidence_scores(runs: Any) -> dict[str, np.ndarray]:
    """Per query of ``runs`` (:class:`~vllm_eval.evaluation.scoring.arrays.Runs`): its greatest score, the
    standard deviation of its scores (in their order) and the gap between its two greatest (0 with fewer than
    two; all three 0 without scores), float64 (n_queries,) each, keyed as mteb."""
    n = len(runs.query_ids)
    out = {name: np.zeros(n) for name in FUNCTIONS}
    for length, queries in length_groups(runs.counts):
        rows = runs.scores[runs.offsets[queries][:, None] + np.arange(length)]
        top = -np.sort(-rows, axis=1)[:, :2] if length > 1 else rows
        out["max"][queries] = top[:, 0]
        out["std"][queries] = np.std(rows, axis=1)
        if length > 1:
            out["diff1"][queries] = top[:, 0] - top[:, 1]
    return out


class _Sorted:
    """One confidence array sorted once (stable, as mteb): its order and its groups of equal values."""

    def __init__(self, values: np.ndarray, oracle: bool = False) -> None:
        # The oracle curve sorts a metric by itself: the sorted values are the metric's, no order needed.
        self.order = None if oracle else np.argsort(values, stable=True)
        self.ordered = np.sort(values, kind="stable") if oracle else values[self.order]
        ordered, n = self.ordered, len(values)
        self.start = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if n else np.arange(0)
        self.size = np.diff(np.r_[self.start, n])

    def curve(self, metrics: np.ndarray | None = None) -> np.ndarray:
        """mteb's ``abstention_curve`` of ``metrics`` against this confidence (None: the oracle's own values)."""
        n = len(self.ordered)
        if n == 0:
            return np.full(len(RATES), np.nan)
        ranked = self.ordered if metrics is None else metrics[self.order]
        means = np.add.reduceat(ranked, self.start) / self.size
        ordered = np.repeat(means, self.size)
        out = np.zeros(len(RATES))
        for i, rate in enumerate(RATES):
            out[i] = ordered[min(round(rate * n), n - 1) :].mean()
        return out


def nauc(confidence: _Sorted, metrics: np.ndarray, oracle: np.ndarray | None = None) -> float:
    """mteb's ``nauc`` (normalised area under the abstention curve) of one metric against one sorted confidence;
    ``oracle``: the metric's oracle curve, when already made."""
    from sklearn.metrics import auc

    curve = confidence.curve(metrics)
    oracle = _Sorted(metrics, oracle=True).curve() if oracle is None else oracle
    area, best = auc(RATES, curve), auc(RATES, oracle)
    flat = oracle[0] * (RATES[-1] - RATES[0])
    return np.nan if best == flat else (area - flat) / (best - flat)


def naucs(confidence: dict[str, np.ndarray], metrics: dict[str, np.ndarray]) -> dict[str, float]:
    """mteb's ``evaluate_abstention``: ``nAUC_<metric>_<confidence>`` for every metric (per query, float64) and
    confidence function, in mteb's order. The sorts run on threads (numpy releases the GIL while sorting)."""
    from concurrent.futures import ThreadPoolExecutor

    if not metrics:
        return {}
    with ThreadPoolExecutor(max_workers=worker_threads()) as pool:
        by_name = dict(zip(confidence, pool.map(_Sorted, confidence.values()), strict=True))
        oracles = list(pool.map(lambda v: _Sorted(v, oracle=True).curve(), metrics.values()))
        pairs = [(m, name, o) for (m, values), o in zip(metrics.items(), oracles, strict=True) for name in FUNCTIONS]
        values = list(pool.map(lambda p: nauc(by_name[p[1]], metrics[p[0]], p[2]), pairs))
    return {f"nAUC_{m}_{name}": v for (m, name, _), v in zip(pairs, values, strict=True)}
