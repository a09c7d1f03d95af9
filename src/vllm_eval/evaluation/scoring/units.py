"""Per-unit scores of a task, kept beside its result for the paired bootstrap of two runs
(:mod:`vllm_eval.measure.significance`): what the main score is computed from, unit by unit.

Recorded while mteb scores a task under :func:`~vllm_eval.evaluation.scoring.fast_scoring` (the hooks are in its
patches; mteb's own scoring path, ``--scoring mteb``, records none), one array per evaluated subset and split:

============================  ===========================================  ===================================
main score                    units                                        statistic
============================  ===========================================  ===================================
retrieval, reranking          per-query nDCG@k, MAP@k, Recall@k, P@k        ``mean`` (over queries, by query id)
STS ``[cosine_]spearman``     (gold, predicted similarity) per pair         ``spearman``
STS ``[cosine_]pearson``      (gold, predicted similarity) per pair         ``pearson``
pair classification ``max_ap`` (label, 5 similarities) per pair           ``max_average_precision``
classification ``accuracy``   per test sample, correct (mean of the         ``mean``
                              experiments mteb averages)
============================  ===========================================  ===================================

Other main scores (clustering's v-measure, MRR, summarization, F1, MindSmallReranking's maximum over sub-queries)
have no per-unit file: the bootstrap says "no units" for them instead of guessing.

The commands that write ``samples.jsonl`` (generate, classify, reward, token_classify, transcribe) get theirs from
it (:func:`sample_units`): accuracy from each sample's ``correct`` (``mean``); WER from each recording's word errors
and reference words (``ratio``: errors summed over words summed, recordings whose reference normalises to nothing
left out, as the score leaves them); entity F1 from each sentence's true positives, predicted and gold entities
(``ratio``: 2 TP summed over predicted plus gold summed, seqeval's micro F1 in its default mode). BLEU and chrF (corpus
scores of n-gram counts) have none.

Files: ``<output_dir>/units/<task>.npz``: one array per ``<subset>/<split>`` group (and ``<group>#ids`` for query
ids), with a ``meta`` JSON string (task, main score, statistic, groups).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

_STATE = threading.local()
#: pytrec_eval's per-query measure names by mteb's main-score prefix.
_TREC = {"ndcg_at_": "ndcg_cut_", "map_at_": "map_cut_", "recall_at_": "recall_", "precision_at_": "P_"}
#: The similarities mteb's pair classification takes the maximum over, and whether higher means more similar.
_PAIR = (("similarity_scores", True), ("cosine_scores", True), ("manhattan_distances", False),
         ("euclidean_distances", False), ("dot_scores", True))  # fmt: skip


class _Recorder:
    def __init__(self, main_score: str) -> None:
        self.main_score = main_score
        self.group = "default/test"
        self.units: dict[str, np.ndarray] = {}
        self.ids: dict[str, np.ndarray] = {}
        self.statistic: str | None = None
        self._experiments: dict[str, list[np.ndarray]] = {}

    def put(self, statistic: str, values: np.ndarray, ids: Any = None) -> None:
        self.statistic = statistic
        self.units[self.group] = np.asarray(values, dtype=np.float64)
        if ids is not None:
            self.ids[self.group] = np.asarray([str(i) for i in ids])

    def experiment(self, correct: np.ndarray) -> None:
        runs = self._experiments.setdefault(self.group, [])
        runs.append(correct.astype(np.float64))
        self.put("mean", np.mean(runs, axis=0))


def _current() -> _Recorder | None:
    return getattr(_STATE, "recorder", None)


@contextmanager
def recording(task: Any, folder: str | Path | None) -> Iterator[None]:
    """Record ``task``'s units on this thread while mteb evaluates it inside the block, and write them to
    ``<folder>/units/<task>.npz`` when it ends without error (nothing is written without ``folder``, or when the
    main score has no units)."""
    if folder is None:
        yield
        return
    recorder = _Recorder(task.metadata.main_score)
    own = task._evaluate_subset

    def evaluate_subset(*args: Any, hf_split: str = "test", hf_subset: str = "default", **kwargs: Any) -> Any:
        recorder.group = f"{hf_subset}/{hf_split}"
        return own(*args, hf_split=hf_split, hf_subset=hf_subset, **kwargs)

    _STATE.recorder, task._evaluate_subset = recorder, evaluate_subset
    try:
        yield
    finally:
        _STATE.recorder = None
        del task._evaluate_subset
    if recorder.units and recorder.statistic is not None:
        write_units(Path(folder) / "units" / f"{task.metadata.name}.npz", task.metadata.name, recorder)


def write_units(path: Path, task: str, recorder: _Recorder) -> None:
    """Write a recorder's arrays (a temporary file renamed, so a reader never sees half a file)."""
    meta = {"task": task, "main_score": recorder.main_score, "statistic": recorder.statistic}
    meta["groups"] = sorted(recorder.units)
    arrays = {**recorder.units, **{f"{g}#ids": ids for g, ids in recorder.ids.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, meta=np.asarray(json.dumps(meta)), **arrays)
    tmp.replace(path)


def record_retrieval(result: Any) -> None:
    """Per-query values of the main score from a ``RetrievalEvaluationResult``'s ``all_scores`` (pytrec_eval's)."""
    recorder = _current()
    if recorder is None:
        return
    measure = next(
        (t + recorder.main_score[len(m) :] for m, t in _TREC.items() if recorder.main_score.startswith(m)), None
    )
    scores = result.all_scores
    if measure is None or not len(scores):
        return
    metrics = getattr(scores, "metrics", None)
    if metrics is not None and measure in metrics:  # ours: arrays already
        recorder.put("mean", metrics[measure], scores.query_ids)
        return
    ids = list(scores)
    if measure in scores[ids[0]]:
        recorder.put("mean", [scores[q][measure] for q in ids], ids)


def record_sts(scores: Any, gold: Any) -> None:
    """Gold and predicted similarity of each pair, for an STS main score ``[similarity_]pearson|spearman``."""
    recorder = _current()
    if recorder is None:
        return
    prefix, _, stat = recorder.main_score.rpartition("_")
    column = {"": "similarity_scores", "cosine": "cosine_scores", "manhattan": "manhattan_distances"}.get(prefix)
    column = column or ("euclidean_distances" if prefix == "euclidean" else None)
    if stat not in ("pearson", "spearman") or column is None:
        return
    predicted = scores.get(column)
    if predicted is None and column == "similarity_scores":  # mteb assumes cosine then
        predicted = scores["cosine_scores"]
    recorder.put(stat, np.column_stack([np.asarray(gold, float), np.asarray(predicted, float)]))


def record_pairs(similarity_scores: Any, labels: Any) -> None:
    """Each pair's label and its five similarities (distances negated), for a ``max_ap`` main score."""
    recorder = _current()
    if recorder is None or recorder.main_score != "max_ap":
        return
    columns = [np.asarray(labels, float)]
    for name, higher in _PAIR:
        values = np.asarray(similarity_scores[name], float)
        columns.append(values if higher else -values)
    recorder.put("max_average_precision", np.column_stack(columns))


def record_classification(y_test: Any, y_pred: Any) -> None:
    """One experiment's correct (1) or wrong (0) per test sample, for an ``accuracy`` main score."""
    recorder = _current()
    if recorder is None or recorder.main_score != "accuracy":
        return
    recorder.experiment(np.asarray(y_test) == np.asarray(y_pred))


def read_units(path: str | Path) -> dict[str, Any]:
    """A units file: ``{"meta": {...}, "groups": {group: (values, ids or None)}}``.

    Raises:
        ValueError: the file is not a units file of this package (named, with the reason).
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            groups = {g: (data[g], data[f"{g}#ids"] if f"{g}#ids" in data else None) for g in meta["groups"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a per-unit scores file ({exc})") from None
    return {"meta": meta, "groups": groups}


def sample_units(main_score: str, rows: list[dict[str, Any]]) -> tuple[str, np.ndarray] | None:
    """(statistic, units) of a task's ``samples.jsonl`` rows for its main score (see the module's docstring), or
    None where the main score has no units (BLEU, chrF) or the rows lack the fields."""
    try:
        if main_score == "accuracy":
            return "mean", np.asarray([float(bool(r["correct"])) for r in rows])
        if main_score == "wer":
            kept = [r for r in rows if r.get("errors") is not None]
            return "ratio", np.asarray([[r["errors"], r["reference_words"]] for r in kept], dtype=np.float64)
        if main_score == "f1":
            from seqeval.metrics.sequence_labeling import get_entities

            out = []
            for r in rows:
                predicted, gold = set(get_entities(list(r["predicted"]))), set(get_entities(list(r["target"])))
                out.append([2 * len(predicted & gold), len(predicted) + len(gold)])
            return "ratio", np.asarray(out, dtype=np.float64).reshape(-1, 2)
    except (KeyError, TypeError):
        return None
    return None
