"""Sequence-classification evaluation: labelled texts through any classifier backend, with metrics.

Data is a :class:`LabelledTexts`: the packaged ``PangLeePolarity`` sentences, or your own file
(``--data FILE``, schema ``classification``: ``text``, ``label``; see :mod:`vllm_eval.tasks.owndata`).
:func:`run_classification` maps the data's labels onto the model's (by name, case-insensitive, or by
index), scores accuracy, macro-F1, per-class precision/recall/F1 and log-loss (scikit-learn), and
writes ``results.json`` and ``samples.jsonl`` as the generative tasks do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UnknownNameError, UsageError
from . import data


@dataclass(frozen=True)
class LabelledTexts:
    """Texts with one gold label each (a class name, or an index into the model's labels)."""

    name: str
    texts: list[str]
    labels: list[str | int]
    source: str


def _pang_lee() -> LabelledTexts:
    """200 movie-review sentences (Pang & Lee 2005, gensim's copy), labelled positive or negative."""
    pairs = data.pang_lee_polarity()
    names = {"neg": "negative", "pos": "positive"}
    return LabelledTexts(
        "PangLeePolarity", [t for t, _ in pairs], [names[y] for _, y in pairs], "gensim pang_lee_polarity.cor"
    )


CLASSIFICATION_TASKS = {"PangLeePolarity": _pang_lee}


def get_classification_data(name: str) -> LabelledTexts:
    """The packaged labelled texts called ``name`` (case-insensitive).

    Raises:
        UnknownNameError: an unknown name (the known ones listed).
    """
    for key, load in CLASSIFICATION_TASKS.items():
        if key.lower() == name.lower():
            return load()
    raise UnknownNameError(f"unknown classification task {name!r}; known: {', '.join(CLASSIFICATION_TASKS)}")


def load_classification_file(path: str | Path) -> LabelledTexts:
    """A ``classification`` data file (see :mod:`vllm_eval.tasks.owndata`) as :class:`LabelledTexts`."""
    from .owndata import read_rows

    rows = read_rows(path, "classification")
    return LabelledTexts(Path(path).stem, [r["text"] for r in rows], [r["label"] for r in rows], str(path))


def label_indices(gold: list[str | int], model_labels: list[str]) -> np.ndarray:
    """Gold labels as column indices of the model's labels: names match case-insensitively, ints are indices.

    Raises:
        UsageError: a label the model does not have (the unknown ones and the model's listed).
    """
    lookup = {name.lower(): i for i, name in enumerate(model_labels)}
    out, unknown = [], []
    for g in gold:
        if isinstance(g, int) and 0 <= g < len(model_labels):
            out.append(g)
        elif isinstance(g, str) and g.lower() in lookup:
            out.append(lookup[g.lower()])
        else:
            out.append(-1)
            unknown.append(g)
    if unknown:
        shown = ", ".join(map(repr, sorted(set(map(str, unknown)))[:5]))
        raise UsageError(f"labels {shown} are not among the model's labels ({', '.join(model_labels)})")
    return np.asarray(out, dtype=np.int64)


def classification_metrics(gold: np.ndarray, probs: np.ndarray, labels: list[str]) -> dict[str, Any]:
    """Accuracy, macro-F1 and log-loss over the classes, and precision/recall/F1/support per class.

    Args:
        gold: int64 (n,) column indices of the true classes.
        probs: float (n, n_labels) class probabilities (a one-label model: (n, 1), P(label 0)).
        labels: class names, one per column.

    Macro averages run over every class of the model (a class absent from the data scores 0 and
    is reported with support 0, scikit-learn's ``zero_division=0``).
    """
    from sklearn.metrics import accuracy_score, f1_score, log_loss, precision_recall_fscore_support

    if probs.shape[1] == 1:  # one sigmoid output: P(class 0) vs not; two columns for the metrics
        probs = np.concatenate([probs, 1.0 - probs], axis=1)
        labels = [labels[0], f"not {labels[0]}"]
    classes = list(range(len(labels)))
    pred = probs.argmax(axis=1)
    p, r, f, s = precision_recall_fscore_support(gold, pred, labels=classes, zero_division=0)
    clipped = np.clip(probs.astype(np.float64), 1e-15, 1.0)
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "macro_f1": float(f1_score(gold, pred, labels=classes, average="macro", zero_division=0)),
        "log_loss": float(log_loss(gold, clipped / clipped.sum(axis=1, keepdims=True), labels=classes)),
        "n_samples": len(gold),
        "per_class": {
            name: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]), "support": int(s[i])}
            for i, name in enumerate(labels)
        },
    }


def run_classification(
    classifier: Any, task: LabelledTexts, *, limit: int | None = None, output_dir: str | Path | None = None
) -> dict[str, Any]:
    """Classify ``task``'s texts with ``classifier`` and score them against the gold labels.

    Returns:
        The results dict (``task``, ``metrics``, ``labels``, ``model``, ``seconds`` ...), also
        written to ``output_dir/results.json`` with one line per text in ``samples.jsonl`` (id,
        text, probabilities per label, predicted, target, correct).

    Raises:
        UsageError: a gold label the model does not have.
    """
    from ..evaluation.results import task_record, write_task_results

    texts, gold_names = task.texts[:limit], task.labels[:limit]
    gold = label_indices(gold_names, classifier.labels)
    start, before = time.perf_counter(), classifier.counters.copy()
    probs = classifier.classify(texts)
    seconds = time.perf_counter() - start
    metrics = classification_metrics(gold, probs, classifier.labels)
    pred = probs.argmax(axis=1)
    samples = [
        {
            "id": i,
            "text": text,
            "probs": dict(zip(classifier.labels, map(float, row), strict=False)),
            "predicted": classifier.labels[int(p)],
            "target": classifier.labels[int(g)],
            "correct": bool(p == g),
        }
        for i, (text, row, p, g) in enumerate(zip(texts, probs, pred, gold, strict=True))
    ]
    results = task_record(classifier, task, metrics, before, seconds, {"limit": limit})
    if output_dir:
        write_task_results(output_dir, results, samples)
    results["samples"] = samples
    return results
