"""lm-evaluation-harness's tasks: selected by lm-eval's own names, loaded and checked before any engine starts, run
by lm-eval's own evaluator (``simple_evaluate``) on a model of ours, written in lm-eval's own result files.

lm-eval 0.4.13's registry (``lm_eval.tasks.TaskManager``) holds its task, group and tag names (14,683 with the wheel's
YAMLs) and YAML paths; ``include_path`` adds a folder of the user's own YAMLs, which may override the wheel's tasks
(the way to point a task at a local copy of its data). Prompts, few-shot sampling, filters, metrics and aggregation
are lm-eval's; what we add is the checks a long run wants up front (an unknown name with the closest names, data
that cannot be had, code-executing tasks) and ``summary.json`` beside lm-eval's ``results_<date>.json`` and
``samples_<task>_<date>.jsonl``.
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import UnknownNameError, UsageError

logger = logging.getLogger(__name__)

#: lm-eval's default seeds (``lm_eval/defaults.py``): Python's, NumPy's, torch's and the few-shot sampler's.
SEED_NAMES = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")


def task_manager(include_path: str | os.PathLike | list | None = None) -> Any:
    """lm-eval's ``TaskManager`` over its wheel's tasks and ``include_path`` (a folder, or a list of them), with
    :meth:`_Loaded.load` remembering what it loaded so the evaluator reuses the tasks checked here.

    Raises:
        UsageError: an include path that is not a folder.
    """
    paths = [] if include_path is None else include_path if isinstance(include_path, list) else [include_path]
    for p in paths:
        if not Path(p).is_dir():
            raise UsageError(f"--include-path {os.fspath(p)!r} is not a folder of task YAMLs")
    from lm_eval.tasks import TaskManager

    class _Loaded(TaskManager):
        """A ``TaskManager`` whose ``load`` of the same names returns the tasks it loaded before."""

        def load(self, spec: Any) -> dict[str, Any]:
            key = json.dumps(spec, sort_keys=True, default=str)
            if key not in self._loaded:
                self._loaded[key] = super().load(spec)
            return self._loaded[key]

    logging.getLogger("lm_eval.tasks._index").addFilter(_quiet_overrides)
    key = tuple((os.path.abspath(p), _mtimes(p)) for p in paths)
    if key not in _INDEXED:  # the wheel's ~14,000 YAMLs from the cache folder (lmeval_index), the include path's parsed
        from .lmeval_index import build_manager

        _INDEXED[key] = build_manager(_Loaded, [os.fspath(p) for p in paths])
    from lm_eval.tasks._factory import TaskFactory

    manager = copy.copy(_INDEXED[key])  # the index is read-only; what loads tasks is the manager's own
    manager._factory = TaskFactory(meta=None)
    manager._loaded = {}
    return manager


def _quiet_overrides(record: logging.LogRecord) -> bool:
    """An include path's task that overrides lm-eval's is what the include path is for: logged at debug level."""
    if str(record.msg).startswith("Task '%s' from %s overrides existing task"):
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
    return True


#: Task indexes built in this process, by include paths and their files' modification times.
_INDEXED: dict[tuple, Any] = {}


def _mtimes(folder: Any) -> tuple[float, ...]:
    return tuple(sorted(p.stat().st_mtime for p in Path(folder).rglob("*.y*ml")))


def is_yaml(name: str) -> bool:
    """Whether a ``--tasks`` entry is a task YAML's path (lm-eval takes those besides names)."""
    return name.endswith((".yaml", ".yml"))


def check_names(manager: Any, names: list[str]) -> None:
    """Raises UnknownNameError for a name lm-eval does not know (with the closest names), UsageError for a YAML
    path that does not exist."""
    known = set(manager.all_tasks)
    for name in names:
        if is_yaml(name):
            if not Path(name).is_file():
                raise UsageError(f"--tasks: task YAML {name!r} does not exist")
        elif name not in known:
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise UnknownNameError(
                f"unknown task {name!r}: not one of lm-eval's {len(known):,} task, group and tag names{hint}; "
                "`vllm-eval tasks --search TEXT` finds names"
            )


@dataclass
class PreparedTasks:
    """lm-eval tasks loaded and checked before the model starts.

    Attributes:
        names: what ``--tasks`` gave (names and YAML paths), in order.
        manager: the ``TaskManager`` holding them (the evaluator gets it, and so the same task objects).
        tasks: leaf task name -> lm-eval ``Task``.
        output_types: leaf task name -> its ``output_type`` (``multiple_choice``, ``generate_until`` ...).
    """

    names: list[str]
    manager: Any
    tasks: dict[str, Any] = field(default_factory=dict)
    output_types: dict[str, str] = field(default_factory=dict)

    @property
    def multimodal(self) -> bool:
        """Whether a task shows images (``doc_to_image``), which needs a model that takes them."""
        return any(getattr(t.config, "doc_to_image", None) for t in self.tasks.values())


def prepare_tasks(
    names: list[str], include_path: Any = None, *, confirm_run_unsafe_code: bool = False
) -> PreparedTasks:
    """Select and load lm-eval's tasks (their data included), before any engine starts.

    Raises:
        UnknownNameError: a name lm-eval does not know (closest names given).
        UsageError: a task whose data cannot be had (offline and not in the local cache: the dataset named), a
            task that runs the model's code without ``confirm_run_unsafe_code``, a bad include path.
    """
    manager = task_manager(include_path)
    check_names(manager, names)
    prepared = PreparedTasks(names=list(names), manager=manager)
    for name in names:  # one by one, so a failure names its task
        try:
            manager.load([name])
        except Exception as exc:  # datasets' and the hub's errors: offline, not cached, a bad data file ...
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise UsageError(f"task {name!r}: its data could not be loaded: {reason[:400]}") from None
    loaded = manager.load(list(names))
    for leaf, task in loaded["tasks"].items():
        if getattr(task, "UNSAFE_CODE", False) or getattr(task.config, "unsafe_code", False):
            if not confirm_run_unsafe_code:
                raise UsageError(
                    f"task {leaf!r} runs the model's generated code; pass --confirm-run-unsafe-code to allow it"
                )
        prepared.tasks[leaf] = task
        prepared.output_types[leaf] = str(task.get_config("output_type"))
    return prepared


@dataclass
class LmEvalRun:
    """What :func:`run_tasks` returns.

    Attributes:
        results: lm-eval's results dict (``results``, ``groups``, ``configs``, ``versions``, ``n-shot``,
            ``higher_is_better``, ``n-samples``, ``config`` ...), without ``samples``.
        samples: leaf task name -> lm-eval's per-document records (empty when not logged).
        results_path: lm-eval's ``results_<date>.json``; ``samples_paths``: its ``samples_<task>_<date>.jsonl``.
        seconds: the evaluator's wall time (requests of every task run together).
    """

    results: dict[str, Any]
    samples: dict[str, list[dict[str, Any]]]
    results_path: Path | None
    samples_paths: dict[str, Path]
    seconds: float


def run_tasks(
    lm: Any,
    prepared: PreparedTasks,
    *,
    output_dir: str | os.PathLike | None,
    model_args: dict[str, Any],
    log_samples: bool = True,
    **evaluate: Any,
) -> LmEvalRun:
    """lm-eval's ``simple_evaluate`` of ``prepared`` on ``lm``, its files written by lm-eval's
    ``EvaluationTracker`` under ``output_dir`` (``<output_dir>/<model name>/results_<date>.json`` and
    ``samples_<task>_<date>.jsonl``, as ``lm_eval --output_path`` writes them).

    ``evaluate``: ``simple_evaluate``'s keywords (``num_fewshot``, ``limit``, ``samples``, ``apply_chat_template``,
    ``fewshot_as_multiturn``, ``system_instruction``, ``gen_kwargs``, ``predict_only``, ``bootstrap_iters``,
    ``confirm_run_unsafe_code`` and the seeds); None values keep lm-eval's defaults.
    """
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=None if output_dir is None else os.fspath(output_dir))
    keywords = {k: v for k, v in evaluate.items() if v is not None}
    started = time.perf_counter()
    results = simple_evaluate(
        model=lm,
        model_args=model_args,
        tasks=list(prepared.names),
        task_manager=prepared.manager,
        log_samples=log_samples,
        evaluation_tracker=tracker,
        **keywords,
    )
    seconds = time.perf_counter() - started
    if results is None:
        raise UsageError("lm-eval returned no results (no task ran)")
    samples = results.pop("samples", {}) if log_samples else {}
    results_path, sample_paths = None, {}
    if output_dir is not None:
        tracker.save_results_aggregated(results=results, samples=samples or None)
        folder = Path(output_dir) / str(tracker.general_config_tracker.model_name_sanitized)
        results_path = folder / f"results_{tracker.date_id}.json"
        for task_name in results["configs"] if log_samples else ():
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
            sample_paths[task_name] = folder / f"samples_{task_name}_{tracker.date_id}.jsonl"
    return LmEvalRun(results, samples, results_path, sample_paths, seconds)


def main_scores(results: dict[str, Any]) -> list[tuple[str, str, float, str]]:
    """``(task or group, metric, value, filter)`` rows of lm-eval's results: each leaf task's and group's first
    metric (lm-eval's keys are ``metric,filter``), groups after their tasks as lm-eval's table prints them."""
    rows: list[tuple[str, str, float, str]] = []
    for section in ("results", "groups"):
        for name, metrics in (results.get(section) or {}).items():
            if section == "results" and name in (results.get("groups") or {}):
                continue
            for key, value in metrics.items():
                if "," not in key or key.split(",")[0].endswith("_stderr") or not isinstance(value, int | float):
                    continue
                metric, filt = key.split(",", 1)
                rows.append((name, metric, float(value), filt))
                break
    return rows


def search_rows(manager: Any, text: str | None) -> list[dict[str, str]]:
    """lm-eval's names (tasks, groups, tags) containing ``text`` (case-insensitive; all when None), for
    ``vllm-eval tasks``."""
    needle = (text or "").lower()
    groups, tags = set(manager.all_groups), set(manager.all_tags)
    rows = []
    for name in sorted(manager.all_tasks):
        if needle in name.lower():
            kind = "group" if name in groups else "tag" if name in tags else "task"
            rows.append({"name": name, "command": "generate", "type": f"lm-eval {kind}", "source": "lm-eval"})
    return rows
