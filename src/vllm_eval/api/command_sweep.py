"""Sweeps of the commands other than ``run``: ``rerank``, ``generate``, ``classify``, ``reward``,
``token_classify`` and ``transcribe`` with several models (``--model A B C``, a quoted glob, a training folder of
``checkpoint-*`` subfolders; a list in Python).

Each model runs exactly as the command alone with ``--output-dir <output_dir>/<label>`` (so its folder is what a
single command writes); what the models share is the process, its imports, and the engine: a closing backend parks
its engine (:mod:`vllm_eval.models.handoff`) and the next model of the same shape gets its weights loaded into it
in place, read ahead into the page cache while the model before it runs. ``<output_dir>/sweep.json`` holds the
table of main scores as :func:`vllm_eval.api.sweep.write_sweep` writes it, with the command and its options; a
sweep run again with the same command and options skips the models it already holds (resume per model).

Each later model is compared with the first by the paired bootstrap (:mod:`vllm_eval.measure.significance`), as a
``run`` sweep's are: rerank's reranked stage records per-query units as ``run`` does; the others' units are read
from each task's ``samples.jsonl`` (:func:`vllm_eval.evaluation.scoring.units.sample_units`: accuracy per sample,
WER per recording, entity F1 per sentence; BLEU and chrF have none and are marked ``?``), as ``compare --runs``
reads them for any two folders of these commands.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from .sweep import SweepModel, SweepResult, sweep_models, write_sweep


@dataclass(frozen=True)
class ScoreRow:
    """A task of one model's run and the name of its main score."""

    task: str
    main_score_name: str


@dataclass
class CommandRun:
    """One model of a command's sweep.

    Attributes:
        result: what the command's function returned (None for a model a previous run of the sweep finished).
        rows: its tasks with their main score names, in order.
        scores: main score by task, of the tasks that did not fail.
        folder: the folder its per-unit scores are read from (rerank's stage 2 with ``units/<task>.npz``; the
            others' with each task's ``samples.jsonl``), None without one.
        summary_path: None (:func:`~vllm_eval.api.sweep.write_sweep` reads ``folder``).
        failed: the tasks that failed (rerank, generate; the other commands raise instead).
    """

    result: Any
    rows: list[ScoreRow]
    scores: dict[str, float]
    folder: Path | None = None
    summary_path: Path | None = None
    failed: list[str] = field(default_factory=list)


def sweepable(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command's library function so that several models (a list, a glob, a training folder) run as a
    sweep (:func:`sweep_command`); one model calls the function as it is."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def call(model: Any = None, *args: Any, **kwargs: Any) -> Any:
            models = sweep_models(model) if model is not None else None
            if models is None:
                return function(model, *args, **kwargs)
            return sweep_command(command, function, models, *args, **kwargs)

        return call

    return wrap


def sweep_command(command: str, function: Callable[..., Any], models: list[SweepModel], *args: Any, **kwargs: Any):
    """Run ``function`` (a command's library function) once per model of ``models``, in one process and one
    engine where their shapes allow (see the module's docstring).

    Returns:
        A :class:`~vllm_eval.api.sweep.SweepResult` whose ``results`` are :class:`CommandRun` entries.

    Raises:
        UsageError: a remote backend (a sweep loads models itself), or a model path that does not exist (named
            before any engine starts).
        What ``function`` raises for a model; the models before it are in ``sweep.json``.
    """
    from ..models.handoff import engines_kept, read_ahead, reloads
    from ..utils.modelinfo import resolve_model

    if kwargs.get("backend") == "remote" or kwargs.get("endpoint"):
        raise UsageError("--model with several models loads each one: a served model (--backend remote) has one")
    for m in models:  # a missing model named before the first engine starts
        resolve_model(m.model)
    output_dir = kwargs.pop("output_dir", None)
    # as a single command writes results/<command>/<task> by default, a sweep's default is results/<command>/sweep
    out = Path(output_dir) if output_dir is not None else Path("results", command, "sweep")
    result = SweepResult(models, [], out / "sweep.json")
    options = _fingerprint(command, args, kwargs)
    done = _finished(out / "sweep.json", command, options)
    with engines_kept():
        for i, model in enumerate(models):
            if i + 1 < len(models) and os.path.isdir(models[i + 1].model):
                read_ahead(models[i + 1].model)
            started = time.time()
            run = done.get((model.label, model.model))
            reused = False
            if run is None:
                before = reloads()
                returned = function(model.model, *args, output_dir=out / model.label, **kwargs)
                run, reused = command_run(returned, out / model.label), reloads() > before
            result.results.append(run)
            result.reloaded.append(reused)
            result.seconds.append(round(time.time() - started, 2))
            write_sweep(result, significance=False, extra={"command": command, "options": options})
    write_sweep(result, extra={"command": command, "options": options})
    return result


def command_run(returned: Any, folder: Path) -> CommandRun:
    """The main scores of what a command's function returned (rerank: the reranked stage's; the others' by
    :func:`vllm_eval.measure.runfiles.main_metric`), and the folder its per-unit scores are read from (rerank: its
    stage 2; the others: ``folder``, each task's ``samples.jsonl``)."""
    from ..measure.runfiles import main_metric

    if hasattr(returned, "first_stage_scores"):  # rerank
        rows = [ScoreRow(r.task, r.main_score_name) for r in returned.rows if r.stage == "rerank"]
        stage2 = returned.stage_dirs[1] if returned.stage_dirs else None
        return CommandRun(returned, rows, dict(returned.scores), stage2, failed=[r.task for r in returned.failed])
    if isinstance(getattr(returned, "results", None), dict):  # generate
        rows = [ScoreRow(task, "accuracy") for task in returned.results]
        return CommandRun(returned, rows, dict(returned.scores), folder, failed=list(returned.errors))
    rows, scores = [], {}
    for res in returned.results:
        main = main_metric(res.get("metrics", {}))
        rows.append(ScoreRow(res["task"], main))
        if isinstance(res["metrics"].get(main), int | float):
            scores[res["task"]] = float(res["metrics"][main])
    return CommandRun(returned, rows, scores, folder)


def _fingerprint(command: str, args: tuple, kwargs: dict[str, Any]) -> str:
    """What decides a model's scores besides its weights: the command and its options (progress and verbosity
    left out), as a short hash."""
    quiet = {k: v for k, v in kwargs.items() if k not in ("show_progress", "verbose", "started")}
    text = json.dumps([command, list(args), quiet], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _finished(path: Path, command: str, options: str) -> dict[tuple[str, str], CommandRun]:
    """The models a sweep of the same command and options finished before (from its ``sweep.json``), by (label,
    model); {} when there is none, or it was another command or other options."""
    from ..evaluation.two_stage import stage_dirs
    from ..measure.runfiles import read_sweep
    from ..utils.errors import VllmEvalError

    if not path.is_file():
        return {}
    try:
        sweep = read_sweep(path)
    except VllmEvalError:
        return {}
    if sweep.get("command") != command or sweep.get("options") != options:
        return {}
    tasks = sweep.get("tasks") or {}
    scores = sweep.get("scores") or {}
    out = {}
    for m in sweep["models"]:
        if m["label"] in scores:
            rows = [ScoreRow(t, main) for t, main in tasks.items()]
            folder = path.parent / m["label"]
            folder = stage_dirs(folder)[1] if command == "rerank" else folder
            out[(m["label"], m["model"])] = CommandRun(None, rows, dict(scores[m["label"]]), folder)
    return out
