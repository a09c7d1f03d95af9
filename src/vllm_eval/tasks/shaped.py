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

Layout of a replica directory (formats and checks in :mod:`vllm_eval.tasks.replica_io`, data in
:mod:`vllm_eval.tasks.replica_data`)::

    replica.json                      benchmark, fraction, seed, tokenizer, layout, tasks kept, left out (written last)
    <task>/<subset>.<split>.jsonl     STS, pair classification, classification, clustering: a row per line
    <task>/<subset>.<split>/          retrieval and reranking:
        corpus.jsonl, queries.jsonl   {"id": ..., "text": ...} per line
        qrels.npy                     int32 (n, 3): query row, corpus row, relevance
        top_ranked.npy                int32 (m,): the candidates (corpus rows), query after query (reranking)
        top_ranked_counts.npy         int32 (queries,): candidates per query (reranking)
        split.json                    rows of each part (written last)

Tasks are built side by side in worker processes, each with its own generator (seeded by the seed and the task's
place in the benchmark), so the files do not depend on the number of workers; texts are written a chunk at a time.
Every file is written under a temporary name and renamed when whole, and ``replica.json`` only once every task is
written: a build cut short is built again by the next call, never read.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UsageError
from ..utils.files import field, json_object, list_of, read_json
from .replica_data import Words, _columns, _labelled, _pairs, single_token_words, write_retrieval
from .replica_io import SPLIT, check_last_line, read_retrieval, read_rows, write_json, write_rows

__all__ = ["Words", "build_replica", "is_replica", "read_manifest", "replica_tasks", "single_token_words", "stats_path"]

TYPES = ("Retrieval", "Reranking", "STS", "PairClassification", "Classification", "Clustering")
MANIFEST = "replica.json"
#: The file layout (see the module doc): a replica of another layout is built again, not misread.
LAYOUT = 2
#: The benchmark's tasks, in a process that builds them (read only there).
_WORKER_TASKS: dict[str, list[Any]] = {}


def stats_path(task: Any) -> Path:
    """Where mteb keeps ``task``'s descriptive statistics."""
    import mteb

    return Path(mteb.__file__).parent / "descriptive_stats" / task.metadata.type / f"{task.metadata.name}.json"


def _split_stats(stats: dict[str, Any], split: str, subset: str) -> dict[str, Any] | None:
    found = stats.get(split)
    if found is None:
        return None
    return (found.get("hf_subset_descriptive_stats") or {}).get(subset, found)


def _split_data(rng, words: Words, task: Any, s: dict[str, Any], fraction: float, train: bool) -> dict[str, Any]:
    """The columns (lists of one length) of a split of a task that is not retrieval."""
    if task.metadata.type in ("STS", "PairClassification"):
        return _pairs(rng, words, s, fraction, task)
    # Classification trains on samples_per_label of each label (mteb undersamples the train split).
    at_least = 2 * getattr(task, "samples_per_label", 8) if train else 2
    return _labelled(rng, words, s, fraction, task, at_least)


def write_split(folder: Path, rng, words: Words, task: Any, s: dict[str, Any], fraction: float, train: bool, name: str):
    """Write the split ``name`` (``<subset>.<split>``) of ``task`` into ``folder`` (the task's), shaped by ``s``."""
    if task.metadata.type in ("Retrieval", "Reranking"):
        write_retrieval(folder / name, rng, words, s, fraction)
    else:
        write_rows(folder / f"{name}.jsonl", _split_data(rng, words, task, s, fraction, train))


def _split_file(task: Any, folder: Path, name: str) -> Path:
    """The file whose presence says the split ``name`` of ``task`` was written whole (the last one written)."""
    return folder / name / SPLIT if task.metadata.type in ("Retrieval", "Reranking") else folder / f"{name}.jsonl"


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
    directory: str | Path,
    benchmark: str,
    tokenizer_path: str,
    fraction: float = 1.0,
    seed: int = 0,
    workers: int | None = None,
    tasks: list[str] | None = None,
) -> Path:
    """Write the replica of ``benchmark`` (an mteb benchmark name) into ``directory`` (layout in the module doc),
    ``replica.json`` last. Reused when ``replica.json`` matches; otherwise each task's folder is written anew.

    Args:
        tokenizer_path: the model (or tokenizer) whose single-token words make the texts.
        fraction: 0 < fraction <= 1: counts are scaled by it (with small floors: 10 queries, 20 samples,
            2 samples per label, the classification train split's samples per label twice over).
        workers: processes building tasks side by side (default: one per CPU, at most one per task; 1: this
            process). The files are the same whatever the number: each task draws from its own generator.
        tasks: only these tasks of the benchmark (default: all).

    Returns:
        ``directory``, for :func:`replica_tasks` (``vllm-eval run --data DIRECTORY``).

    Raises:
        UsageError: an unknown benchmark or task name, ``fraction`` outside (0, 1], or statistics without a split
            the task reads.
    """
    if not 0 < fraction <= 1:
        raise UsageError(f"--fraction must be in (0, 1], got {fraction}")
    out = Path(directory)
    only = sorted(tasks) if tasks else None
    meta = {"benchmark": benchmark, "fraction": fraction, "seed": seed, "tokenizer": str(tokenizer_path)}
    meta |= {"layout": LAYOUT, "only": only}
    if _built(out, meta):
        return out
    every = _benchmark_tasks(benchmark)
    unknown = sorted(set(only or ()) - {t.metadata.name for t in every})
    if unknown:
        raise UsageError(f"{benchmark}: no task {unknown[0]!r:.80}")
    pieces, left_out = _pieces(every, only)
    if not pieces:
        raise UsageError(f"{benchmark}: none of its tasks{' asked for' if only else ''} has a replica ({TYPES})")
    words = _words(tokenizer_path)
    out.mkdir(parents=True, exist_ok=True)
    # Until the new manifest is written, no call may take this folder for a finished replica (of the old one).
    (out / MANIFEST).unlink(missing_ok=True)
    for stale in out.glob(f".{MANIFEST}.tmp-*"):
        stale.unlink()
    _run([(out, words, benchmark, index, fraction, seed) for _, index, _ in pieces], workers)
    kept = [t.metadata.name for t in every if t.metadata.name in {name for _, _, name in pieces}]
    write_json(out / MANIFEST, {**meta, "tasks": kept, "left_out": left_out})
    return out


def _pieces(every: list[Any], only: list[str] | None) -> tuple[list[tuple[int, int, str]], dict[str, str]]:
    """The tasks of ``every`` to build, as (cost, index, name), the largest first (so no worker is left with one at
    the end), and those left out with the reason."""
    pieces, left_out = [], {}
    for index, task in enumerate(every):
        name, path = task.metadata.name, stats_path(task)
        if only and name not in only:
            continue
        if task.metadata.type not in TYPES or not path.is_file():
            left_out[name] = f"{task.metadata.type}: no replica" if path.is_file() else "no descriptive statistics"
            continue
        pieces.append((_cost(path), index, name))
    return sorted(pieces, key=lambda p: -p[0]), left_out


def _run(jobs: list[tuple[Any, ...]], workers: int | None) -> None:
    """:func:`_build_task` for each of ``jobs``: in this process for one worker, else in a pool of processes."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        for job in jobs:
            _build_task(*job)
        return
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(_build_task, *job) for job in jobs]
        try:
            for done in futures:
                done.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)  # a failed build stops: the tasks not started are not built
            raise


def _words(tokenizer_path: str) -> Words:
    from transformers import AutoTokenizer

    return Words(AutoTokenizer.from_pretrained(tokenizer_path))


def _cost(path: Path) -> int:
    """About how long a task takes to build: characters and candidates per query in its statistics."""
    stats = json.loads(path.read_text())
    splits = [s for s in stats.values() if isinstance(s, dict)]
    top = sum(int((s.get("top_ranked_statistics") or {}).get("num_top_ranked") or 0) for s in splits)
    return sum(int(s.get("number_of_characters") or 0) for s in splits) + 4 * top


def _build_task(out: Path, words: Words, benchmark: str, index: int, fraction: float, seed: int) -> str:
    """Write the task ``index`` of ``benchmark`` into ``out/<task>`` (emptied first: a build cut short left files
    there); returns its name. Runs in a worker process: it gets the task by index, not pickled."""
    if benchmark not in _WORKER_TASKS:  # mteb builds the benchmark's task objects anew on every call (~0.1 s)
        _WORKER_TASKS[benchmark] = _benchmark_tasks(benchmark)
    task = _WORKER_TASKS[benchmark][index]
    name, path = task.metadata.name, stats_path(task)
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    stats = json.loads(path.read_text())
    rng = np.random.default_rng([seed, index])
    for subset in task.hf_subsets:
        for split, train in _splits(task):
            s = _split_stats(stats, split, subset)
            if s is None:
                raise UsageError(f"{path}: no statistics for split {split!r}")
            write_split(folder, rng, words, task, s, fraction, train, f"{subset}.{split}")
    return name


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
    """``load_data`` of a replica task: its subsets and splits from ``directory``, each file checked
    (:mod:`vllm_eval.tasks.replica_io`).

    Raises:
        UsageError: a split file that is missing or damaged, or not of the task's shape (file, line and field named).
    """
    from datasets import Dataset

    if self.data_loaded:
        return
    dataset: dict[str, dict[str, Any]] = {}
    for subset in self.hf_subsets:
        for split, _ in _splits(self):
            if self.metadata.type in ("Retrieval", "Reranking"):
                data = read_retrieval(directory / f"{subset}.{split}")
            else:
                path = directory / f"{subset}.{split}.jsonl"
                *texts, target = _columns(self)
                kinds = (int, float) if self.metadata.type == "STS" else (int, str)
                data = read_rows(path, {**{c: (str,) for c in texts}, target: kinds})
                if len({isinstance(v, str) for v in data[target]}) > 1:
                    raise UsageError(f"{path}: field {target!r} mixes names and numbers")
                data = Dataset.from_dict(data)
            dataset.setdefault(subset, {})[split] = data
    self.dataset = dataset
    self.data_loaded = True


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


def _reading(task: Any, folder: Path) -> Any:
    """``task`` (a copy of the benchmark's own, without data) made to read its replica from ``folder``.

    Its ``load_data`` is an attribute of the object, bound to it (a partial pickles: task processes), so a new
    object of the class would read the hub: ``fresh_copy()`` gives another copy reading the same folder, for
    whoever needs the task anew without its data (two-stage reranking makes the second stage's task so)."""
    task.local_data = True  # no hub dataset needed (vllm_eval.tasks.unavailable)
    task.load_data = partial(_load, task, folder)
    task.fresh_copy = partial(_fresh_copy, task, folder)
    return task


def _fresh_copy(task: Any, folder: Path) -> Any:
    clone = _unloaded_copy(task)
    clone.dataset, clone.data_loaded = None, False
    return _reading(clone, folder)


def replica_tasks(directory: str | Path) -> list[Any]:
    """Copies of the benchmark's own mteb task objects, each reading its replica from ``directory`` when loaded.

    Raises:
        UsageError: ``directory`` is not a replica, its manifest is damaged or names a task the benchmark does not
            have, a task's split file is missing, or a JSON-lines file's last line is not JSON (cut short; file and
            line named). The rest of the files' contents are checked as they load.
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
                if not (file := _split_file(task, folder, f"{subset}.{split}")).is_file():
                    raise UsageError(f"{file}: no such file (a replica split of {path})")
                lines = (
                    [file] if file.suffix == ".jsonl" else [file.parent / n for n in ("corpus.jsonl", "queries.jsonl")]
                )
                for each in lines:  # a file cut short: named now, not when its task's turn comes
                    check_last_line(each)
        _reading(task, folder)
    return tasks
