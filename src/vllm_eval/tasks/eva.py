"""kaiko-eva's pathology tasks by name, with eva's own prompts, samplers, answer extraction, missing-answer rule,
number of runs, metrics and ``results.json``; the model runs on this project's generator backends.

Each task follows its config in eva's repository (``configs/multimodal/pathology/online/...``,
``configs/language/pathology/online/...``, eva 0.4.5), whose defaults are the values below:

=================  ===============  ======================================  =========================  ======
task               splits           sampler                                 scored by                  n_runs
=================  ===============  ======================================  =========================  ======
eva.PatchCamelyon  val, test        ``BalancedSampler`` 250 a class, seed   JSON answer no/yes,        2
                                    42                                      missing = class 2, macro
eva.PathMMUAtlas   val, test        ``RandomSampler`` seed 42 (all)         JSON answer A-E, missing   1
                                                                            ignored, micro average
eva.PubMedQA       val, test        none (in order)                         JSON answer no/yes/maybe,  1
                                                                            missing = "maybe"'s 2
eva.QuiltVQA       test             ``RandomSampler`` seed 42 (all)         ``GEvalCorrectness``       2
                                                                            (an LLM judge, 1-5)
=================  ===============  ======================================  =========================  ======

The answers are parsed by eva's ``ExtractDiscreteAnswer`` (one extractor per task, so its count of unparsable
answers runs over all splits and runs, as in eva: past ``missing_limit``, 5 by default, the task stops) and scored
by eva's ``MulticlassClassificationMetrics`` (torchmetrics); the runs are recorded by eva's ``SessionRecorder``
(``{"metrics": {"val": [{name: {mean, stdev, values}}], "test": [...]}}``). With greedy sampling every run has
the same answers, so they are generated once and scored ``n_runs`` times (eva's vLLM model, whose seed is fixed,
gets the same answers each run too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import MissingAnswersError, UnknownNameError, UsageError
from . import eva_data


@dataclass(frozen=True)
class EvaTask:
    """One of eva's tasks as its config runs it.

    Attributes:
        name: what ``--tasks`` takes (``eva.`` and the class name; the bare class name too, except PubMedQA,
            which is lm-eval's ``pubmedqa`` without the prefix).
        eva_class: eva's dataset class. config: the config file in eva's repository.
        reader: the split reader (:mod:`vllm_eval.tasks.eva_data`). folder: the task's folder under a data root
            (eva's default ``DATA_ROOT`` is ``.data/<folder>``).
        splits: eva's ``val`` and ``test`` datasets. modality: ``image`` or ``text``.
        mapping: answer to class (``ExtractDiscreteAnswer``'s ``mapping``); None for free-form answers.
        missing_answer: the class of an unparsable answer. num_classes, average, ignore_index: the metrics'.
        sampler: ``balanced`` (250 a class), ``random`` (all, shuffled) or None (in order); seed 42.
        n_runs: the config's ``N_RUNS``. system_prompt: the model's system prompt in the config.
        licence, source: of the data.
    """

    name: str
    eva_class: str
    config: str
    reader: Callable[..., Any]
    folder: str
    splits: tuple[str, ...]
    modality: str
    mapping: dict[str, int] | None
    missing_answer: int | None
    num_classes: int
    average: str
    ignore_index: int | None
    sampler: str | None
    n_runs: int
    licence: str
    source: str
    system_prompt: str | None = None
    num_samples: int | None = None
    aliases: tuple[str, ...] = field(default=())

    @property
    def free_form(self) -> bool:
        return self.mapping is None


#: eva's default ``DATA_ROOT``: each task's files under ``.data/<folder>``.
DEFAULT_DATA_ROOT = Path(".data")
_MM = "configs/multimodal/pathology/online/"
EVA_TASKS: dict[str, EvaTask] = {
    t.name: t
    for t in (
        EvaTask(
            "eva.PatchCamelyon",
            "eva.multimodal.data.datasets.PatchCamelyon",
            _MM + "multiple_choice/patch_camelyon.yaml",
            eva_data.PatchCamelyonSplit,
            "patch_camelyon",
            ("val", "test"),
            "image",
            {"no": 0, "yes": 1, "missing_answer": 2},
            2,
            3,
            "macro",
            None,
            "balanced",
            2,
            "CC0-1.0",
            "https://zenodo.org/records/2546921",
            num_samples=250,
            aliases=("PatchCamelyon",),
        ),
        EvaTask(
            "eva.PathMMUAtlas",
            "eva.multimodal.data.datasets.PathMMUAtlas",
            _MM + "multiple_choice/path_mmu_atlas.yaml",
            eva_data.PathMMUAtlasSplit,
            "path_mmu_atlas",
            ("val", "test"),
            "image",
            {"A": 0, "B": 1, "C": 2, "D": 3, "E": 4},
            -1,
            5,
            "micro",
            -1,
            "random",
            1,
            "CC-BY-ND-4.0 (PathMMU), CC-BY-NC-SA-4.0 (ARCH book set)",
            "hub dataset jamessyx/PathMMU (data.json) and https://warwick.ac.uk/fac/cross_fac/tia/data/arch/",
            system_prompt=(
                "In the following tasks you will work as a pathology expert and analyze images of tissue samples."
            ),
            aliases=("PathMMUAtlas",),
        ),
        EvaTask(
            "eva.PubMedQA",
            "eva.language.data.datasets.PubMedQA",
            "configs/language/pathology/online/multiple_choice/pubmedqa.yaml",
            eva_data.PubMedQASplit,
            "pubmedqa",
            ("val", "test"),
            "text",
            {"no": 0, "yes": 1, "maybe": 2},
            2,
            3,
            "macro",
            None,
            None,
            1,
            "MIT",
            "hub dataset bigbio/pubmed_qa (pubmed_qa_labeled_fold0_source)",
        ),
        EvaTask(
            "eva.QuiltVQA",
            "eva.multimodal.data.datasets.QuiltVQA",
            _MM + "free_form/quilt_vqa.yaml",
            eva_data.QuiltVQASplit,
            "quilt_vqa",
            ("test",),
            "image",
            None,
            None,
            0,
            "",
            None,
            "random",
            2,
            "CC-BY-NC-ND-3.0",
            "hub dataset wisdomik/Quilt_VQA (gated)",
            aliases=("QuiltVQA",),
        ),
    )
}


def find_eva_task(name: str) -> EvaTask | None:
    """The eva task called ``name`` (case-insensitive; ``eva.`` + class name, or an alias), else None."""
    low = name.lower()
    for task in EVA_TASKS.values():
        if low == task.name.lower() or low in (a.lower() for a in task.aliases):
            return task
    return None


def task_rows() -> list[dict[str, Any]]:
    """eva's tasks as ``vllm-eval tasks`` rows (name, kind, command, type, main_score, source, available,
    description); ``available``: the task's folder is under eva's default data root (``.data``), as
    ``generate --data-root`` reads it."""
    rows = []
    for t in EVA_TASKS.values():
        answers = [a for a in t.mapping or () if a != "missing_answer"]
        kind = "free form, an LLM judge" if t.free_form else f"multiple choice of {len(answers)}"
        rows.append(
            {
                "name": t.name,
                "kind": "generator",
                "command": "generate",
                "type": f"eva {t.modality}, {kind}",
                "main_score": main_score_name(t),
                "source": t.source,
                "available": (DEFAULT_DATA_ROOT / t.folder).is_dir(),
                "description": f"kaiko-eva's {t.config} ({t.licence}); files in eva's layout under --data-root",
            }
        )
    return rows


def get_eva_task(name: str) -> EvaTask:
    """The eva task called ``name``.

    Raises:
        UnknownNameError: no such task (the known ones listed).
    """
    task = find_eva_task(name)
    if task is None:
        raise UnknownNameError(f"unknown eva task {name!r}; known: {', '.join(EVA_TASKS)}")
    return task


@dataclass
class PreparedTask:
    """An eva task read from disk and sampled, ready to generate: one request per (split, sampled index)."""

    task: EvaTask
    root: Path
    splits: dict[str, Any]
    order: dict[str, list[int]]
    answer_format: str
    missing_limit: int
    n_runs: int

    def requests(self) -> list[tuple[str, list[Any]]]:
        """``(prompt, images)`` per sample, split by split in eva's order."""
        return [(self.splits[s].prompt(i), self.splits[s].images(i)) for s in self.order for i in self.order[s]]

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.order.values())

    def largest_image(self) -> tuple[int, int] | None:
        """``(width, height)``: the largest width and the largest height over the sampled images (read from headers
        where the layout allows, not decoded), or None for a text task."""
        sizes = [wh for s in self.order for i in self.order[s] for wh in self.splits[s].image_sizes(i)]
        return (max(w for w, _ in sizes), max(h for _, h in sizes)) if sizes else None


def task_root(task: EvaTask, data_root: str | Path | None) -> Path:
    """Where ``task``'s files are: ``<data_root>/<folder>`` when that exists, else ``data_root`` itself (eva's
    ``DATA_ROOT`` of one config); the default data root is eva's ``.data``."""
    base = Path(data_root) if data_root is not None else DEFAULT_DATA_ROOT
    return base / task.folder if (base / task.folder).is_dir() else base


def task_folder(task: EvaTask, data_root: str | Path | None) -> Path:
    """Where ``--download`` puts ``task``'s files: ``<data_root>/<folder>`` (eva's default data root ``.data``)."""
    return (Path(data_root) if data_root is not None else DEFAULT_DATA_ROOT) / task.folder


def check_files(task: EvaTask, data_root: str | Path | None) -> None:
    """Check that ``task``'s files are where :func:`prepare` reads them, without eva's imports or reading them
    (milliseconds): a missing one is named before any engine starts, even when the data is read while it starts.

    Raises:
        DataUnavailableError: a file is missing (named, with where it comes from).
    """
    root = task_root(task, data_root)
    for split in task.splits:
        task.reader.check_files(root, split)  # type: ignore[attr-defined]


def fixed_image_size(task: EvaTask) -> tuple[int, int] | None:
    """``(width, height)`` of every image of ``task`` when its layout fixes it (PatchCamelyon's 96×96), else None
    (a text task, or sizes read from the sampled images: :meth:`PreparedTask.largest_image`)."""
    return getattr(task.reader, "IMAGE_SIZE", None) if task.modality == "image" else None


def prepare(
    task: EvaTask,
    data_root: str | Path | None,
    *,
    answer_format: str = "json",
    num_samples: int | None = None,
    missing_limit: int = 5,
    n_runs: int | None = None,
    sampler_seed: int = 42,
) -> PreparedTask:
    """Read ``task``'s splits from their eva layout and sample them with eva's samplers.

    Args:
        num_samples: eva's ``NUM_SAMPLES``: per class for PatchCamelyon's balanced sampler, in all for the random
            sampler, the first ones where there is none; default the config's.
        missing_limit: eva's ``MISSING_LIMIT``. n_runs: eva's ``N_RUNS`` (default the config's).

    Raises:
        DataUnavailableError: a file is missing (named, with where it comes from). UsageError: a file that is not
            eva's layout; fewer samples of a class than the balanced sampler draws.
    """
    if task.free_form:
        answer_format = "raw"
    root = task_root(task, data_root)
    splits = {s: task.reader(root, s, answer_format) for s in task.splits}
    order = {s: _sampled(task, split, num_samples, sampler_seed) for s, split in splits.items()}
    return PreparedTask(task, root, splits, order, answer_format, missing_limit, n_runs or task.n_runs)


def _sampled(task: EvaTask, split: Any, num_samples: int | None, seed: int) -> list[int]:
    """The indices eva's sampler of ``task`` draws from ``split``, in its order."""
    from eva.core.data import samplers

    if task.sampler is None:
        return list(range(len(split)))[: num_samples or None]
    if task.sampler == "balanced":
        sampler = samplers.BalancedSampler(num_samples=num_samples or task.num_samples, seed=seed)
    else:
        sampler = samplers.RandomSampler(num_samples=num_samples, seed=seed)
    try:
        sampler.set_dataset(split)
    except ValueError as exc:  # the balanced sampler: a class with too few samples
        raise UsageError(f"{task.name} ({split.split}): {exc}") from None
    return [int(i) for i in sampler]


def score(
    prepared: PreparedTask,
    outputs: list[str],
    *,
    judge: Any = None,
    output_dir: str | Path | None = None,
    extra: dict[str, Any] | None = None,
    prompts: list[str] | None = None,
) -> dict[str, Any]:
    """Score the generated ``outputs`` (in :meth:`PreparedTask.requests` order) ``n_runs`` times with eva's
    extractor and metrics, record them with eva's ``SessionRecorder`` and write ``results.json`` and
    ``samples.jsonl`` (:func:`~vllm_eval.evaluation.results.write_task_results`).

    Args:
        judge: for a free-form task, eva's judge model: a callable taking eva's ``TextBatch`` and returning
            ``{"generated_text": [...]}`` (:class:`~vllm_eval.models.generator.eva_judge.EvaJudge`).
        extra: more fields for ``results.json`` (model, engine options ...).

    Returns:
        The ``results.json`` record; ``metrics`` is eva's ``{"val": [...], "test": [...]}``.

    Raises:
        MissingAnswersError: eva's extractor or judge stopped the task (more than ``missing_limit`` unparsable
            answers); ``results.json`` and ``samples.jsonl`` are written first.
        UsageError: a free-form task without a judge.
    """
    from eva.core.trainers._recorder import SessionRecorder

    from ..evaluation.results import package_versions, write_task_results

    task = prepared.task
    if task.free_form and judge is None:
        raise UsageError(f"{task.name} is scored by an LLM judge: give --judge-model or --judge-endpoint")
    start = time.perf_counter()
    per_split, at = {}, 0
    for s, idx in prepared.order.items():
        per_split[s] = outputs[at : at + len(idx)]
        at += len(idx)
    recorder = SessionRecorder(output_dir=str(output_dir or "."), verbose=False)
    scorer = _Scorer(prepared, judge)
    error = None
    try:
        for _ in range(prepared.n_runs):
            run = {s: scorer.score(s, per_split[s]) for s in prepared.order}
            recorder.update([run["val"]] if "val" in run else None, [run["test"]] if "test" in run else None)
    except ValueError as exc:  # eva's extractor or judge: over its missing limit
        error = f"{task.name}: eva stopped the task: {exc} (missing_limit {prepared.missing_limit})"
    metrics = recorder.compute()
    main = _main_score(task, metrics)
    results = {
        "task": task.name,
        "eva_class": task.eva_class,
        "metrics": metrics,
        "main_score": main,
        "n_samples": {s: len(i) for s, i in prepared.order.items()},
        "config": _config(prepared),
        **(extra or {}),
        "versions": package_versions(),
        "seconds": round(time.perf_counter() - start, 2),
    }
    samples = _samples(prepared, per_split, scorer, prompts)
    if output_dir is not None:
        write_task_results(output_dir, {**results, "error": error}, samples)
    if error is not None:
        raise MissingAnswersError(error + (f"; results and samples are in {output_dir}" if output_dir else ""))
    results["samples"] = samples
    return results


class _Scorer:
    """eva's answer extractor (one for the whole task) and metrics (new per split and run)."""

    def __init__(self, prepared: PreparedTask, judge: Any) -> None:
        from eva.language.models.postprocess import ExtractDiscreteAnswer

        self.prepared, self.task, self.judge = prepared, prepared.task, judge
        self.extract = None
        if not self.task.free_form:
            kwargs = {
                "mapping": self.task.mapping,
                "missing_limit": prepared.missing_limit,
                "missing_answer": self.task.missing_answer,
            }
            self.extract = ExtractDiscreteAnswer(answer_format=prepared.answer_format, extract_kwargs=kwargs)
        self.parsed: dict[str, list[Any]] = {}

    def score(self, split: str, outputs: list[str]) -> dict[str, float]:
        import torch

        data = self.prepared.splits[split]
        idx = self.prepared.order[split]
        if self.task.free_form:
            from eva.language.metrics import GEvalCorrectness

            metric = GEvalCorrectness(model=self.judge, missing_limit=self.prepared.missing_limit)
            metric.update(list(outputs), [data.load_target(i) for i in idx])
            if int(metric.count) == 0:  # eva would report total / 0: NaN
                raise ValueError(f"the judge gave no parsable score for the {len(outputs)} {split} answers")
            self.parsed[split] = list(outputs)
            return {f"{split}/GEvalCorrectness": float(metric.compute())}
        from eva.core.metrics import MulticlassClassificationMetrics

        preds = self.extract(list(outputs)) if outputs else torch.zeros(0, dtype=torch.long)
        self.parsed[split] = [int(p) for p in preds]
        metrics = MulticlassClassificationMetrics(
            num_classes=self.task.num_classes,
            average=self.task.average,
            ignore_index=self.task.ignore_index,
            input_type="discrete",
            prefix=f"{split}/",
        )
        metrics.update(preds, torch.tensor([data.load_target(i) for i in idx], dtype=torch.long))
        return {k: float(v) for k, v in metrics.compute().items()}


def main_score_name(task: EvaTask) -> str:
    """The metric a table shows for ``task``: the test split's accuracy (macro for PatchCamelyon, micro for PathMMU)
    or G-Eval correctness."""
    return "test/GEvalCorrectness" if task.free_form else "test/MulticlassAccuracy"


def _main_score(task: EvaTask, metrics: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`main_score_name`'s value, mean over the runs."""
    name = main_score_name(task)
    for stats in metrics.get("test", []):
        if name in stats:
            return {"name": name, "value": stats[name]["mean"]}
    return None


def _config(prepared: PreparedTask) -> dict[str, Any]:
    t = prepared.task
    return {
        "eva_config": t.config,
        "data_root": str(prepared.root),
        "splits": list(prepared.order),
        "sampler": t.sampler,
        "answer_format": prepared.answer_format,
        "mapping": t.mapping,
        "missing_answer": t.missing_answer,
        "missing_limit": prepared.missing_limit,
        "n_runs": prepared.n_runs,
        "system_prompt": t.system_prompt,
        "metrics": "GEvalCorrectness" if t.free_form else f"MulticlassClassificationMetrics({t.average})",
    }


def _samples(
    prepared: PreparedTask, per_split: dict[str, list[str]], scorer: _Scorer, prompts: list[str] | None
) -> list[dict[str, Any]]:
    rows, k = [], 0
    for s, idx in prepared.order.items():
        parsed = scorer.parsed.get(s, [None] * len(idx))
        for i, out, p in zip(idx, per_split[s], parsed):
            rows.append(
                {
                    "split": s,
                    "index": i,
                    "prompt": prompts[k] if prompts else prepared.splits[s].prompt(i),
                    "output": out,
                    "parsed": p,
                    "target": prepared.splits[s].load_target(i),
                }
            )
            k += 1
    return rows
