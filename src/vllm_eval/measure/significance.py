"""Whether a difference between two runs of the same task is more than resampling noise: a paired bootstrap over
the task's units (queries, pairs, test samples).

Method: the paired bootstrap of Efron and Tibshirani (*An Introduction to the Bootstrap*, 1993, ch. 16), as NLP
uses it to compare two systems on one test set (Koehn, EMNLP 2004; Berg-Kirkpatrick et al., EMNLP 2012). The
units are drawn with replacement, the same draw for both runs; each draw's statistic (the task's main score
recomputed on the drawn units: a mean, Spearman's rho, an accuracy, an average precision) gives one difference
``b - a``. The 95 % interval is the percentile interval of those differences; the two-sided p-value is that of the
shifted null (the differences centred on 0): ``(1 + #{|d* - d| >= |d|}) / (1 + R)`` for the observed difference ``d``
and the ``R`` resampled ``d*``. Deterministic for a seed; vectorised over resamples (chunks of resamples as index
matrices), so the offline suite's tasks take well under a second each.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["METHOD", "STATISTICS", "Difference", "compare_runs", "paired_bootstrap", "sweep_significance"]

#: How the numbers below are computed, written beside them.
METHOD = (
    "paired bootstrap over the task's units (Efron & Tibshirani 1993; Koehn 2004): percentile 95 % interval of "
    "b - a, two-sided p-value against the shifted null"
)

#: Entries of index matrices built at once: bounds the memory of one chunk of resamples (8-byte indices).
_CHUNK_ENTRIES = 4_000_000


def _mean(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return values[idx].mean(axis=-1)


def _ratio(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """A ratio of sums over the drawn units: ``values[:, 0]`` summed over ``values[:, 1]`` summed (WER: word errors
    over reference words; micro F1: twice the true positives over predicted plus gold entities); nan where the
    denominator sums to 0."""
    drawn = values[idx]
    num, den = drawn[..., 0].sum(axis=-1), drawn[..., 1].sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _counts(idx: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    """Each draw (a row of ``idx``, indices into ``n`` units) as how often it drew each unit: (R, n) floats; and
    whether ``idx`` was one draw (1-D). The rank statistics below work on counts: one sort of the units serves every
    draw (a unit drawn twice is a tie with itself), O(R n) instead of a sort per draw."""
    single = idx.ndim == 1
    idx = np.atleast_2d(idx)
    rows = idx.shape[0]
    flat = (idx + n * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64), single


def _groups(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``values``' ascending order (stable), and the tie groups of the sorted values: first and last position of
    each, and each sorted position's group."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(values)] - 1
    return order, starts, ends, np.cumsum(first) - 1


def _ranks(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each unit's average rank (1-based, ties averaged: ``scipy.stats.rankdata``) among the units a draw holds,
    per draw: (R, n) (a unit not drawn gets a rank that its zero count cancels)."""
    order, starts, ends, group = _groups(values)
    cum = np.cumsum(counts[:, order], axis=1)
    before = np.where(starts > 0, cum[:, np.maximum(starts - 1, 0)], 0.0)
    ranked = (before + (cum[:, ends] - before + 1) / 2)[:, group]
    out = np.empty_like(ranked)
    out[:, order] = ranked
    return out


def _correlation(counts: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of ``x`` and ``y`` (each (R, n) or (n,)) over the units each draw holds, weighted by counts."""
    total = counts.sum(axis=1, keepdims=True)
    cx = x - (counts * x).sum(axis=1, keepdims=True) / total
    cy = y - (counts * y).sum(axis=1, keepdims=True) / total
    cov = (counts * cx * cy).sum(axis=1)
    norm = np.sqrt((counts * cx**2).sum(axis=1) * (counts * cy**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, cov / norm, np.nan)


def _spearman(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Spearman's rho of ``values[:, 0]`` (gold) and ``values[:, 1]`` (predicted) over each row of ``idx``: the
    Pearson correlation of average ranks, as ``scipy.stats.spearmanr`` (which mteb's STS scores with)."""
    counts, single = _counts(idx, len(values))
    rho = _correlation(counts, _ranks(counts, values[:, 0]), _ranks(counts, values[:, 1]))
    return rho[0] if single else rho


def _pearson(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Pearson's r of ``values[:, 0]`` and ``values[:, 1]`` over each row of ``idx`` (``scipy.stats.pearsonr``)."""
    counts, single = _counts(idx, len(values))
    r = _correlation(counts, values[:, 0], values[:, 1])
    return r[0] if single else r


def _ap_of_counts(counts: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """scikit-learn's ``average_precision_score`` of ``labels`` (0/1) ranked by ``scores`` over the units each draw
    holds: at each distinct score (a tie group), from the highest, the precision so far weighted by the recall the
    group adds."""
    order, _, ends, _ = _groups(-scores)
    drawn = counts[:, order]
    tp = np.cumsum(drawn * labels[order], axis=1)[:, ends]
    seen = np.cumsum(drawn, axis=1)[:, ends]
    added = np.diff(tp, axis=1, prepend=0.0)
    positives = tp[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(seen > 0, tp / seen, 0.0)
        return np.where(positives > 0, (added * precision).sum(axis=1) / positives, np.nan)


def _average_precision(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """scikit-learn's ``average_precision_score`` of labels ``values[:, 0]`` (0/1) ranked by scores ``values[:, 1]``
    over each row of ``idx``."""
    counts, single = _counts(idx, len(values))
    ap = _ap_of_counts(counts, values[:, 0], values[:, 1])
    return ap[0] if single else ap


def _max_average_precision(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """mteb's pair-classification ``max_ap``: the largest average precision of labels ``values[:, 0]`` ranked by
    each score column ``values[:, 1:]`` (distances negated), over each row of ``idx``."""
    counts, single = _counts(idx, len(values))
    best = np.max([_ap_of_counts(counts, values[:, 0], values[:, c]) for c in range(1, values.shape[1])], axis=0)
    return best[0] if single else best


#: The statistics a task's main score is recomputed with on each resample: name -> (units array, index array of
#: shape (..., n)) -> statistic of shape (...). ``mean``: units (n,), e.g. per-query nDCG@10 or per-sample
#: correctness; ``spearman``: (n, 2) gold and predicted similarity; ``average_precision``: (n, 2) 0/1 label and score;
#: ``ratio``: (n, 2) numerator and denominator, summed each (WER, micro F1).
STATISTICS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "mean": _mean,
    "spearman": _spearman,
    "average_precision": _average_precision,
    "pearson": _pearson,
    "max_average_precision": _max_average_precision,
    "ratio": _ratio,
}


@dataclass(frozen=True)
class Difference:
    """One task's difference of two runs, ``b - a``.

    Attributes:
        statistic: the :data:`STATISTICS` name the main score was recomputed with.
        a, b: each run's statistic on all its units (the main score, for a mean up to mteb's rounding).
        delta: ``b - a``.
        low, high: the percentile interval of the resampled differences (``confidence``, default 95 %).
        p_value: two-sided, against the shifted null (:data:`METHOD`).
        n: units; resamples: how many draws; seed: the generator's seed.
    """

    statistic: str
    a: float
    b: float
    delta: float
    low: float
    high: float
    p_value: float
    n: int
    resamples: int
    seed: int
    confidence: float = 0.95

    @property
    def significant(self) -> bool:
        """Whether the interval leaves out 0 (at ``confidence``)."""
        return bool(self.low > 0 or self.high < 0)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


def paired_bootstrap(
    a: np.ndarray | list[np.ndarray],
    b: np.ndarray | list[np.ndarray],
    statistic: str = "mean",
    *,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Difference:
    """The paired bootstrap of ``statistic`` between two runs' units (:data:`METHOD`).

    Args:
        a, b: the two runs' units, aligned (row ``i`` of each is the same query, pair or sample): float arrays of
            shape (n,) for ``mean``, (n, 2) for ``spearman``, ``pearson`` and ``average_precision``, (n, 1 + k)
            for ``max_average_precision`` (see :data:`STATISTICS`). Or lists of such arrays, one per group (an
            mteb task's subsets and splits, whose main score is the mean of the groups'): each group is drawn
            from on its own and the statistic is the mean of the groups'.
        statistic: a :data:`STATISTICS` name.
        resamples: draws of ``n`` units with replacement, at least 100.
        seed: the draws' seed (``numpy.random.default_rng``): equal inputs and seed give equal results.
        confidence: the interval's coverage, in (0, 1).

    Returns:
        A :class:`Difference` (``n``: the units of every group).

    Raises:
        ValueError: an unknown statistic, runs of different shapes, no units, fewer than 100 resamples, a
            confidence outside (0, 1), or a statistic that is undefined on all the units (nan).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(STATISTICS)}, got {statistic!r}")
    groups_a = [np.asarray(g, dtype=np.float64) for g in (a if isinstance(a, list) else [a])]
    groups_b = [np.asarray(g, dtype=np.float64) for g in (b if isinstance(b, list) else [b])]
    if [g.shape for g in groups_a] != [g.shape for g in groups_b]:
        shapes = [g.shape for g in groups_a], [g.shape for g in groups_b]
        raise ValueError(f"the runs' units differ in shape: {shapes[0]} and {shapes[1]} (not the same task's units?)")
    if not groups_a or not all(len(g) for g in groups_a):
        raise ValueError("no units to resample")
    if resamples < 100 or not 0 < confidence < 1:
        raise ValueError(f"resamples must be >= 100 and confidence in (0, 1), got {resamples} and {confidence}")
    fn = STATISTICS[statistic]
    stat_a = float(np.mean([fn(g, np.arange(len(g))) for g in groups_a]))
    stat_b = float(np.mean([fn(g, np.arange(len(g))) for g in groups_b]))
    if np.isnan(stat_a) or np.isnan(stat_b):
        raise ValueError(f"{statistic} is undefined on these units (constant values, or no positive label)")
    rng = np.random.default_rng(seed)
    d = np.zeros(resamples)
    for ga, gb in zip(groups_a, groups_b, strict=True):
        n = len(ga)
        per_chunk = max(1, min(resamples, _CHUNK_ENTRIES // n))
        for start in range(0, resamples, per_chunk):
            idx = rng.integers(0, n, size=(min(per_chunk, resamples - start), n))
            d[start : start + len(idx)] += fn(gb, idx) - fn(ga, idx)
    d = d[~np.isnan(d)] / len(groups_a)  # a draw on which the statistic is undefined (all ties) says nothing
    delta = stat_b - stat_a
    tail = (1 - confidence) / 2
    low, high = np.quantile(d, [tail, 1 - tail]) if len(d) else (np.nan, np.nan)
    p = (1 + int(np.sum(np.abs(d - delta) >= abs(delta) - 1e-12))) / (1 + len(d))
    n_all = sum(len(g) for g in groups_a)
    return Difference(statistic, stat_a, stat_b, delta, float(low), float(high), min(1.0, p), n_all, resamples, seed,
                      confidence)  # fmt: skip


#: Resamples of :func:`compare_runs`: 1,000, as Koehn (2004); a full-size pair-classification task (16,000 pairs, five
#: similarities) then takes about 5 s on one core instead of 47 s at 10,000.
RUN_RESAMPLES = 1_000


def compare_runs(
    a: str | Path,
    b: str | Path,
    *,
    tasks: dict[str, str] | None = None,
    resamples: int = RUN_RESAMPLES,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """The paired bootstrap of every task both runs have units for: task -> :meth:`Difference.as_json` (``b -
    a``), or ``{"note": why none}`` for a task with units on one side only, units that do not pair (other queries,
    other sizes), or (of ``tasks``, name -> main score name) none on either side. A ``run`` folder's units are its
    ``units/<task>.npz`` (:mod:`vllm_eval.evaluation.scoring.units`); another command's are read from each task's
    ``samples.jsonl`` (:func:`~vllm_eval.evaluation.scoring.units.sample_units`).

    Raises:
        ValueError: a units file that cannot be read (named).
        UsageError: a damaged ``results.json`` (named).
    """
    units_a, units_b = _run_units(a), _run_units(b)
    out: dict[str, dict[str, Any]] = {
        task: {"note": f"no per-unit scores for its main score ({main})"}
        for task, main in (tasks or {}).items()
        if task not in units_a and task not in units_b
    }
    for task in sorted(set(units_a) | set(units_b)):
        if task not in units_a or task not in units_b:
            out[task] = {"note": f"per-unit scores in {'the second' if task in units_b else 'the first'} run only"}
            continue
        ua, ub = units_a[task](), units_b[task]()
        try:
            ga, gb = _paired_groups(ua, ub)
            diff = paired_bootstrap(ga, gb, ua["meta"]["statistic"], resamples=resamples, seed=seed)
        except ValueError as exc:
            out[task] = {"note": str(exc)}
            continue
        out[task] = {**diff.as_json(), "main_score": ua["meta"]["main_score"]}
    return out


def _run_units(folder: str | Path) -> dict[str, Callable[[], dict[str, Any]]]:
    """A run folder's units by task, each read when called: ``units/<task>.npz``, else from a task's
    ``samples.jsonl`` (the commands other than ``run``) where its main score has units."""
    import json

    from ..evaluation.scoring.units import read_units, sample_units
    from .runfiles import main_metric, read_task_runs

    found: dict[str, Callable[[], dict[str, Any]]] = {
        p.stem: functools.partial(read_units, p) for p in sorted(Path(folder, "units").glob("*.npz"))
    }
    found.update(_lm_eval_units(folder))
    for task, (record, where) in read_task_runs(folder).items():
        samples = where / "samples.jsonl"
        if task in found or not samples.is_file():
            continue
        main = main_metric(record["metrics"])
        with samples.open(encoding="utf-8") as fh:
            try:
                units = sample_units(main, [json.loads(line) for line in fh if line.strip()])
            except ValueError:  # a damaged line: no units, as for a task that keeps none
                units = None
        if units is not None:
            meta = {"task": task, "main_score": main, "statistic": units[0], "groups": ["default/test"]}
            found[task] = functools.partial(dict, meta=meta, groups={"default/test": (units[1], None)})
    return found


def _lm_eval_units(folder: str | Path) -> dict[str, Callable[[], dict[str, Any]]]:
    """A ``generate`` run of lm-eval's tasks (its ``summary.json`` names lm-eval's files): each leaf task whose main
    metric lm-eval aggregates by its mean (``acc``, ``acc_norm``, ``exact_match`` ...), its per-document values of
    that metric and filter from lm-eval's ``samples_<task>_*.jsonl``, by ``doc_id``. Groups (weighted over their
    tasks) and other aggregations (perplexities, corpus BLEU) have none."""
    import json

    from .runfiles import read_summary

    path = Path(folder) / "summary.json"
    if not path.is_file():
        return {}
    summary = read_summary(path)
    samples = summary.get("lm_eval_samples")
    if summary.get("task_framework") != "lm-eval" or not isinstance(samples, dict):
        return {}
    try:
        configs = json.loads(Path(str(summary.get("lm_eval_results"))).read_text()).get("configs") or {}
    except (OSError, ValueError):
        return {}
    found: dict[str, Callable[[], dict[str, Any]]] = {}
    for row in summary.get("scores") or []:
        task, metric = row.get("task"), row.get("main_score_name")
        aggregations = {m.get("metric"): m.get("aggregation") for m in configs.get(task, {}).get("metric_list") or []}
        if task in samples and aggregations.get(metric) == "mean":
            filt = str(row.get("task_type", "")).removeprefix("lm-eval ")
            found[task] = functools.partial(_lm_eval_task_units, Path(samples[task]), task, metric, filt)
    return found


def _lm_eval_task_units(path: Path, task: str, metric: str, filt: str) -> dict[str, Any]:
    """One lm-eval task's per-document units (see :func:`_lm_eval_units`).

    Raises:
        ValueError: a line that is not a sample record with that metric (file and line named).
    """
    import json

    values, ids = [], []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if record.get("filter", filt) == filt:
                    values.append(float(record[metric]))
                    ids.append(int(record["doc_id"]))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{n}: not an lm-eval sample with {metric!r} ({exc})") from None
    meta = {"task": task, "main_score": metric, "statistic": "mean", "groups": ["default/test"]}
    return {"meta": meta, "groups": {"default/test": (np.asarray(values), np.asarray(ids))}}


def _paired_groups(ua: dict[str, Any], ub: dict[str, Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Both runs' groups, rows in the same order (by query id where there are ids)."""
    if ua["meta"]["statistic"] != ub["meta"]["statistic"] or sorted(ua["groups"]) != sorted(ub["groups"]):
        raise ValueError("the runs recorded different units (main score, subsets or splits)")
    ga, gb = [], []
    for group in sorted(ua["groups"]):
        (va, ia), (vb, ib) = ua["groups"][group], ub["groups"][group]
        if ia is not None and ib is not None:
            if set(ia.tolist()) != set(ib.tolist()):
                raise ValueError(f"{group}: the runs scored different queries")
            order = {q: i for i, q in enumerate(ib.tolist())}
            vb = vb[[order[q] for q in ia.tolist()]]
        ga.append(va)
        gb.append(vb)
    return ga, gb


#: Bytes of the first model's units files from which :func:`sweep_significance` spreads its comparisons over processes:
#: below it, starting them costs more than it saves. The MTEB(eng, v2) replica at fraction 0.05 (540 KB of units, two
#: thirds of it pair classification's max AP) took 2.8 s per comparison on one core of this repository's 2-core CPU;
#: the offline suite's units are a few KB.
PARALLEL_UNITS_BYTES = 256 * 1024


def sweep_significance(
    labels: list[str], folders: list[Any], *, workers: int | None = None, **kwargs: Any
) -> dict[str, dict[str, Any]]:
    """Each model of a sweep against the first (:func:`compare_runs` of their folders): label -> task -> difference;
    the first model and those without a folder are left out.

    The comparisons are independent and seeded, so up to ``workers`` run at once (default: one per core, at most one
    per comparison), all but one in forked children (:mod:`vllm_eval.utils.forked`, which computes a comparison here
    where its child fails), when there are several and the first model's units reach :data:`PARALLEL_UNITS_BYTES`;
    the numbers are the same either way. Why: a sweep of eight BERT-base checkpoints on the MTEB(eng, v2) replica at
    fraction 0.05 (one H200 host, 16 cores) spent 26 s after its last model on seven comparisons done one after
    another, against 17 s for each later model (docs/bench/h200-sweep-4).
    """
    from ..utils import forked

    later = [(label, folder) for label, folder in zip(labels[1:], folders[1:], strict=True) if folder is not None]
    if not folders or folders[0] is None or not later:
        return {}
    compare = functools.partial(compare_runs, folders[0], **kwargs)
    n = _comparison_workers(len(later), folders[0], workers)
    start = time.perf_counter()
    results: list[dict[str, Any]] = []
    for at in range(0, len(later), n):
        batch = [(i, later[i][1]) for i in range(at, min(at + n, len(later)))]
        ahead = [item for item in batch[1:] if forked.start(_compare_one, compare, *item)]
        try:
            results.append(compare(batch[0][1]))
            for item in batch[1:]:
                found, value = forked.take(_compare_one, compare, *item) if item in ahead else (False, None)
                results.append(value if found else compare(item[1]))
        finally:
            for item in ahead:
                forked.cancel(_compare_one, compare, *item)
    where = f"in {n} processes" if n > 1 else "in this process"
    logger.info(
        "paired bootstrap of %d models against the first: %.1f s %s", len(later), time.perf_counter() - start, where
    )
    return dict(zip([label for label, _ in later], results, strict=True))


def _compare_one(compare: Callable[[Any], dict[str, Any]], index: int, folder: Any) -> dict[str, Any]:
    """``compare(folder)``; ``index`` (the comparison's place) keys its forked child apart from another comparison
    of the same folder object."""
    return compare(folder)


def _comparison_workers(comparisons: int, first: Any, workers: int | None) -> int:
    """Processes for ``comparisons`` of runs against the run in folder ``first`` (1: in this process)."""
    if workers is None:
        from ..engine.procenv import cpu_cores

        units = sum(p.stat().st_size for p in Path(first, "units").glob("*.npz"))
        workers = len(cpu_cores()) if units >= PARALLEL_UNITS_BYTES else 1
    return max(1, min(workers, comparisons))
