"""Your own data files as ordinary mteb tasks (``vllm-eval run --data FILE``).

The schema (see :mod:`vllm_eval.tasks.owndata`) is read from the file's fields, or named with
``task_type`` (mteb's type names): ``STS`` (sentence1, sentence2, score), ``PairClassification``
(sentence1, sentence2, label), ``Reranking`` (query, positive, negative), ``Retrieval`` (a BEIR
directory: corpus, queries, qrels; a corpus of images instead of texts makes a text-to-image retrieval task),
``Classification`` (text, label; scored as mteb scores PangLeePolarity: logistic regression on the embeddings,
5-fold cross-validation on the one split) and ``ImageClassification`` (image, label: a path relative to the file,
or Parquet bytes; scored the same way on the image vectors).
The task is an instance of mteb's own ``AbsTask*`` class for that type, so mteb's evaluator, main
score and result JSON are the ones users know; its name is the file's (``mydata`` for
``mydata.jsonl``) and its dataset revision a hash of the file's bytes.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

from ..utils.errors import DataUnavailableError, UnknownNameError, UsageError
from . import owndata

#: mteb task type -> owndata schema.
TYPES = {
    "STS": "sts",
    "PairClassification": "pair_classification",
    "Reranking": "reranking",
    "Retrieval": "retrieval",
    "Classification": "classification",
    "ImageClassification": "image_classification",
}
_MAIN_SCORES = {
    "STS": "cosine_spearman",
    "PairClassification": "max_ap",
    "Reranking": "map_at_1000",
    "Retrieval": "ndcg_at_10",
    "Classification": "accuracy",
    "ImageClassification": "accuracy",
    "Any2AnyRetrieval": "ndcg_at_10",  # a retrieval directory whose corpus is images
}


#: Folds of the cross-validation that scores a classification file (mteb's default).
_FOLDS = 5


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def detect_type(path: str | Path) -> str:
    """The mteb task type of a data file or directory, from its fields (see the module doc).

    Raises:
        DataUnavailableError: no such file or directory.
        UsageError: the fields match no schema (the file's fields and the schemas listed).
    """
    path = Path(path)
    if path.is_dir():
        if owndata.find_table(path, "corpus") and owndata.find_table(path, "queries"):
            return "Retrieval"
        raise UsageError(f"--data {str(path)!r}: a directory must hold corpus, queries and qrels files (BEIR layout)")
    if not path.is_file():
        raise DataUnavailableError(f"--data {str(path)!r}: no such file or directory")
    columns = set(owndata.load_table(path).column_names)
    for mteb_type, schema in TYPES.items():
        if schema != "retrieval" and set(owndata.SCHEMAS[schema]) <= columns:
            return mteb_type
    known = "; ".join(f"{t}: {', '.join(owndata.SCHEMAS[s])}" for t, s in TYPES.items() if s != "retrieval")
    raise UsageError(f"--data {str(path)!r}: fields {', '.join(sorted(columns))} match no schema ({known})")


def _metadata(name: str, mteb_type: str, files: list[Path], description: str, images: bool = False) -> Any:
    from mteb.abstasks.task_metadata import TaskMetadata

    category = {"Classification": "t2c", "ImageClassification": "i2c"}.get(mteb_type, "t2t")
    if images and mteb_type == "Retrieval":
        mteb_type, category = "Any2AnyRetrieval", "t2i"
    return TaskMetadata(
        name=name,
        description=description,
        reference=None,
        dataset={
            "path": str(files[0].resolve().parent if len(files) > 1 else files[0].resolve()),
            "revision": _digest(files),
        },
        type=mteb_type,
        category=category,
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score=_MAIN_SCORES[mteb_type],
        date=None,
        domains=None,
        task_subtypes=None,
        license=None,
        annotations_creators=None,
        dialect=None,
        sample_creation=None,
        bibtex_citation="",
        modalities=(["text", "image"] if category == "t2i" else ["image"]) if images else ["text"],
        is_public=False,
    )


def _task_name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem if path.is_file() else path.name) or "data"


def own_mteb_task(path: str | Path, task_type: str | None = None) -> Any:
    """An mteb task object over your data file (or BEIR directory) at ``path``.

    Args:
        task_type: mteb's type name (``STS``, ``PairClassification``, ``Reranking``, ``Retrieval``,
            ``Classification``); None: read from the fields (:func:`detect_type`).

    Returns:
        An instance of mteb's ``AbsTaskSTS`` / ``AbsTaskPairClassification`` / ``AbsTaskRetrieval``
        (reranking: retrieval with each query's candidates as ``top_ranked``) /
        ``AbsTaskClassification``, data already loaded (rows checked now, not when mteb runs).

    Raises:
        DataUnavailableError: no such file or directory.
        UsageError: an unknown type; a row that breaks the schema (file, line and field named);
            qrels naming an unknown query or document.
    """
    path = Path(path)
    mteb_type = task_type or detect_type(path)
    if mteb_type not in TYPES:
        raise UsageError(f"--data-type must be one of {', '.join(TYPES)}, got {mteb_type!r}")
    builder = {
        "STS": _sts,
        "PairClassification": _pair_classification,
        "Reranking": _reranking,
        "Retrieval": _retrieval,
        "Classification": _classification,
        "ImageClassification": _image_classification,
    }[mteb_type]
    return builder(path)


def own_mteb_tasks(path: str | Path, task_type: str | None = None, names: list[str] | None = None) -> list[Any]:
    """The mteb tasks of ``--data``: a benchmark replica's (:mod:`vllm_eval.tasks.shaped`), ``names`` picking some
    of them, else ``[own_mteb_task(path, task_type)]``.

    Raises:
        UsageError: ``task_type`` given with a replica, ``names`` with a file of one task, or as
            :func:`own_mteb_task`.
        UnknownNameError: a name that is not a task of the replica (its tasks listed).
    """
    from .shaped import is_replica, replica_tasks

    if not is_replica(path):
        if names:
            raise UsageError("give --data or --tasks, not both (--tasks picks tasks of a benchmark replica only)")
        return [own_mteb_task(path, task_type)]
    if task_type:
        raise UsageError(f"--data {str(path)!r} is a benchmark replica; its tasks keep their types (no --data-type)")
    tasks = replica_tasks(path)
    if not names:
        return tasks
    by_lower = {t.metadata.name.lower(): t for t in tasks}
    unknown = [n for n in names if n.lower() not in by_lower]
    if unknown:
        raise UnknownNameError(
            f"--tasks {unknown[0]!r} is not a task of the replica {str(path)!r}; its tasks: "
            + ", ".join(t.metadata.name for t in tasks)
        )
    return [by_lower[n.lower()] for n in names]


def _instance(base: type, metadata: Any, dataset: dict, **attrs: Any) -> Any:
    """An object of a new subclass of mteb's ``base`` whose ``load_data`` gives a copy of ``dataset``
    (a fresh object of the class, as two-stage reranking makes, gets the data too)."""
    import copy

    def load_data(self: Any, num_proc: int | None = None, **kwargs: Any) -> None:
        if not self.data_loaded:
            self.dataset = {"default": copy.copy(dataset)}  # the split dicts are mutated by mteb; the data is not
            for split, value in dataset.items():
                if isinstance(value, dict):
                    self.dataset["default"][split] = dict(value)
            self.data_loaded = True

    namespace = {"metadata": metadata, "local_data": True, "load_data": load_data, **attrs}
    task = type(f"Own{metadata.type}Task", (base,), namespace)()
    task.load_data()
    return task


def _sts(path: Path) -> Any:
    from datasets import Dataset
    from mteb.abstasks import AbsTaskSTS

    rows = owndata.read_rows(path, "sts")
    scores = [float(r["score"]) for r in rows]
    if len(set(scores)) < 2:  # a correlation with a constant is undefined: mteb would report NaN
        raise UsageError(f"{path}: field 'score' is {scores[0]:g} in every row; STS needs scores that differ")
    if not math.isfinite(max(scores) - min(scores)):  # mteb divides by the span: every score would be 0
        raise UsageError(f"{path}: field 'score' spans {min(scores):g} to {max(scores):g}, more than a float holds")
    meta = _metadata(_task_name(path), "STS", [path], f"Sentence pairs with similarity scores from {path.name}.")
    data = Dataset.from_dict(
        {"sentence1": [r["sentence1"] for r in rows], "sentence2": [r["sentence2"] for r in rows], "score": scores}
    )
    return _instance(AbsTaskSTS, meta, {"test": data}, min_score=min(scores), max_score=max(scores))


def _pair_classification(path: Path) -> Any:
    from datasets import Dataset
    from mteb.abstasks import AbsTaskPairClassification

    rows = owndata.read_rows(path, "pair_classification")
    for i, r in enumerate(rows):
        if r["label"] not in (0, 1):
            raise UsageError(f"{owndata.where(path, i)}: field 'label' must be 0 or 1, got {r['label']!r}")
    if len({r["label"] for r in rows}) < 2:  # average precision over one class says nothing
        raise UsageError(f"{path}: field 'label' is {rows[0]['label']} in every row; pairs labelled 0 and 1 are needed")
    meta = _metadata(_task_name(path), "PairClassification", [path], f"Sentence pairs labelled 0/1 from {path.name}.")
    data = Dataset.from_dict(
        {
            "sentence1": [r["sentence1"] for r in rows],
            "sentence2": [r["sentence2"] for r in rows],
            "labels": [int(r["label"]) for r in rows],
        }
    )
    return _instance(AbsTaskPairClassification, meta, {"test": data})


def _class_names(path: Path, rows: list[dict[str, Any]]) -> list[str]:
    """The sorted label names of a classification file, which mteb's cross-validation can score: two labels or
    more (a probe of one class fails) over at least :data:`_FOLDS` rows (one per fold)."""
    names = sorted({str(r["label"]) for r in rows})
    if len(names) < 2:
        raise UsageError(f"{path}: field 'label' is {names[0]!r} in every row; classification needs two labels or more")
    if len(rows) < _FOLDS:
        raise UsageError(f"{path}: {len(rows)} rows; {_FOLDS}-fold cross-validation needs {_FOLDS} rows or more")
    return names


def _classification(path: Path) -> Any:
    from datasets import Dataset
    from mteb.abstasks import AbsTaskClassification

    rows = owndata.read_rows(path, "classification")
    names = _class_names(path, rows)
    meta = _metadata(_task_name(path), "Classification", [path], f"Labelled texts from {path.name}.")
    data = Dataset.from_dict({"text": [r["text"] for r in rows], "label": [names.index(str(r["label"])) for r in rows]})
    return _instance(
        AbsTaskClassification,
        meta,
        {"test": data},
        is_cross_validation=True,
        n_splits=_FOLDS,
        train_split="test",
        samples_per_label=max(len(rows), 8),
    )


def _image_classification(path: Path) -> Any:
    from datasets import Dataset
    from mteb.abstasks import AbsTaskClassification

    rows = owndata.read_rows(path, "image_classification")
    names = _class_names(path, rows)
    images = owndata.load_images(path, rows)
    meta = _metadata(_task_name(path), "ImageClassification", [path], f"Labelled images from {path.name}.", images=True)
    data = Dataset.from_dict({"image": images, "label": [names.index(str(r["label"])) for r in rows]})
    return _instance(
        AbsTaskClassification,
        meta,
        {"test": data},
        input_column_name="image",
        is_cross_validation=True,
        n_splits=_FOLDS,
        train_split="test",
        samples_per_label=max(len(rows), 8),
    )


def _reranking(path: Path) -> Any:
    from datasets import Dataset
    from mteb.abstasks import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    rows = owndata.read_rows(path, "reranking")
    owndata.check_str_list(path, rows, "positive", min_len=1)
    owndata.check_str_list(path, rows, "negative")
    doc_ids: dict[str, str] = {}
    qids, queries, qrels, top_ranked = [], [], {}, {}
    for i, r in enumerate(rows):
        qid = f"q{i}"
        qids.append(qid)
        queries.append(r["query"])
        candidates = [doc_ids.setdefault(t, f"d{len(doc_ids)}") for t in r["positive"] + r["negative"]]
        top_ranked[qid] = list(dict.fromkeys(candidates))
        qrels[qid] = {doc_ids[t]: 1 for t in r["positive"]}
    meta = _metadata(_task_name(path), "Reranking", [path], f"Queries with candidates to rerank from {path.name}.")
    split = RetrievalSplitData(
        corpus=Dataset.from_dict({"id": list(doc_ids.values()), "text": list(doc_ids)}),
        queries=Dataset.from_dict({"id": qids, "text": queries}),
        relevant_docs=qrels,
        top_ranked=top_ranked,
    )
    return _instance(AbsTaskRetrieval, meta, {"test": split})


def _unique_ids(path: Path, rows: list[dict[str, Any]]) -> set[str]:
    """The ids of a corpus or queries file, each once (a second row of one id would be scored as the first)."""
    first: dict[str, int] = {}
    for i, r in enumerate(rows):
        key = str(r["id"])
        if key in first:
            raise UsageError(f"{owndata.where(path, i)}: id {key!r} again (first at {owndata.where(path, first[key])})")
        first[key] = i
    return set(first)


def _judgements(
    files: dict[str, Any], doc_set: set[str], query_set: set[str], rows: list[dict[str, Any]]
) -> dict[str, dict[str, int]]:
    """qrels as mteb takes them, ``{query: {document: relevance}}``; relevance is a whole number, and one
    judgement at least is relevant (> 0), else every query scores 0 whatever the model."""
    qrels: dict[str, dict[str, int]] = {}
    for i, r in enumerate(rows):
        here = owndata.where(files["qrels"], i)
        qid, did, score = str(r["query-id"]), str(r["corpus-id"]), r["score"]
        if qid not in query_set:
            raise UsageError(f"{here}: query-id {qid!r} is not in {files['queries'].name}")
        if did not in doc_set:
            raise UsageError(f"{here}: corpus-id {did!r} is not in {files['corpus'].name}")
        if score != int(score):
            raise UsageError(f"{here}: field 'score' is {score!r}; relevance is a whole number (0: not relevant)")
        qrels.setdefault(qid, {})[did] = int(score)
    if not any(score > 0 for judged in qrels.values() for score in judged.values()):
        raise UsageError(f"{files['qrels']}: no judgement with score > 0 (no document is relevant to any query)")
    return qrels


def _retrieval(path: Path) -> Any:
    from datasets import Dataset
    from mteb.abstasks import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    if not path.is_dir():
        raise UsageError(f"--data {str(path)!r}: retrieval data is a directory with corpus, queries and qrels files")
    files = {stem: owndata.find_table(path, stem) for stem in ("corpus", "queries", "qrels")}
    for stem, found in files.items():
        if found is None:
            raise UsageError(f"--data {str(path)!r}: no {stem} file ({stem}.jsonl, .csv, .tsv or .parquet)")
    images = "image" in owndata.load_table(files["corpus"]).column_names  # an image corpus: text-to-image
    corpus = owndata.read_rows(files["corpus"], "image_corpus" if images else "corpus")
    queries = owndata.read_rows(files["queries"], "queries")
    qrels_rows = owndata.read_rows(files["qrels"], "qrels")
    qrels = _judgements(files, _unique_ids(files["corpus"], corpus), _unique_ids(files["queries"], queries), qrels_rows)
    if images:
        documents = {"image": owndata.load_images(files["corpus"], corpus)}
    else:  # BEIR's convention: the title before the text
        documents = {"text": [f"{r['title']} {r['text']}".strip() if r.get("title") else r["text"] for r in corpus]}
    kept = [r for r in queries if str(r["id"]) in qrels]  # mteb scores only queries with judgements
    meta = _metadata(
        _task_name(path),
        "Retrieval",
        [p for p in files.values() if p],
        f"Retrieval data (BEIR layout) from {path}.",
        images=images,
    )
    split = RetrievalSplitData(
        corpus=Dataset.from_dict({"id": [str(r["id"]) for r in corpus], **documents}),
        queries=Dataset.from_dict({"id": [str(r["id"]) for r in kept], "text": [r["text"] for r in kept]}),
        relevant_docs=qrels,
        top_ranked=None,
    )
    return _instance(AbsTaskRetrieval, meta, {"test": split})
