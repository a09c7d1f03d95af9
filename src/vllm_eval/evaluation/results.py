"""Running mteb and writing results: one results format for every backend and command.

Per-task scores are mteb's own result JSON, written by ``mteb.ResultCache`` as each task finishes:
``<output_dir>/results/<org__name>/<revision>/experiments/<experiment>/<Task>.json``, where the
experiment names the backend and the settings that change numbers (dtype, quantization, dimensions), so runs of
one model with different backends or dtypes never overwrite or short-circuit each other; mteb's tooling reads them.
``summary.json`` records the run (model, backend, engine options, versions, the table so far) after every task.
A rerun reads finished tasks back (mteb's ``only-missing``) and says so; the output cache
(:mod:`vllm_eval.models.cache`) makes an interrupted task reuse its stored batches.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..utils import timeline
from ..utils.errors import DataUnavailableError, UsageError
from ..utils.progress import run_display
from ..utils.telemetry import device_name, package_versions, task_counters, task_telemetry
from . import task_processes
from .concurrency import run_tasks, task_workers
from .scoring import check_scoring, fast_scoring

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskScore:
    """One row of a run's table: main score of one task (mean over its eval splits/subsets)."""

    task: str
    task_type: str
    main_score_name: str
    main_score: float
    seconds: float
    stage: str = ""
    #: ``computed``, ``reused`` (read back from an earlier run) or ``failed: <reason>``.
    status: str = "computed"
    #: Telemetry of the task (see :func:`vllm_eval.utils.telemetry.task_telemetry`): inputs asked for, distinct
    #: inputs, their tokens after truncation, truncated inputs, outputs read from the cache and computed,
    #: seconds in the backend (encode) and the rest (scoring, mteb), tokens/s of the computed inputs,
    #: and the model FLOPs utilisation where the device's peak is known.
    inputs: int = 0
    distinct_inputs: int = 0
    tokens: int = 0
    truncated: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    encode_seconds: float = 0.0
    score_seconds: float = 0.0
    tokens_per_s: float | None = None
    mfu: float | None = None
    #: ``--check-parity``: minimum cosine between this backend's and the reference's embeddings of
    #: ``parity_n`` inputs the task sent (None when not checked).
    parity_min_cosine: float | None = None
    parity_n: int = 0
    #: ``--check-parity`` of a sparse encoder: the largest |Δ| of one weight over those inputs' vectors (an id on
    #: one side only counts its weight; None for other kinds, or when not checked).
    parity_max_abs_diff: float | None = None


def task_record(
    backend: Any, task: Any, metrics: dict[str, Any], before: Any, seconds: float, config: dict[str, Any]
) -> dict[str, Any]:
    """The ``results.json`` record of a classification or token-classification run: task, source,
    metrics, labels, config, model, backend class, engine options, telemetry (from the backend's
    counters since ``before``), package versions and seconds."""
    from ..utils.telemetry import device_name, package_versions, task_telemetry

    labels = {"labels": backend.labels} if hasattr(backend, "labels") else {}
    return {
        "task": task.name,
        "source": task.source,
        "metrics": metrics,
        **labels,
        "config": config,
        "model": backend.model,
        "backend": type(backend).__name__,
        "engine_kwargs": getattr(backend, "engine_kwargs", None),
        "telemetry": task_telemetry(
            backend.counters.since(before), seconds, None, device_name(), getattr(backend, "dtype", None)
        ),
        "versions": package_versions(),
        "seconds": round(seconds, 2),
    }


def write_task_results(output_dir: str | Path, results: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """The result files of a task run outside mteb (generative, classification): ``results.json``
    (metrics, config, model, versions ...) and ``samples.jsonl`` (one JSON object per input)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    with (out / "samples.jsonl").open("w", encoding="utf-8") as fh:
        for row in samples:
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def evaluate(
    model: Any,
    tasks: list[Any],
    *,
    output_dir: str | Path | None = None,
    show_progress_bar: bool = True,
    run_info: dict[str, Any] | None = None,
    prediction_folder: str | Path | None = None,
    stage: str = "",
    summary_name: str = "summary.json",
    overwrite_strategy: str = "only-missing",
    continue_on_error: bool = False,
    log_samples: bool = False,
    skip: dict[str, str] | None = None,
    started: float | None = None,
    parity_reference: Any = None,
    parity_sample: int = 0,
    prefetch: Any = None,
    concurrent_tasks: int | None = 1,
    processes: Any = None,
    scoring: str = "fast",
    keep_processes: bool = False,
) -> list[TaskScore]:
    """Evaluate ``model`` (any mteb model protocol) on ``tasks`` with ``mteb.evaluate``, task by task.

    With ``output_dir``, each task's mteb result JSON is written as it finishes and ``summary.json`` is rewritten
    after every task. ``overwrite_strategy`` has mteb's meanings: ``only-missing`` (default) reads finished tasks
    back and runs the rest, ``never`` runs only tasks without a result, ``always`` recomputes everything; what is
    reused or replaced is logged. Our backends tag their results with an mteb experiment (backend, dtype, ...).

    Args:
        continue_on_error: a task that fails (data unavailable, a failure of its own) becomes a
            row with ``status="failed: ..."`` and the run goes on; otherwise the error propagates.
        log_samples: also write each task's per-sample predictions as JSONL under
            ``<output_dir>/samples/`` (see :func:`write_samples`).
        skip: task name -> reason, for tasks known not to run (data unavailable): ``failed`` rows, not started.
        started: when the command started (``time.time()``): the summary's total counts from there; default now.
        parity_reference, parity_sample: an encoder to check against (e.g. the sentence-transformers backend of
            the same model): ``parity_sample`` of the inputs each task sent are embedded by both and the minimum
            cosine is recorded in the row (encoders; sparse encoders: also the largest |Δ| of a weight).
        prefetch: a :class:`vllm_eval.evaluation.prefetch.Prefetch` of ``tasks`` already loading (started
            before the engine, so the two overlap); default: one started here, which loads the next
            tasks' data while this one encodes. Closed on return.
        concurrent_tasks: tasks evaluated at once, taking turns on the model (:mod:`vllm_eval.evaluation.concurrency`;
            None: by the machine's cores; 1 with a parity check); for an encoder, each in a process of its own
            (:mod:`vllm_eval.evaluation.task_processes`, spawned: call ``evaluate`` under ``if __name__ ==
            "__main__":``).
        processes, keep_processes: the :class:`~vllm_eval.evaluation.task_processes.TaskProcesses` to use (started
            before the engine; default: started here when wanted), closed on return unless ``keep_processes``.
        scoring: ``fast`` (:mod:`vllm_eval.evaluation.scoring`) or ``mteb`` (mteb's own scoring code).

    Every phase (data load, encode calls, scoring, writes) goes on the run's timeline, kept in ``summary.json``.

    Returns:
        One :class:`TaskScore` per task, in task order.

    Raises:
        UsageError: an unknown ``overwrite_strategy``; a task with images for a model without them.
        Whatever the model raises (an ``EngineError``, ``EndpointError`` ...) or mteb raises for a task.
    """
    import mteb

    _check_arguments(model, tasks, overwrite_strategy)
    tag_experiment(model)
    out = Path(output_dir) if output_dir else None
    cache = mteb.ResultCache(out) if out else None
    if log_samples and out is not None and prediction_folder is None:
        prediction_folder = out / "predictions"
    start = time.time() if started is None else started
    device = device_name()
    workers = task_workers(concurrent_tasks, len(tasks), recording=parity_reference is not None)
    rows: list[TaskScore | None] = [None] * len(tasks)
    reused = {t.metadata.name for t in tasks if _reused(cache, t.metadata.name, model, overwrite_strategy)}
    processes, prefetch = _loading(model, tasks, workers, processes, prefetch, [*(skip or {}), *reused])
    where = (out, cache, overwrite_strategy, prediction_folder, stage, reused, check_scoring(scoring))

    def run_one(task: Any) -> TaskScore:
        run = _runner(model, task, processes, *where)
        return _measured(model, run, device, parity_reference, parity_sample, shared=workers > 1)

    def finished(index: int, row: TaskScore) -> None:
        rows[index] = row
        if out is None:
            return
        with timeline.phase("write", task=tasks[index].metadata.name):
            if log_samples and not row.status.startswith("failed"):
                write_samples(tasks[index], Path(prediction_folder), out / "samples")
            write_summary(model, [r for r in rows if r is not None], out / summary_name, run_info, start, device)

    def one(task: Any) -> TaskScore:
        return _one_task(task, run_one, prefetch, skip, continue_on_error, stage)

    try:
        with run_display(len(tasks), enabled=show_progress_bar) as task_progress:
            run_tasks(tasks, one, workers=workers, display=task_progress, done=finished)
    finally:
        prefetch.close()
        if processes is not None and not keep_processes:
            processes.close()
    return [r for r in rows if r is not None]


def _loading(model: Any, tasks: list[Any], workers: int, processes: Any, prefetch: Any, skip: list[str]) -> tuple:
    """The run's task processes (given, unless the model has a similarity of its own; else started when wanted)
    and prefetch (given, else one loading the tasks' data here, none of it when task processes load their own)."""
    if processes is not None and not task_processes.stands_in_for(model):  # started before the model was known
        processes.close()
        processes = None
        if prefetch is not None:  # it was left to the processes: load here instead
            prefetch.close()
            prefetch = None
    if processes is None and task_processes.wanted(workers, model):
        processes = task_processes.TaskProcesses(workers)
    if prefetch is None:
        from .prefetch import prefetch_for

        prefetch = prefetch_for([] if processes else tasks, workers, skip=skip)
    return processes, prefetch


def _runner(model: Any, task: Any, processes: Any, *where: Any) -> Any:
    """``run()`` of one task: :func:`run_task` here, or in one of the ``processes`` (a task that cannot be sent
    there, :func:`~vllm_eval.evaluation.task_processes.sendable`, runs here). ``where``: the results folder,
    its ``mteb.ResultCache``, the overwrite strategy, the prediction folder, the stage, the reused task names and
    the scoring."""
    out, cache, strategy, predictions, stage, reused, scoring = where
    again = task.metadata.name in reused
    # A result read back is read here when the processes have folders of their own: it is not there.
    if processes is not None and task_processes.sendable(task) and (processes.shares_files or not again):
        folders = {"output_dir": str(out) if out else None, "prediction_folder": predictions}
        folders = {k: str(v) for k, v in folders.items() if v is not None}
        return partial(processes.evaluate, model, task, run_task_at, (strategy, stage, again, scoring), folders)
    return partial(run_task, model, task, cache, strategy, predictions, stage, again, scoring)


def _check_arguments(model: Any, tasks: list[Any], overwrite_strategy: str) -> None:
    if overwrite_strategy not in OVERWRITE_STRATEGIES:
        raise UsageError(
            f"overwrite_strategy must be one of {', '.join(OVERWRITE_STRATEGIES)}, got {overwrite_strategy!r}"
        )
    _check_modalities(model, tasks)


def _check_modalities(model: Any, tasks: list[Any]) -> None:
    """mteb refuses a task none of whose modalities the model has, with a traceback: say it in one line."""
    have = set(getattr(getattr(model, "mteb_model_meta", None), "modalities", None) or ["text"])
    for task in tasks:
        wants = set(getattr(task.metadata, "modalities", None) or ["text"])
        if not have & wants or ("image" in wants and "image" not in have):
            raise UsageError(
                f"task {task.metadata.name} has {' and '.join(sorted(wants))} inputs; the model takes "
                f"{' and '.join(sorted(have))} only"
            )


def _reused(cache: Any, name: str, model: Any, strategy: str) -> bool:
    """Whether ``name``'s result is read back rather than computed (logged either way when one exists).

    A result file mteb cannot read back, or whose main score is not a finite number (a run killed while mteb
    wrote it, a hand edit), is moved aside to ``<Task>.json.damaged`` and the task runs again: the run has its
    engine up by now, and one task's recomputation is cheaper than stopping there.
    """
    existing = cache.get_task_result_path(name, model.mteb_model_meta) if cache else None
    if existing is None or not existing.is_file():
        return False
    if strategy != "always":
        reason = result_damage(existing)
        if reason is not None:
            aside = existing.with_name(existing.name + ".damaged")
            existing.replace(aside)
            logger.warning(
                "%s: %s cannot be read back (%s); moved to %s, the task runs again", name, existing, reason, aside
            )
            return False
    logger.info("%s %s: %s", "replacing" if strategy == "always" else "reusing", name, existing)
    return strategy != "always"


def result_damage(path: str | Path) -> str | None:
    """Why mteb's task result at ``path`` cannot be read back into a score, in one line; None when it can."""
    import math
    import warnings

    from mteb.results import TaskResult

    try:
        with warnings.catch_warnings():  # numpy's mean of no scores warns, then gives the NaN refused below
            warnings.simplefilter("ignore")
            score = float(TaskResult.from_disk(Path(path)).get_score())
    except Exception as exc:  # mteb raises what JSON, pydantic and its own lookups raise; any is a damaged file
        return " ".join(str(exc).split())[:200] or type(exc).__name__
    return None if math.isfinite(score) else f"its main score is {score}"


def _one_task(
    task: Any, run_one: Any, prefetch: Any, skip: dict[str, str] | None, continue_on_error: bool, stage: str
) -> TaskScore:
    """One task's row from ``run_one(task)``, or ``failed: ...`` under ``continue_on_error``; the task's span
    and its encode calls go on the timeline under its name."""
    name = task.metadata.name
    try:
        if skip and name in skip:
            raise DataUnavailableError(skip[name])
        prefetch.wait(task)  # a reused or skipped task returns at once
        timeline.current().task = name
        with timeline.phase("task", task=name):
            return run_one(task)
    except Exception as exc:  # a task's own failure; bugs, interrupts and a stalled engine still stop the run
        from ..engine.watchdog import EngineStalled

        if not continue_on_error or isinstance(exc, (TypeError, AttributeError, NameError, EngineStalled)):
            raise
        reason = " ".join(str(exc).split()) or type(exc).__name__
        logger.warning("%s failed, the run goes on (--continue-on-error): %s", name, reason)
        meta = task.metadata
        return TaskScore(name, meta.type, meta.main_score, float("nan"), 0.0, stage, f"failed: {reason}")
    finally:
        timeline.current().task = None
        prefetch.done(task)


#: mteb's overwrite strategies that make sense for a run (``only-cache`` runs nothing).
OVERWRITE_STRATEGIES = ("only-missing", "never", "always")


def run_task(
    model: Any,
    task: Any,
    cache: Any,
    strategy: str,
    prediction_folder: Any,
    stage: str,
    reused: bool,
    scoring: str = "fast",
) -> TaskScore:
    """One task through ``mteb.evaluate`` (in this process, or in a task process with a stand-in model): its row,
    ``reused`` saying whether mteb read the result back from ``cache`` (an ``mteb.ResultCache`` or None);
    ``scoring``: ``fast`` or ``mteb`` (:func:`vllm_eval.evaluation.scoring.fast_scoring`)."""
    import mteb

    from .scoring.units import recording

    folder = getattr(cache, "cache_path", None) if not reused and scoring == "fast" else None
    with fast_scoring(scoring == "fast"), recording(task, folder):
        result = mteb.evaluate(
            model,
            [task],
            cache=cache,
            overwrite_strategy=strategy,
            co2_tracker=False,
            show_progress_bar=False,
            encode_kwargs={"show_progress_bar": False},  # ours is the backend's; mteb's off
            prediction_folder=prediction_folder,
        )
    tr = result.task_results[0]
    return TaskScore(
        task=task.metadata.name,
        task_type=task.metadata.type,
        main_score_name=task.metadata.main_score,
        main_score=float(tr.get_score()),
        seconds=float(tr.evaluation_time or 0.0),
        stage=stage,
        status="reused" if reused else "computed",
    )


def run_task_at(
    model: Any,
    task: Any,
    strategy: str,
    *args: Any,
    output_dir: str | None = None,
    prediction_folder: str | None = None,
) -> TaskScore:
    """:func:`run_task` with the ``mteb.ResultCache`` of ``output_dir`` (None: none) and ``args`` (stage, reused,
    scoring): what a task process runs, its folders given by keyword (a Ray actor's are folders of its own)."""
    import mteb

    cache = mteb.ResultCache(output_dir) if output_dir else None
    return run_task(model, task, cache, strategy, prediction_folder, *args)


def _measured(
    model: Any, run: Any, device: str, parity_reference: Any, parity_sample: int, shared: bool = False
) -> TaskScore:
    """Run one task (``run()``) and add its telemetry and, when asked, its parity check. ``shared``: other
    tasks use the model meanwhile, so the task's counts are its own calls' (:func:`task_counters`)."""
    counters = getattr(model, "counters", None)
    before = counters.copy() if counters is not None else None
    if parity_reference is not None:
        model.record_inputs(parity_sample)
    with task_counters() as own:
        row = run()
    if counters is not None:  # before the parity check, whose own embedding is not the task's work
        delta = own if shared else counters.since(before)
        dtype, devices = getattr(model, "dtype", None), getattr(model, "accelerators", 1)
        facts = task_telemetry(delta, row.seconds, meta_params(model), device, dtype, devices)
        row = replace(row, **facts)
    if parity_reference is not None:
        row = replace(row, **check_parity(model, parity_reference))
    return row


def check_parity(model: Any, reference: Any) -> dict[str, Any]:
    """Embed the inputs ``model`` recorded during a task with both backends: ``parity_min_cosine``, ``parity_n``;
    for a sparse encoder (its vectors compared sparse) also ``parity_max_abs_diff``."""
    texts = model.recorded_inputs()
    model.record_inputs(0)  # stop recording
    if not texts:
        return {"parity_min_cosine": None, "parity_n": 0}
    if getattr(model, "kind", None) == "sparse_encoder":
        return _sparse_parity(model.encode_sparse(texts), reference.encode_sparse(texts))
    ours = model.encode_texts(texts, show_progress_bar=False)
    theirs = reference.encode_texts(texts, show_progress_bar=False)
    a = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    b = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    return {"parity_min_cosine": round(float(np.sum(a * b, axis=1).min()), 8), "parity_n": len(texts)}


def _sparse_parity(ours: Any, theirs: Any) -> dict[str, Any]:
    """The parity fields of two sparse encoders' CSR vectors of the same inputs: the same row-wise measures as
    ``compare``'s sparse agreement (:mod:`vllm_eval.models.sparse_encoder.base`)."""
    from ..models.sparse_encoder.base import row_cosines, row_max_abs_diff

    return {
        "parity_min_cosine": round(float(row_cosines(ours, theirs).min()), 8),
        "parity_n": ours.shape[0],
        "parity_max_abs_diff": float(row_max_abs_diff(ours, theirs).max()),
    }


def meta_params(model: Any) -> int | None:
    """The model's parameter count from its mteb metadata (for FLOPs/token), or None."""
    meta = getattr(model, "mteb_model_meta", None)
    return getattr(meta, "n_parameters", None)


def tag_experiment(model: Any) -> None:
    """Name the model's mteb experiment after its backend settings (``model.experiment()``), so its
    results go to a folder of their own. Models without ``experiment()`` are left as they are."""
    experiment = getattr(model, "experiment", None)
    if callable(experiment):
        model.mteb_model_meta = model.mteb_model_meta.model_copy(update={"experiment_kwargs": experiment()})


def results_dir(output_dir: str | Path, meta: Any) -> Path:
    """Where mteb writes ``meta``'s task results under ``output_dir`` (its experiment folder included)."""
    base = Path(output_dir) / "results" / meta.model_name_as_path() / meta.revision
    return base / "experiments" / meta.experiment_name if meta.experiment_name else base


def write_samples(task: Any, prediction_folder: Path, samples_dir: Path) -> Path | None:
    """Per-sample predictions of one task as JSONL (``<samples_dir>/<Task>.jsonl``), from mteb's
    prediction file: one line per query of a retrieval task (its top 10 document ids and scores),
    per item otherwise (a pair's score, an item's predicted label ...), with subset and split.

    Returns:
        The JSONL path, or None when mteb wrote no predictions for the task.
    """
    source = prediction_folder / f"{task.metadata.name}_predictions.json"
    if not source.is_file():
        return None
    data = json.loads(source.read_text())
    samples_dir.mkdir(parents=True, exist_ok=True)
    target = samples_dir / f"{task.metadata.name}.jsonl"
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for subset, splits in data.items():
            if subset == "mteb_model_meta" or not isinstance(splits, dict):
                continue
            for split, predictions in splits.items():
                for row in _sample_rows(predictions):
                    fh.write(json.dumps({"subset": subset, "split": split, **row}, default=str) + "\n")
    tmp.replace(target)
    return target


def _sample_rows(predictions: Any, top_k: int = 10):
    if isinstance(predictions, dict):
        values = list(predictions.values())
        if values and all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
            # One list per score kind (STS: cosine, euclidean ... per pair): one row per item.
            for i, row in enumerate(zip(*values, strict=True)):
                yield {"index": i, **dict(zip(predictions, row, strict=True))}
            return
        for key, value in predictions.items():
            if isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
                ranked = sorted(value.items(), key=lambda kv: kv[1], reverse=True)[:top_k]
                yield {"query_id": key, "top_k": [[doc, float(score)] for doc, score in ranked]}
            else:
                yield {"id": key, "prediction": value}
    elif isinstance(predictions, list):
        for i, value in enumerate(predictions):
            yield {"index": i, "prediction": value}
    else:
        yield {"prediction": predictions}


def write_summary(
    model: Any,
    rows: list[TaskScore],
    path: Path,
    run_info: dict[str, Any] | None,
    started: float,
    device: str | None = None,
) -> None:
    """Write ``summary.json``: the model, the run's settings and provenance, package versions and the rows so far.

    Provenance: the engine options in force after our defaults, the prompts and templates, the device, engine start
    seconds, start and end times, the total seconds since ``started`` (engine start and data loading included), and
    the timeline (phases that ended after ``started``). Written to a temporary file renamed (never half a file)."""
    meta = getattr(model, "mteb_model_meta", None)  # None: a model outside mteb (run_info names it)
    output_dir = path.parent
    now = time.time()
    summary = {
        "model": getattr(meta, "name", None),
        "revision": getattr(meta, "revision", None),
        **(run_info or {}),
        **provenance(model),
        "device": device,
        "versions": package_versions(),
        "python": platform.python_version(),
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "finished_at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
        "total_seconds": round(now - started, 2),
        "results_dir": str(results_dir(output_dir, meta) if meta is not None else output_dir),
        "scores": [asdict(r) for r in rows],
        "timeline": timeline.current().as_json(since=started),
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_json(path, summary)
    timeline.current().summaries[path] = started


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write to a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)


def finish_summaries() -> None:
    """Bring the timeline of every ``summary.json`` this process wrote up to now (the engines' shutdown
    comes after the last task's write). A summary that is gone or unreadable is left alone."""
    for path, started in list(timeline.current().summaries.items()):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        summary["timeline"] = timeline.current().as_json(since=started)
        _write_json(path, summary)


def provenance(model: Any) -> dict[str, Any]:
    """What produced a backend's numbers, beyond the model: engine options in force, prompts, templates."""
    out: dict[str, Any] = {}
    # Local replicas add their share of the GPU to the options (the summary says what each engine was built with).
    engine_kwargs = getattr(model, "built_with", None) or getattr(model, "engine_kwargs", None)
    if engine_kwargs is not None:
        from ..engine.args import engine_options_in_force

        try:
            path = getattr(model, "model", None)
            out["engine_options_in_force"] = engine_options_in_force(
                dict(engine_kwargs), path if isinstance(path, str) else None
            )
        except Exception as exc:  # provenance must not fail a finished run
            out["engine_options_in_force"] = f"unavailable: {exc}"
    counters = getattr(model, "counters", None)
    if counters is not None:
        out["engine_start_seconds"] = round(counters.engine_start_seconds, 2)
    layout = getattr(model, "layout", None)
    if layout is not None and hasattr(layout, "as_json"):  # GPUs, replicas per GPU, tensor-parallel size
        out["layout"] = layout.as_json()
    pool = getattr(model, "pool", None)
    if pool is not None and hasattr(pool, "state"):  # where the replicas ran, what each did, what was lost
        out["replicas"] = asdict(pool.state())
    prompting = getattr(model, "prompting", None)
    if prompting is not None:
        template = prompting.instruction_template
        out["prompts"] = {
            "prompts": prompting.model_prompts or None,
            "instruction_template": template if template is None or isinstance(template, str) else repr(template),
            "instructions": prompting.prompts_dict,
            "apply_instruction_to_documents": prompting.apply_instruction_to_documents,
        }
    template = getattr(model, "template", None)
    if template is not None:
        out["score_template"] = asdict(template)
    if hasattr(model, "max_length"):
        out["max_length"] = model.max_length
    return out
