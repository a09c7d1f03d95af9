"""An offline replica of an mteb benchmark, shaped by the descriptive statistics mteb ships.

mteb keeps, per task, ``mteb/descriptive_stats/<type>/<task>.json``: per split (and language subset) the
number of samples, documents and queries, text lengths in characters (minimum, mean, maximum), relevant
documents and candidates per query, and the labels. :func:`build_replica` writes, for every task of a
benchmark whose type it knows, data of that shape: the same counts (times ``fraction``), text lengths
drawn from a Beta distribution stretched over the task's [minimum, maximum] with the task's mean, text
made of the model tokenizer's single-token words, labels in the task's proportions, each query made of
spans of its relevant documents, texts of one label sharing half their words. :func:`replica_tasks`
gives the benchmark's own mteb task objects with only ``load_data`` replaced to read those files, so
each task keeps its evaluator, subsets, splits, main score and settings (samples per label, documents to
embed ...): what is timed is what mteb would run on data of that size. The scores mean nothing about the
model; they are only compared between backends.

Types with a replica: Retrieval, Reranking, STS, PairClassification, Classification, Clustering; the
others (Summarization ...) are left out and named in the replica's ``replica.json``.
"""

from __future__ import annotations

import copy
import json
import random
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UsageError
from ..utils.files import check, field, json_object, list_of, read_json

TYPES = ("Retrieval", "Reranking", "STS", "PairClassification", "Classification", "Clustering")
MANIFEST = "replica.json"
#: Words per label pool (see :meth:`Words.texts`).
TOPIC_WORDS = 40
#: Beta(m·k, (1-m)·k) over [min, max] with m the mean's position: k = 4 gives a long right tail, like
#: the text lengths of most corpora.
_BETA_K = 4.0


def stats_path(task: Any) -> Path:
    """Where mteb keeps ``task``'s descriptive statistics."""
    import mteb

    return Path(mteb.__file__).parent / "descriptive_stats" / task.metadata.type / f"{task.metadata.name}.json"


def _split_stats(stats: dict[str, Any], split: str, subset: str) -> dict[str, Any] | None:
    found = stats.get(split)
    if found is None:
        return None
    return (found.get("hf_subset_descriptive_stats") or {}).get(subset, found)


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

    def texts(self, rng: np.random.Generator, lengths: np.ndarray, topics: np.ndarray | None = None) -> list[str]:
        """One text per target length (characters, float array): about ``length`` characters of words.

        ``topics`` (one integer label per text): half of a text's words come from a pool of
        :data:`TOPIC_WORDS` words of its label, so texts of one label are alike (clusters and classes a
        model can find, and that float rounding cannot scramble)."""
        counts = np.maximum(1, np.rint((lengths + 1) / (self.mean_chars + 1)).astype(int))
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


def _query(rng: np.random.Generator, sources: list[list[str]], words: Words, length: float) -> str:
    """About ``length`` characters of words: a span of each relevant document in turn, so every relevant
    document shares words with the query and outranks the rest by a margin (a ranking that float rounding
    of another backend cannot reorder)."""
    want = max(1, int(round((length + 1) / (words.mean_chars + 1))))
    per = max(1, want // len(sources))
    out: list[str] = []
    for source in sources[:want]:
        start = int(rng.integers(0, max(len(source) - per, 0) + 1))
        out += (source * (per // len(source) + 1))[start : start + per]
    return " ".join(out[:want])


def _retrieval(rng, words: Words, s: dict[str, Any], fraction: float) -> dict[str, Any]:
    n_docs = _scaled(_count(s, "documents"), fraction, 50)
    n_queries = _scaled(_count(s, "queries"), fraction, 10)
    rel = s.get("relevant_docs_statistics") or {}
    lo = max(int(rel.get("min_relevant_docs_per_query") or 1), 1)
    mean = float(rel.get("average_relevant_docs_per_query") or lo)
    hi = max(int(rel.get("max_relevant_docs_per_query") or lo), lo)
    lo = min(lo, int(mean)) or 1
    n_rel = np.clip(
        np.rint(_lengths(rng, {"min_text_length": lo, "average_text_length": mean, "max_text_length": hi}, n_queries)),
        1,
        n_docs,
    ).astype(int)
    docs = words.texts(rng, _lengths(rng, s.get("documents_text_statistics"), n_docs))
    query_lengths = _lengths(rng, s.get("queries_text_statistics"), n_queries)
    top = (s.get("top_ranked_statistics") or {}).get("average_top_ranked_per_query")
    queries, qrels, top_ranked = [], {}, {}
    ids = [f"q{q}_0" for q in range(n_queries)]  # "<query>_<subquery>": MindSmall's scoring splits on "_"
    for qid, k, length in zip(ids, n_rel, query_lengths, strict=True):
        relevant = rng.choice(n_docs, size=k, replace=False)
        queries.append(_query(rng, [docs[i].split() for i in relevant], words, length))
        qrels[qid] = {f"d{i}": 1 for i in relevant}
        if top:
            extra = rng.choice(n_docs, size=min(int(round(top)), n_docs), replace=False)
            top_ranked[qid] = list(dict.fromkeys([f"d{i}" for i in (*relevant, *extra)]))[: max(int(top), k)]
    return {
        "corpus": {"id": [f"d{i}" for i in range(n_docs)], "text": docs},
        "queries": {"id": ids, "text": queries},
        "qrels": qrels,
        "top_ranked": top_ranked or None,
    }


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


def _split_data(rng, words: Words, task: Any, s: dict[str, Any], fraction: float, train: bool) -> dict[str, Any]:
    kind = task.metadata.type
    if kind in ("Retrieval", "Reranking"):
        return _retrieval(rng, words, s, fraction)
    if kind in ("STS", "PairClassification"):
        return _pairs(rng, words, s, fraction, task)
    # Classification trains on samples_per_label of each label (mteb undersamples the train split).
    at_least = 2 * getattr(task, "samples_per_label", 8) if train else 2
    return _labelled(rng, words, s, fraction, task, at_least)


def _unloaded_copy(task: Any) -> Any:
    """A copy of one of mteb's benchmark task objects (shared by every caller in the process) without data,
    so data loaded from one replica directory never answers for another, and with generators of its own seeded
    as mteb seeds a new task (the shared ones advance with every evaluation: a clustering task's second run in
    one process sampled other documents)."""
    clone = copy.copy(task)
    clone.rng_state, clone.np_rng = random.Random(task.seed), np.random.default_rng(task.seed)
    if clone.data_loaded:
        clone.dataset = None
        clone.data_loaded = False
        clone.__dict__.pop("metadata", None)  # metadata of filtered data, as mteb's unload_data drops it
    return clone


def _benchmark_tasks(benchmark: str, where: str = "--suite") -> list[Any]:
    import mteb

    try:
        return list(mteb.get_benchmark(benchmark).tasks)
    except (KeyError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UsageError(f"{where} {benchmark!r:.80}: not an mteb benchmark ({reason})") from None


def _splits(task: Any) -> list[tuple[str, bool]]:
    """(split, is_train) pairs the task reads: its eval splits, and a classification task's train split."""
    splits = [(s, False) for s in task.metadata.eval_splits]
    train = getattr(task, "train_split", None) if task.metadata.type == "Classification" else None
    if train and train not in task.metadata.eval_splits:
        splits.append((train, True))
    return splits


def build_replica(
    directory: str | Path, benchmark: str, tokenizer_path: str, fraction: float = 1.0, seed: int = 0
) -> Path:
    """Write the replica of ``benchmark`` (an mteb benchmark name) into ``directory`` (see the module doc).

    One JSON file per task, subset and split (``<task>/<subset>.<split>.json``) and ``replica.json``
    (benchmark, fraction, seed, tokenizer, tasks kept, tasks left out with the reason). Reused when
    ``replica.json`` matches.

    Args:
        tokenizer_path: the model (or tokenizer) whose single-token words make the texts.
        fraction: 0 < fraction <= 1: counts are scaled by it (with small floors: 10 queries, 20 samples,
            2 samples per label, the classification train split's samples per label twice over).

    Returns:
        ``directory``, for :func:`replica_tasks` (``vllm-eval run --data DIRECTORY``).

    Raises:
        UsageError: an unknown benchmark, or ``fraction`` outside (0, 1].
    """
    from transformers import AutoTokenizer

    if not 0 < fraction <= 1:
        raise UsageError(f"--fraction must be in (0, 1], got {fraction}")
    out = Path(directory)
    meta = {"benchmark": benchmark, "fraction": fraction, "seed": seed, "tokenizer": str(tokenizer_path)}
    if _built(out, meta):
        return out
    tasks = _benchmark_tasks(benchmark)
    words = Words(AutoTokenizer.from_pretrained(tokenizer_path))
    kept, left_out = [], {}
    for index, task in enumerate(tasks):
        name = task.metadata.name
        path = stats_path(task)
        if task.metadata.type not in TYPES or not path.is_file():
            left_out[name] = f"{task.metadata.type}: no replica" if path.is_file() else "no descriptive statistics"
            continue
        stats = json.loads(path.read_text())
        rng = np.random.default_rng([seed, index])
        (out / name).mkdir(parents=True, exist_ok=True)
        for subset in task.hf_subsets:
            for split, train in _splits(task):
                s = _split_stats(stats, split, subset)
                if s is None:
                    raise UsageError(f"{path}: no statistics for split {split!r}")
                data = _split_data(rng, words, task, s, fraction, train)
                (out / name / f"{subset}.{split}.json").write_text(json.dumps(data))
        kept.append(name)
    (out / MANIFEST).write_text(json.dumps({**meta, "tasks": kept, "left_out": left_out}, indent=2) + "\n")
    return out


def _built(directory: Path, meta: dict[str, Any]) -> bool:
    """Whether ``directory`` holds the replica ``meta`` describes; a damaged manifest is a replica to build again."""
    if not (directory / MANIFEST).is_file():
        return False
    try:
        manifest = read_manifest(directory)
    except UsageError:
        return False
    return {k: v for k, v in manifest.items() if k in meta} == meta


def is_replica(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by :func:`build_replica`."""
    return (Path(path) / MANIFEST).is_file()


def _load(self: Any, directory: Path, *_: Any, **__: Any) -> None:
    """``load_data`` of a replica task: its subsets and splits from ``directory``, each file checked.

    Raises:
        UsageError: a split file that is missing, not JSON, or not of the task's shape (file and field named).
    """
    from datasets import Dataset

    if self.data_loaded:
        return
    dataset: dict[str, dict[str, Any]] = {}
    for subset in self.hf_subsets:
        for split, _ in _splits(self):
            path = directory / f"{subset}.{split}.json"
            data = json_object(path, read_json(path), "a replica split")
            if self.metadata.type in ("Retrieval", "Reranking"):
                from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

                _check_retrieval(path, data)
                data = RetrievalSplitData(
                    corpus=Dataset.from_dict({c: data["corpus"][c] for c in ("id", "text")}),
                    queries=Dataset.from_dict({c: data["queries"][c] for c in ("id", "text")}),
                    relevant_docs=data["qrels"],
                    top_ranked=data.get("top_ranked"),
                )
            else:
                columns = _columns(self)
                target = (int, float) if self.metadata.type == "STS" else (int, str)
                _check_columns(str(path), data, columns, texts=len(columns) - 1, target=target)
                data = Dataset.from_dict({c: data[c] for c in columns})  # other keys are not the task's
            dataset.setdefault(subset, {})[split] = data
    self.dataset = dataset
    self.data_loaded = True


def _check_columns(
    where: str, data: dict[str, Any], columns: tuple[str, ...], texts: int, target: tuple[type, ...] = (str,)
) -> None:
    """``data`` (``where`` names it) holds ``columns``, lists of one length > 0: the first ``texts`` of str, the
    rest of ``target`` types, names and numbers not mixed in one column."""
    lengths = set()
    for i, name in enumerate(columns):
        values = field(data, name, (list,), where)
        list_of(values, (str,) if i < texts else target, f"{where}: field {name!r}")
        if len({isinstance(v, str) for v in values}) > 1:
            raise UsageError(f"{where}: field {name!r} mixes names and numbers")
        lengths.add(len(values))
    if len(lengths) != 1 or 0 in lengths:
        raise UsageError(f"{where}: fields {', '.join(columns)} must be lists of one length > 0, got {sorted(lengths)}")


def _check_retrieval(path: Path, data: dict[str, Any]) -> None:
    """A retrieval split: corpus and queries (``id``, ``text`` lists), qrels ``{query: {document: relevance}}``
    naming only those, and ``top_ranked`` (null or ``{query: [document, ...]}``)."""
    ids = {}
    for part in ("corpus", "queries"):
        _check_columns(f"{path}: field {part!r}", field(data, part, (dict,), str(path)), ("id", "text"), texts=2)
        ids[part] = set(data[part]["id"])
    for qid, judged in field(data, "qrels", (dict,), str(path)).items():
        where = f"{path}: field 'qrels'.{qid!r:.40}"
        if qid not in ids["queries"]:
            raise UsageError(f"{where}: not a query id of the split")
        for did, score in check(judged, (dict,), where).items():
            check(score, (int,), f"{where}.{did!r:.40}")
            if did not in ids["corpus"]:
                raise UsageError(f"{where}: {did!r:.40} is not a document id of the split")
    for qid, docs in (field(data, "top_ranked", (dict, type(None)), str(path)) or {}).items():
        list_of(docs, (str,), f"{path}: field 'top_ranked'.{qid!r:.40}")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """A replica's ``replica.json``: benchmark, tasks (names, at least one) and how it was built, checked.

    Raises:
        DataUnavailableError: no manifest.
        UsageError: not JSON, or a field missing or of another type (file and field named).
    """
    path = Path(directory) / MANIFEST
    manifest = json_object(path, read_json(path), "a replica manifest")
    field(manifest, "benchmark", (str,), str(path))
    tasks = list_of(field(manifest, "tasks", (list,), str(path)), (str,), f"{path}: field 'tasks'")
    if not tasks:
        raise UsageError(f"{path}: field 'tasks' names no task")
    for key, types in (("fraction", (int, float)), ("seed", (int,)), ("tokenizer", (str,)), ("left_out", (dict,))):
        field(manifest, key, (*types, type(None)), str(path))
    return manifest


def replica_tasks(directory: str | Path) -> list[Any]:
    """Copies of the benchmark's own mteb task objects, each reading its replica from ``directory`` when loaded.

    Raises:
        UsageError: ``directory`` is not a replica, its manifest is damaged or names a task the benchmark does not
            have, or a task's split file is missing (file named; the files' contents are checked as they load).
    """
    directory = Path(directory)
    if not is_replica(directory):
        raise UsageError(f"--data {str(directory)!r}: no {MANIFEST} (not a replica written by bench --suite)")
    manifest = read_manifest(directory)
    path = directory / MANIFEST
    known = {t.metadata.name: t for t in _benchmark_tasks(manifest["benchmark"], f"{path}: field 'benchmark'")}
    for name in manifest["tasks"]:
        if name not in known:
            raise UsageError(f"{path}: field 'tasks' names {name!r:.80}, not a task of {manifest['benchmark']}")
    wanted = set(manifest["tasks"])
    tasks = [_unloaded_copy(t) for name, t in known.items() if name in wanted]
    for task in tasks:
        folder = directory / task.metadata.name
        for subset in task.hf_subsets:
            for split, _ in _splits(task):
                if not (folder / f"{subset}.{split}.json").is_file():
                    raise UsageError(f"{folder / f'{subset}.{split}.json'}: no such file (a replica split of {path})")
        task.local_data = True  # no hub dataset needed (vllm_eval.tasks.unavailable)
        task.load_data = partial(_load, task, folder)  # a partial pickles (task processes)
    return tasks
