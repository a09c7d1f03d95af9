"""A sweep: several models (checkpoints of one training run, ablations) on the same tasks in one job.

``vllm-eval run --model A B C`` (or a glob, or a training output folder whose ``checkpoint-*`` subfolders are the
models) and ``vllm_eval.evaluate(model=[...])`` run here. What a sweep shares, against one ``run`` per model:

- one process, its imports and the checks, done once;
- the tasks, selected once; their data loaded once (the task processes, started once, keep it between models);
- one engine (or one set of replicas) for every model of the same shape: the next checkpoint's weights are
  loaded into it in place (:mod:`vllm_eval.models.handoff`), read into the page cache while the model before it
  runs; a model of another shape gets a fresh engine;
- one output cache.

Each model's results go to ``<output_dir>/<label>/``, exactly what a single ``run`` with that ``--output-dir``
writes (mteb's result JSON, ``summary.json``); ``<output_dir>/sweep.json`` holds the table of models × tasks, each
model's training step (from its folder's name or ``trainer_state.json``) and, for each model against the first,
the paired bootstrap of every task (:mod:`vllm_eval.measure.significance`). An interrupted sweep resumes per model:
a model whose ``summary.json`` has every task is not loaded again, the others redo only their unfinished tasks.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from ..utils.timeline import phase

#: A folder name that carries a training step: ``checkpoint-500`` (transformers' Trainer), ``step_500``,
#: ``global_step500``, ``epoch-2-step-500``.
_STEP = re.compile(r"(?:checkpoint|step)[-_]?(\d+)$", re.IGNORECASE)


@dataclass
class SweepModel:
    """One model of a sweep: its ``label`` (the folder it writes into), the model as given to the backend, and its
    training ``step`` where one is known (else None)."""

    label: str
    model: str
    step: int | None = None


@dataclass
class SweepResult:
    """What a sweep returns: one :class:`~vllm_eval.api.evaluate.EvaluationResult` per model, in order.

    Attributes:
        models: the :class:`SweepModel` entries.
        results: one ``EvaluationResult`` per model (its rows, scores, folders).
        sweep_path: ``<output_dir>/sweep.json`` (None without ``output_dir``).
        reloaded: per model, whether its weights went into the engine of the model before it (else a fresh one).
        seconds: per model, wall seconds from its start to its last task's result.
        significance: per model after the first, per task, the paired bootstrap against the first model
            (:func:`vllm_eval.measure.significance.compare_runs`'s rows); empty without ``output_dir``.
    """

    models: list[SweepModel]
    results: list[Any]
    sweep_path: Path | None = None
    reloaded: list[bool] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    significance: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """Main score by model label, then task name."""
        return {m.label: r.scores for m, r in zip(self.models, self.results, strict=True)}

    @property
    def failed(self) -> list[Any]:
        """The rows of tasks that failed, over every model."""
        return [row for r in self.results for row in r.failed]


def _evaluate_module() -> Any:
    """:mod:`vllm_eval.api.evaluate` (whose name the package's lazy export ``evaluate``, the function, shadows)."""
    import importlib

    return importlib.import_module(f"{__package__}.evaluate")


def sweep_models(model: Any) -> list[SweepModel] | None:
    """The models of a sweep from ``model`` as given: a list or tuple of models (each may be a glob or a training
    folder), a glob matching several folders, or a training output folder without a ``config.json`` whose
    ``checkpoint-*`` subfolders are the models (in step order); None for one model.

    Raises:
        UsageError: an empty list, a glob that matches nothing, a training folder's checkpoint without weights'
            config, or two models that would write into the same folder.
    """
    from .checks import check_model_argument

    if not isinstance(model, str | os.PathLike | list | tuple):
        return None  # refused by the call as one model of the wrong type
    if isinstance(model, str | os.PathLike) and not _several(os.fspath(model)):
        return None
    given = [model] if isinstance(model, str | os.PathLike) else list(model)
    if not given:
        raise UsageError("--model: no models given")
    for m in given:
        check_model_argument(m)
    paths = [p for m in given for p in _expand(os.fspath(m))]
    models = [SweepModel(_label(p), p, _step(p)) for p in paths]
    seen: dict[str, str] = {}
    for m in models:
        if m.label in seen:
            raise UsageError(f"--model: {seen[m.label]!r} and {m.model!r} would both write into {m.label}/")
        seen[m.label] = m.model
    return models


def _several(model: str) -> bool:
    """Whether one ``--model`` value stands for several: a glob, or a training folder of checkpoints."""
    if glob.has_magic(model):
        return True
    folder = Path(model).expanduser()
    return folder.is_dir() and not (folder / "config.json").is_file() and bool(_checkpoints(folder))


def _expand(model: str) -> list[str]:
    if glob.has_magic(model):
        found = sorted(glob.glob(os.path.expanduser(model)), key=_order)
        if not found:
            raise UsageError(f"--model {model!r} matches no file or folder")
        return [p for f in found for p in _expand(f)]
    folder = Path(model).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file():
        checkpoints = _checkpoints(folder)
        if checkpoints:
            return [str(c) for c in checkpoints]
    return [model]


def _checkpoints(folder: Path) -> list[Path]:
    """A training folder's ``checkpoint-*`` subfolders that hold a model, in step order."""
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and (p / "config.json").is_file()]
    return sorted(found, key=lambda p: _order(str(p)))


def _order(path: str) -> tuple:
    step = _step_from_name(path)
    return (step is None, step or 0, path)


def _step_from_name(path: str) -> int | None:
    match = _STEP.search(Path(path.rstrip("/")).name)
    return int(match.group(1)) if match else None


def _step(path: str) -> int | None:
    """The training step of a checkpoint: from its folder's name, else ``trainer_state.json``'s ``global_step``."""
    step = _step_from_name(path)
    if step is not None:
        return step
    state = Path(path) / "trainer_state.json"
    try:
        value = json.loads(state.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _label(path: str) -> str:
    """The folder a model writes into: its folder's name (a hub id's ``org__name``)."""
    local = Path(path).expanduser()
    if local.exists():
        return local.resolve().name
    return path.strip("/").replace("/", "__")


def sweep(models: list[SweepModel], tasks: Any = None, **kwargs: Any) -> SweepResult:
    """Evaluate every model of ``models`` on the same tasks in one job (what :func:`vllm_eval.evaluate` does for
    a list of models; its keywords, less ``log_samples`` and ``check_parity``).

    Raises:
        UsageError: models of different kinds (an embedder and a ColBERT model), a sweep without ``output_dir``
            where one is needed to resume, or the keywords :func:`vllm_eval.evaluate` refuses.
        What :func:`vllm_eval.evaluate` raises.
    """
    ev = _evaluate_module()

    for refused in ("log_samples", "check_parity"):
        if kwargs.get(refused):
            raise UsageError(f"--{refused.replace('_', '-')} runs with one model; a sweep takes several")
        kwargs.pop(refused, None)
    how = {k: kwargs.pop(k) for k in _HOW if k in kwargs}
    selection = {k: kwargs.pop(k) for k in _SELECTION if k in kwargs}
    backend = kwargs.pop("backend", "vllm")
    pooling_task = kwargs.pop("pooling_task", None)
    output_dir = kwargs.pop("output_dir", None)
    from ..evaluation.scoring import check_scoring

    check_scoring(how.get("scoring", "fast"))
    kind, session = ev._prepare(
        models[0].model,
        backend,
        (pooling_task, kwargs.pop("bge_m3_mode", None)),
        kwargs,
        output_dir,
        how.pop("verbose", False),
        how.pop("started", None),
    )
    ev._check(kind, (backend, models[0].model), session, False, None, how.get("concurrent_tasks"))
    with phase("model"):
        refs = [_resolved(m, kind, backend, session, kwargs) for m in models]
    with phase("tasks"):
        selected = ev.select(kind, tasks, **selection)
        for ref in refs:
            ev.check_image_tasks(ref, selected)
    return _run_sweep(session, models, refs, selected, **how)


_HOW = ("cache_dir", "no_cache", "overwrite_strategy", "continue_on_error", "concurrent_tasks", "scoring")
_HOW += ("show_progress", "verbose", "started")
_SELECTION = ("benchmark", "task_types", "languages", "data", "data_type")


def _resolved(model: SweepModel, kind: str, backend: str, session: Any, options: dict[str, Any]) -> Any:
    """``model`` resolved (a missing one named now, before any engine starts), of the sweep's ``kind``."""
    ev = _evaluate_module()

    ref = ev.resolve_model(model.model, session.spec.remote, revision=options.get("revision"))
    if not session.spec.remote and kind in ev.POOLING_KINDS.values():
        own = ev._kind(model.model, backend, None, None, {})
        if own != kind:
            raise UsageError(f"--model {model.model!r} is a {own} model; the sweep's first model is a {kind} model")
    return ref


def _small(ref: Any) -> bool:
    """Whether ``ref``'s config names a model of at most :data:`~vllm_eval.engine.sizing.FOUR_REPLICAS_MAX_PARAMS`
    parameters (a sweep of only such models evaluates more tasks at once:
    ``evaluation.concurrency.MAX_SWEEP_WORKERS``)."""
    from ..engine import sizing

    shape = sizing.model_shape(ref.path) if getattr(ref, "path", None) else None
    return shape is not None and shape.params <= sizing.FOUR_REPLICAS_MAX_PARAMS


def _run_sweep(session: Any, models: list[SweepModel], refs: list[Any], tasks: list[Any], **how: Any) -> SweepResult:
    """Start the task processes once, then each model in turn on one engine where their shapes allow."""
    from ..evaluation.concurrency import task_workers
    from ..evaluation.prefetch import TaskStore
    from ..evaluation.results import finish_summaries
    from ..evaluation.task_processes import start_for
    from ..models.handoff import engines_kept

    ev = _evaluate_module()
    missing = ev.unavailable_tasks(tasks, how.get("continue_on_error", False))
    cache = ev.open_cache(how.get("cache_dir"), how.get("no_cache", False))
    workers = task_workers(how.get("concurrent_tasks"), len(tasks), sweep=all(map(_small, refs)))
    spec = session.spec
    processes = start_for(tasks, workers, spec.cls, skip=list(missing), keep_data=True, **ev._task_actors(spec.options))
    out = Path(session.output_dir) if session.output_dir else None
    result = SweepResult(models, [], out / "sweep.json" if out else None)
    store = TaskStore()  # the tasks' data, loaded once, where they are evaluated on this process's threads
    try:
        with closing(processes) if processes else nullcontext(), engines_kept():
            for i, (model, ref) in enumerate(zip(models, refs, strict=True)):
                if i + 1 < len(refs):
                    _read_ahead(refs[i + 1])
                started = session.started if i == 0 else time.time()
                folder = out / model.label if out else None
                if processes is not None and processes.closed:  # the kind scores on threads (its own similarity)
                    processes = None
                shared = ev.Shared(cache, missing, processes, None, workers, folder, started, keep_processes=True)
                evaluated, reloaded = _finished(folder, model, tasks) or _one_model(
                    spec, ref, tasks, shared, store, how
                )
                _close_timeline(evaluated.summary_path)
                result.results.append(evaluated)
                result.reloaded.append(reloaded)
                result.seconds.append(round(time.time() - started, 2))
                if out is not None:
                    write_sweep(result, significance=False)  # the table so far; the bootstrap once, at the end
    finally:
        if cache is not None:
            cache.close()
    finish_summaries()
    if out is not None:
        write_sweep(result)
    return result


def _close_timeline(summary: Path | None) -> None:
    """A model's ``summary.json`` keeps the timeline up to its last task: the sweep's end does not rewrite it with
    the phases of the models after it."""
    from ..utils import timeline

    if summary is not None:
        timeline.current().summaries.pop(summary, None)


def _read_ahead(ref: Any) -> None:
    from ..models.handoff import read_ahead

    path = getattr(ref, "path", None)
    if isinstance(path, str):
        read_ahead(path)


def _one_model(spec: Any, ref: Any, tasks: list[Any], shared: Any, store: Any, how: dict[str, Any]) -> tuple:
    """One model of the sweep (:func:`vllm_eval.api.evaluate.evaluate_model`) with the sweep's cache, task
    processes and engine; on this process's threads, each task a fresh copy holding the data loaded for the first
    model (``store``). Returns the result and whether the engine was reused."""
    from ..evaluation.prefetch import prefetch_for

    if shared.output_dir is not None:
        shared.output_dir.mkdir(parents=True, exist_ok=True)
    here = [] if shared.processes else store.fresh(tasks)
    with closing(prefetch_for(here, shared.workers, skip=list(shared.missing), keep=store)) as shared.prefetch:
        return _evaluate_module().evaluate_model(spec, ref, here or tasks, shared, how)


def _finished(folder: Path | None, model: SweepModel, tasks: list[Any]) -> tuple | None:
    """A model a sweep finished before (its ``summary.json`` has a computed or reused row for every task), as an
    ``EvaluationResult`` of reused rows (and False: no engine), without loading it; else None."""
    from ..evaluation.results import TaskScore
    from ..measure.runfiles import read_summary
    from ..utils.errors import VllmEvalError

    ev = _evaluate_module()

    path = folder / "summary.json" if folder else None
    if path is None or not path.is_file():
        return None
    try:
        summary = read_summary(path)
    except VllmEvalError:
        return None
    rows = {r["task"]: r for r in summary.get("scores", []) if not str(r.get("status", "")).startswith("failed")}
    if summary.get("model_path") != model.model and summary.get("model_path") != os.path.abspath(model.model):
        return None
    if not all(t.metadata.name in rows for t in tasks):
        return None
    names = set(TaskScore.__dataclass_fields__)
    kept = [TaskScore(**{**{k: v for k, v in rows[t.metadata.name].items() if k in names}, "status": "reused"})
            for t in tasks]  # fmt: skip
    finished = ev.EvaluationResult(
        rows=kept,
        model_name=summary.get("model", model.label),
        backend=summary.get("backend", ""),
        results_dir=Path(summary["results_dir"]) if summary.get("results_dir") else None,
        summary_path=path,
    )
    return finished, False


def write_sweep(result: SweepResult, significance: bool = True, extra: dict[str, Any] | None = None) -> None:
    """``sweep.json``: the models (label, model, step, folder, seconds, engine reloaded or started), the tasks with
    their main scores, the table of main scores, (``significance``) each model's paired bootstrap against the
    first, and ``extra`` fields (a command's sweep: the command and its options)."""
    if result.sweep_path is None:
        return
    from ..measure.significance import sweep_significance

    done = list(zip(result.models, result.results, strict=False))
    tasks: dict[str, str] = {}
    for _, r in done:
        for row in r.rows:
            tasks.setdefault(row.task, row.main_score_name)
    if significance:
        folders = [getattr(r, "folder", None) or (r.summary_path.parent if r.summary_path else None) for _, r in done]
        with phase("significance"):
            result.significance = sweep_significance([m.label for m, _ in done], folders, tasks=tasks)
    payload = {
        "models": [
            {
                "label": m.label,
                "model": m.model,
                "step": m.step,
                "output_dir": str(result.sweep_path.parent / m.label),
                "seconds": result.seconds[i] if i < len(result.seconds) else None,
                "reloaded": result.reloaded[i] if i < len(result.reloaded) else None,
            }
            for i, (m, _) in enumerate(done)
        ],
        "pending": [m.label for m in result.models[len(done) :]],
        "tasks": tasks,
        "scores": {m.label: r.scores for m, r in done},
        "significance": result.significance,
        **(extra or {}),
    }
    tmp = result.sweep_path.with_name("sweep.json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(result.sweep_path)
