"""The data of a benchmark replica (:mod:`vllm_eval.tasks.shaped`), drawn to the shape of mteb's descriptive
statistics: texts of the tokenizer's single-token words, labels, scores, and retrieval splits written to disk a
chunk at a time (:func:`write_retrieval`), so a split of millions of queries or gigabytes of text never sits in
memory whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UsageError
from .replica_io import CHUNK, SPLIT, atomic, write_json, write_lines

#: Words per label pool (see :meth:`Words.texts`).
TOPIC_WORDS = 40
#: Beta(m·k, (1-m)·k) over [min, max] with m the mean's position: k = 4 gives a long right tail, like
#: the text lengths of most corpora.
_BETA_K = 4.0


def single_token_words(tokenizer: Any) -> list[str]:
    """The tokenizer's whole-word, lower-case alphabetic vocabulary entries (3+ letters) that encode to
    exactly one token, sorted.

    Raises:
        UsageError: fewer than 100 such words.
    """
    candidates = [
        w for w in sorted(tokenizer.get_vocab()) if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3
    ]
    ids = tokenizer(candidates, add_special_tokens=False)["input_ids"]
    words = [w for w, x in zip(candidates, ids, strict=True) if len(x) == 1]
    if len(words) < 100:
        raise UsageError(f"tokenizer has only {len(words)} single-token words; cannot build texts")
    return words


class Words:
    """Text of a given length in characters from the tokenizer's single-token words (uniform draws)."""

    def __init__(self, tokenizer: Any) -> None:

        self.vocab = np.asarray(single_token_words(tokenizer))
        self.mean_chars = float(np.mean([len(w) for w in self.vocab]))

    def counts(self, lengths: np.ndarray) -> np.ndarray:
        """Words (int64) for texts of ``lengths`` characters (float array) each, at least one."""
        return np.maximum(1, np.rint((lengths + 1) / (self.mean_chars + 1)).astype(np.int64))

    def texts(self, rng: np.random.Generator, lengths: np.ndarray, topics: np.ndarray | None = None) -> list[str]:
        """One text per target length (characters, float array): about ``length`` characters of words.

        ``topics`` (one integer label per text): half of a text's words come from a pool of
        :data:`TOPIC_WORDS` words of its label, so texts of one label are alike (clusters and classes a
        model can find, and that float rounding cannot scramble)."""
        counts = self.counts(lengths)
        index = rng.integers(0, len(self.vocab), size=int(counts.sum()))
        if topics is not None:
            topic = np.repeat(np.asarray(topics), counts)
            mine = rng.random(len(index)) < 0.5
            index[mine] = (topic[mine] * TOPIC_WORDS + rng.integers(0, TOPIC_WORDS, size=int(mine.sum()))) % len(
                self.vocab
            )
        words = self.vocab[index]
        ends = np.cumsum(counts)
        return [" ".join(words[e - c : e]) for c, e in zip(counts, ends, strict=True)]


def _lengths(rng: np.random.Generator, stats: dict[str, Any] | None, n: int, default: float = 64.0) -> np.ndarray:
    if not stats:
        return np.full(n, default)
    lo, mean, hi = (float(stats[k]) for k in ("min_text_length", "average_text_length", "max_text_length"))
    if hi <= lo:
        return np.full(n, max(lo, 1.0))
    m = min(max((mean - lo) / (hi - lo), 0.01), 0.99)
    return lo + (hi - lo) * rng.beta(m * _BETA_K, (1 - m) * _BETA_K, size=n)


def _labels(rng: np.random.Generator, stats: dict[str, Any] | None, n: int, at_least: int = 0) -> np.ndarray:
    """``n`` integer labels in the proportions of ``stats['labels']``, each label ``at_least`` times."""
    counts = np.array([float(v.get("count", 1)) for v in ((stats or {}).get("labels") or {"0": {}, "1": {}}).values()])
    k = len(counts)
    fixed = np.repeat(np.arange(k), at_least)
    rest = rng.choice(k, size=max(n - len(fixed), 0), p=counts / counts.sum())
    out = np.concatenate([fixed, rest])[: max(n, len(fixed))]
    rng.shuffle(out)
    return out


def _scaled(n: Any, fraction: float, floor: int) -> int:
    return max(int(round(float(n or 0) * fraction)), min(floor, int(n or floor)))


def _count(s: dict[str, Any], what: str) -> int:
    """Documents or queries of a retrieval split: ``num_<what>``, else total / mean text length (older
    statistics files lack the count)."""
    if s.get(f"num_{what}"):
        return int(s[f"num_{what}"])
    text = s.get(f"{what}_text_statistics") or {}
    return int(round(text["total_text_length"] / text["average_text_length"]))


def _columns(task: Any) -> tuple[str, ...]:
    """The columns of a replica split of a task that is not retrieval: its texts' columns, then the score or
    label column."""
    kind = task.metadata.type
    if kind == "STS":
        first, second = task.column_names[:2] if isinstance(task.column_names[0], str) else ("sentence1", "sentence2")
        return first, second, "score"
    if kind == "PairClassification":
        return task.input1_column_name, task.input2_column_name, task.label_column_name
    return task.input_column_name, task.label_column_name


def _pairs(rng, words: Words, s: dict[str, Any], fraction: float, task: Any) -> dict[str, Any]:
    n = _scaled(s["num_samples"], fraction, 20)
    one = words.texts(rng, _lengths(rng, s.get("text1_statistics"), n))
    two = words.texts(rng, _lengths(rng, s.get("text2_statistics"), n))
    first, second, target = _columns(task)
    if task.metadata.type == "STS":
        label = s.get("label_statistics") or {}
        low, high = float(label.get("min_score", task.min_score)), float(label.get("max_score", task.max_score))
        return {first: one, second: two, target: rng.uniform(low, high, size=n).round(2).tolist()}
    labels = _labels(rng, s.get("labels_statistics"), n, at_least=1)
    return {first: one, second: two, target: labels.tolist()}


def _labelled(rng, words: Words, s: dict[str, Any], fraction: float, task: Any, at_least: int) -> dict[str, Any]:
    label_stats = s.get("label_statistics") or s.get("labels_statistics")
    n_labels = len((label_stats or {}).get("labels") or {0: 0, 1: 0})
    n = max(_scaled(s["num_samples"], fraction, 20), n_labels * at_least)
    labels = _labels(rng, label_stats, n, at_least=at_least)
    texts = words.texts(rng, _lengths(rng, s.get("text_statistics"), len(labels)), topics=labels)
    text, label = _columns(task)
    return {text: texts, label: labels.tolist()}


def _starts(sizes: np.ndarray) -> np.ndarray:
    """Where each segment of ``sizes`` starts in their concatenation (int64, one per segment)."""
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def _within(sizes: np.ndarray) -> np.ndarray:
    """0, 1, ... size-1 for each segment, concatenated."""
    return np.arange(int(sizes.sum())) - np.repeat(_starts(sizes), sizes)


def distinct(
    rng: np.random.Generator, n: int, sizes: np.ndarray, fixed: np.ndarray | None = None, fixed_sizes: Any = None
) -> np.ndarray:
    """Segments of ``sizes`` distinct integers in ``[0, n)`` each (``sizes <= n``), concatenated (int64).

    ``fixed`` (concatenated segments of ``fixed_sizes``, distinct within each): each segment starts with its fixed
    values, the rest differ from them. Drawn for all segments at once, then only the repeats again: a Python
    loop per segment is too slow for millions of queries; dense segments (over a quarter of ``n``) are permuted."""
    sizes = np.asarray(sizes, dtype=np.int64)
    seg = np.repeat(np.arange(len(sizes)), sizes)
    out = rng.integers(0, n, size=len(seg))
    starts = _starts(sizes)
    fixed_sizes = np.zeros(len(sizes), dtype=np.int64) if fixed is None else np.asarray(fixed_sizes, dtype=np.int64)
    fixed_starts = _starts(fixed_sizes)
    if fixed is not None:
        out[np.repeat(starts, fixed_sizes) + _within(fixed_sizes)] = fixed
    dense = np.flatnonzero(sizes * 4 > n)
    for s in dense.tolist():
        head = fixed[fixed_starts[s] : fixed_starts[s] + fixed_sizes[s]] if fixed is not None else []
        perm = rng.permutation(n)
        rest = perm[~np.isin(perm, head)][: sizes[s] - len(head)]
        out[starts[s] + len(head) : starts[s] + sizes[s]] = rest
    todo = np.flatnonzero(~np.isin(seg, dense))
    while len(todo):
        # np.unique's first index of a value is its first occurrence: fixed values, placed first, are never redrawn.
        _, first = np.unique(seg[todo] * n + out[todo], return_index=True)
        again = np.ones(len(todo), dtype=bool)
        again[first] = False
        redraw = todo[again]
        if not len(redraw):
            break
        out[redraw] = rng.integers(0, n, size=len(redraw))
        todo = todo[np.isin(seg[todo], seg[redraw])]
    return out


def _line(name: str, text: str) -> str:
    # Words are ASCII letters (single_token_words), ids letters, digits and "_": nothing JSON must escape.
    return f'{{"id":"{name}","text":"{text}"}}'


def _json_line(name: str, text: str) -> str:
    return json.dumps({"id": name, "text": text}, separators=(",", ":"))


def write_retrieval(folder: Path, rng: np.random.Generator, words: Words, s: dict[str, Any], fraction: float) -> None:
    """Write a retrieval split of the shape of ``s`` (its statistics) into ``folder`` (files in
    :mod:`vllm_eval.tasks.replica_io`): corpus ``d<i>``, queries ``q<i>_0`` (MindSmall's scoring splits ids on "_"),
    each query spans of its relevant documents in turn (a span of each, so every relevant document shares words
    with the query and outranks the rest by a margin that float rounding of another backend cannot reorder), and
    the candidates per query (relevant first) where the statistics have them. ``split.json`` is written last."""
    n_docs = _scaled(_count(s, "documents"), fraction, 50)
    n_queries = _scaled(_count(s, "queries"), fraction, 10)
    rel = s.get("relevant_docs_statistics") or {}
    lo = max(int(rel.get("min_relevant_docs_per_query") or 1), 1)
    mean = float(rel.get("average_relevant_docs_per_query") or lo)
    hi = max(int(rel.get("max_relevant_docs_per_query") or lo), lo)
    lo = min(lo, int(mean)) or 1
    shape = {"min_text_length": lo, "average_text_length": mean, "max_text_length": hi}
    n_rel = np.clip(np.rint(_lengths(rng, shape, n_queries)), 1, n_docs).astype(np.int64)
    doc_words = words.counts(_lengths(rng, s.get("documents_text_statistics"), n_docs))
    want = words.counts(_lengths(rng, s.get("queries_text_statistics"), n_queries))
    relevant = distinct(rng, n_docs, n_rel)
    query_of = np.repeat(np.arange(n_queries), n_rel)
    # A query takes `per` words from each of its first `want` relevant documents, from a random start, cyclically.
    used = np.flatnonzero(_within(n_rel) < want[query_of])
    per = np.maximum(1, want // n_rel)[query_of[used]]
    span_doc = relevant[used]
    span_start = np.floor(rng.random(len(used)) * (np.maximum(doc_words[span_doc] - per, 0) + 1)).astype(np.int64)
    span_at = _starts(per)  # spans are in query order: a query's words are its spans', one after another
    query_words = np.empty(int(per.sum()), dtype=np.int32)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = words.vocab.tolist()
    line = _line if all(w.isascii() and w.isalnum() for w in vocab) else _json_line
    by_doc = np.argsort(span_doc, kind="stable")
    doc_ends = np.searchsorted(span_doc[by_doc], np.arange(0, n_docs + CHUNK, CHUNK))

    def corpus():
        for c, d0 in enumerate(range(0, n_docs, CHUNK)):
            counts = doc_words[d0 : d0 + CHUNK]
            index = rng.integers(0, len(vocab), size=int(counts.sum())).astype(np.int32)
            mine = by_doc[doc_ends[c] : doc_ends[c + 1]]
            reps = per[mine]
            offset = _within(reps)
            length = np.repeat(doc_words[span_doc[mine]], reps)
            source = np.repeat(_starts(counts)[span_doc[mine] - d0], reps)
            taken = index[source + (np.repeat(span_start[mine], reps) + offset) % length]
            query_words[np.repeat(span_at[mine], reps) + offset] = taken
            yield (line(f"d{d0 + i}", t) for i, t in enumerate(_join(vocab, index, counts)))

    def queries():
        lengths = np.bincount(query_of[used], weights=per, minlength=n_queries).astype(np.int64)
        starts = _starts(lengths)
        for q0 in range(0, n_queries, CHUNK):
            counts = lengths[q0 : q0 + CHUNK]
            index = query_words[starts[q0] : starts[q0] + int(counts.sum())]
            yield (line(f"q{q0 + i}_0", t) for i, t in enumerate(_join(vocab, index, counts)))

    write_lines(folder / "corpus.jsonl", corpus())
    write_lines(folder / "queries.jsonl", queries())
    qrels = np.stack([query_of, relevant, np.ones_like(relevant)], axis=1).astype(np.int32)
    with atomic(folder / "qrels.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, qrels)
    top = (s.get("top_ranked_statistics") or {}).get("average_top_ranked_per_query")
    total = _write_top_ranked(folder, rng, n_docs, relevant, n_rel, int(top)) if top else None
    write_json(folder / SPLIT, {"corpus": n_docs, "queries": n_queries, "qrels": len(qrels), "top_ranked": total})


def _write_top_ranked(
    folder: Path, rng: np.random.Generator, n_docs: int, relevant: np.ndarray, n_rel: np.ndarray, top: int
) -> int:
    """Write each query's candidates: its relevant documents, then others, ``max(top, relevant)`` in all (at most the
    corpus), a chunk of queries at a time into a file mapped in memory. Returns the candidates in all."""
    sizes = np.minimum(np.maximum(top, n_rel), n_docs).astype(np.int32)
    total = int(sizes.sum())
    rel_starts = _starts(n_rel)
    with atomic(folder / "top_ranked_counts.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, sizes)
    with atomic(folder / "top_ranked.npy") as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(total,))
        at = 0
        for q0 in range(0, len(sizes), CHUNK):
            q1 = min(q0 + CHUNK, len(sizes))
            fixed = relevant[rel_starts[q0] : rel_starts[q0] + int(n_rel[q0:q1].sum())]
            chunk = distinct(rng, n_docs, sizes[q0:q1], fixed, n_rel[q0:q1])
            out[at : at + len(chunk)] = chunk
            at += len(chunk)
        out.flush()
        del out
    return total


def _join(vocab: list[str], index: np.ndarray, counts: np.ndarray) -> list[str]:
    """The texts of ``counts`` words each, the words ``vocab[index]`` in order."""
    words = list(map(vocab.__getitem__, index.tolist()))
    ends = np.cumsum(counts).tolist()
    return [" ".join(words[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
