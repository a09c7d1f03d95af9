"""Named-entity recognition (token classification) evaluation with seqeval's entity-level metrics.

Data: CoNLL files (``word ... tag`` per line, the tag in the last column, blank lines between
sentences, ``-DOCSTART-`` lines skipped) or the ``ner`` schema of :mod:`vllm_eval.tasks.owndata`
(JSONL/CSV/Parquet rows of ``tokens`` and ``tags``). :func:`run_token_classification` tags every
sentence (first sub-token per word), then scores entity spans with ``seqeval``: the CoNLL-2000
``conlleval`` way (lenient: an ``I-`` after ``O`` opens an entity, BIO) and strictly under IOB2;
results go to ``results.json`` and ``samples.jsonl`` as for the other task runners.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import DataUnavailableError, UsageError


@dataclass(frozen=True)
class TaggedSentences:
    """Sentences as word lists, each with one gold tag per word."""

    name: str
    sentences: list[list[str]]
    tags: list[list[str]]
    source: str


def read_conll(path: str | Path) -> TaggedSentences:
    """A CoNLL-format file: columns separated by spaces or tabs, word first and tag last, blank lines between
    sentences (UTF-8; a byte-order mark and CRLF line ends are accepted).

    Raises:
        DataUnavailableError: no such file.
        UsageError: a directory, bytes that are not UTF-8, a line with fewer than two columns (file and line
            named), or no sentences.
    """
    from ..utils.files import read_text

    path = Path(path)
    if not path.exists():
        raise DataUnavailableError(f"--data {str(path)!r}: no such file")
    sentences: list[list[str]] = []
    tags: list[list[str]] = []
    words: list[str] = []
    labels: list[str] = []
    # Columns split at spaces and tabs only: str.split() would also split a word at a no-break space.
    for n, line in enumerate(read_text(path).split("\n"), start=1):
        cols = [c for c in re.split(r"[ \t]+", line.strip(" \t\r")) if c]
        if not cols or cols[0] == "-DOCSTART-":
            if words:
                sentences.append(words)
                tags.append(labels)
                words, labels = [], []
            continue
        if len(cols) < 2:
            raise UsageError(f"{path}:{n}: a CoNLL line needs a word and a tag, got {line.strip()!r:.60}")
        words.append(cols[0])
        labels.append(cols[-1])
    if words:
        sentences.append(words)
        tags.append(labels)
    if not sentences:
        raise UsageError(f"--data {str(path)!r} has no sentences")
    return TaggedSentences(path.stem, sentences, tags, str(path))


def load_ner_file(path: str | Path) -> TaggedSentences:
    """A CoNLL file (``.conll``, ``.txt``) or an ``ner``-schema table (``.jsonl``, ``.csv``, ``.parquet``).

    Raises:
        DataUnavailableError: no such file.
        UsageError: a row whose tokens or tags are not non-empty strings, or differ in number (file and line
            named), or a malformed file.
    """
    path = Path(path)
    if path.suffix.lower() in (".conll", ".txt"):
        return read_conll(path)
    from .owndata import check_str_list, read_rows, where
    from .tables import FORMATS

    if path.suffix.lower() not in FORMATS:
        raise UsageError(
            f"--data {str(path)!r}: use a CoNLL file (.conll, .txt) or a .jsonl, .json, .csv, .tsv or .parquet"
        )
    rows = read_rows(path, "ner")
    check_str_list(path, rows, "tokens", min_len=1)
    check_str_list(path, rows, "tags", min_len=1)
    for i, row in enumerate(rows):
        if len(row["tokens"]) != len(row["tags"]):
            raise UsageError(f"{where(path, i)}: {len(row['tokens'])} tokens but {len(row['tags'])} tags")
    return TaggedSentences(path.stem, [r["tokens"] for r in rows], [r["tags"] for r in rows], str(path))


def ner_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, Any]:
    """Entity-level precision, recall and F1 (micro) with seqeval, the conlleval way and strict IOB2,
    per entity type (conlleval way), and token accuracy."""
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    return {
        "precision": float(precision_score(gold, predicted, zero_division=0)),
        "recall": float(recall_score(gold, predicted, zero_division=0)),
        "f1": float(f1_score(gold, predicted, zero_division=0)),
        "f1_strict_iob2": float(f1_score(gold, predicted, mode="strict", scheme=IOB2, zero_division=0)),
        "token_accuracy": float(accuracy_score(gold, predicted)),
        "n_sentences": len(gold),
        "per_type": {
            k: {m: float(v[m]) if m != "support" else int(v[m]) for m in ("precision", "recall", "f1-score", "support")}
            for k, v in report.items()
            if not k.endswith(" avg")
        },
    }


def run_token_classification(
    tagger: Any, task: TaggedSentences, *, limit: int | None = None, output_dir: str | Path | None = None
) -> dict[str, Any]:
    """Tag ``task``'s sentences with ``tagger`` (a token-classifier backend) and score the entities.

    Raises:
        UsageError: gold tags the model does not have (listed with the model's labels).
    """
    from ..evaluation.results import task_record, write_task_results

    sentences, gold = task.sentences[:limit], task.tags[:limit]
    unknown = sorted({t for row in gold for t in row} - set(tagger.labels))
    if unknown:
        raise UsageError(
            f"tags {', '.join(map(repr, unknown[:5]))} are not among the model's labels ({', '.join(tagger.labels)})"
        )
    start, before = time.perf_counter(), tagger.counters.copy()
    predicted = tagger.tag(sentences)
    seconds = time.perf_counter() - start
    samples = [
        {"id": i, "tokens": words, "predicted": p, "target": g, "correct": p == g}
        for i, (words, p, g) in enumerate(zip(sentences, predicted, gold, strict=True))
    ]
    config = {"limit": limit, "word_label": "first sub-token"}
    results = task_record(tagger, task, ner_metrics(gold, predicted), before, seconds, config)
    if output_dir:
        write_task_results(output_dir, results, samples)
    results["samples"] = samples
    return results
