"""A run directory's own JSON read back: ``summary.json``, ``compare.json``, a suite's ``suite.json``, a sweep's
``sweep.json``, and the ``results.json`` of each task of the commands other than ``run``.

``report`` and ``compare --runs`` read these files, which people also keep, copy and edit by hand; a file cut
short by a full disk or an edit that leaves a field of another type is named here (file, field, reason) instead
of failing inside a plot or a table. A score must be a finite number, except in a row marked ``failed`` (written
as NaN) and in a comparison row (a configuration whose task failed); telemetry numbers (seconds, counts) must be
finite, not negative, and below 1e15; a timeline phase must not end before it starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from ..utils.files import check, field, json_object, list_of, read_json

_NONE = type(None)
#: Bound of a telemetry number (seconds, counts, tokens/s): finite floats beyond it overflow the plots' arithmetic,
#: and no run is that long or that large.
_LIMIT = 1e15
_NUMBER = (int, float)
#: Telemetry of a score row, drawn in the report's plots and tables.
_ROW_NUMBERS = (
    "seconds",
    "inputs",
    "distinct_inputs",
    "tokens",
    "truncated",
    "cache_hits",
    "cache_misses",
    "encode_seconds",
    "score_seconds",
    "tokens_per_s",
    "mfu",
    "parity_min_cosine",
    "parity_n",
    "parity_max_abs_diff",
)


def main_metric(metrics: dict[str, Any]) -> str:
    """The main score of a task-results command's ``metrics`` (``results.json``): BLEU for speech translation, WER
    for transcription, entity F1 for token classification, else accuracy (generate, classify, reward)."""
    return next((key for key in ("bleu", "wer", "f1") if key in metrics), "accuracy")


def read_task_runs(folder: str | Path) -> dict[str, tuple[dict[str, Any], Path]]:
    """The tasks a command other than ``run`` wrote into ``folder`` (``generate``, ``classify``, ``reward``,
    ``token_classify``, ``transcribe``): ``<folder>/results.json`` for one task, ``<folder>/<task>/results.json``
    for several; task name -> (its record, its folder), each record's ``task`` and main score checked. {} where
    there are none.

    Raises:
        UsageError: a damaged ``results.json`` (file, field and reason named).
    """
    root = Path(folder)
    paths = [root / "results.json"] if (root / "results.json").is_file() else sorted(root.glob("*/results.json"))
    out: dict[str, tuple[dict[str, Any], Path]] = {}
    for path in paths:
        record = json_object(path, read_json(path), "a task's results")
        task = field(record, "task", (str,), str(path))
        metrics = field(record, "metrics", (dict,), str(path))
        _number(metrics, main_metric(metrics), f"{path}: field 'metrics'", required=True)
        out[task] = (record, path.parent)
    return out


def read_summary(path: str | Path) -> dict[str, Any]:
    """A run's ``summary.json``: the score rows and the timeline checked, the rest as written.

    Raises:
        DataUnavailableError: no such file.
        UsageError: not JSON (line and reason named), or a field of another type or a score that is not a finite
            number (the field named: ``summary.json: field 'scores'[2]: field 'main_score' is nan ...``).
    """
    summary = json_object(path, read_json(path), "a run summary")
    for key in ("model", "backend"):
        field(summary, key, (str, _NONE), str(path))
    field(summary, "engine_options_in_force", (dict, str, _NONE), str(path))
    field(summary, "layout", (dict, _NONE), str(path))
    if field(summary, "command", (list, _NONE), str(path)) is not None:
        list_of(summary["command"], (str,), f"{path}: field 'command'")
    for i, row in enumerate(field(summary, "scores", (list, _NONE), str(path)) or []):
        _score_row(row, f"{path}: field 'scores'[{i}]")
    timeline = field(summary, "timeline", (dict, _NONE), str(path))
    if timeline is not None:
        for i, phase in enumerate(field(timeline, "phases", (list, _NONE), f"{path}: field 'timeline'") or []):
            where = f"{path}: field 'timeline'.phases[{i}]"
            check(phase, (dict,), where)
            field(phase, "phase", (str,), where)
            if _bounded(phase, "end", where, low=-_LIMIT, nullable=False) < _bounded(
                phase, "start", where, low=-_LIMIT, nullable=False
            ):
                raise UsageError(f"{where}: ends ({phase['end']}) before it starts ({phase['start']})")
            field(phase, "task", (str, _NONE), where)
            field(phase, "detail", (str, _NONE), where)
    return summary


def _bounded(obj: dict[str, Any], key: str, where: str, *, low: float = 0.0, nullable: bool = True) -> Any:
    """``obj[key]`` a number in [``low``, :data:`_LIMIT`] (or null when ``nullable``)."""
    value = field(obj, key, (*_NUMBER, _NONE) if nullable else _NUMBER, where)
    if value is not None and not low <= value <= _LIMIT:
        raise UsageError(f"{where}: field {key!r} is {value!r:.20}, outside [{low:g}, {_LIMIT:g}]")
    return value


def _score_row(row: Any, where: str) -> None:
    check(row, (dict,), where)
    field(row, "task", (str,), where)
    for key in ("task_type", "main_score_name", "stage", "status"):
        field(row, key, (str, _NONE), where)
    for key in _ROW_NUMBERS:
        _bounded(row, key, where, low=-1.0 if key == "parity_min_cosine" else 0.0)
    failed = str(row.get("status") or "").startswith("failed")
    score = row.get("main_score")
    if failed and (score is None or (isinstance(score, float) and math.isnan(score))):
        return
    field(row, "main_score", _NUMBER, where)


def read_compare(path: str | Path) -> dict[str, Any]:
    """A comparison's ``compare.json``: reference, rows (task, configuration, score, |Δ|, tolerance, passed) and
    agreement per configuration, checked.

    Raises:
        DataUnavailableError: no such file.
        UsageError: not JSON, or a field missing or of another type (file and field named).
    """
    compare = json_object(path, read_json(path), "a comparison")
    field(compare, "reference", (str, _NONE), str(path))
    for i, row in enumerate(field(compare, "rows", (list, _NONE), str(path)) or []):
        where = f"{path}: field 'rows'[{i}]"
        check(row, (dict,), where)
        field(row, "task", (str,), where)
        field(row, "config", (str,), where)
        field(row, "passed", (bool,), where)
        _number(row, "main_score", where, nan=True)
        _number(row, "delta", where)
        if field(row, "tolerance", _NUMBER, where) <= 0:
            raise UsageError(f"{where}: field 'tolerance' is {row['tolerance']!r}, not a number > 0")
    for label, agree in (field(compare, "agreement", (dict, _NONE), str(path)) or {}).items():
        if agree is None:
            continue
        where = f"{path}: field 'agreement'.{label!r:.40}"
        check(agree, (dict,), where)
        pair = ("min_cosine", "median_cosine") if "min_cosine" in agree else ("max_abs_diff", "median_abs_diff")
        for key in pair:
            _number(agree, key, where, nan=True, required=True)
        field(agree, "n", (int,), where)
    return compare


def read_sweep(path: str | Path) -> dict[str, Any]:
    """A sweep's ``sweep.json``: its models (label, model, step, seconds), tasks (name -> main score name), main
    scores (label -> task -> score) and paired bootstraps (label -> task -> difference or note), checked.

    Raises:
        DataUnavailableError: no such file.
        UsageError: not JSON, or a field missing or of another type, or a score that is not a finite number (file
            and field named).
    """
    sweep = json_object(path, read_json(path), "a sweep")
    for i, model in enumerate(field(sweep, "models", (list,), str(path))):
        where = f"{path}: field 'models'[{i}]"
        check(model, (dict,), where)
        field(model, "label", (str,), where)
        field(model, "model", (str,), where)
        field(model, "step", (int, _NONE), where)
        _bounded(model, "seconds", where)
    for task, main in (field(sweep, "tasks", (dict, _NONE), str(path)) or {}).items():
        check(main, (str,), f"{path}: field 'tasks'.{task!r:.40}")
    for label, scores in (field(sweep, "scores", (dict, _NONE), str(path)) or {}).items():
        where = f"{path}: field 'scores'.{label!r:.40}"
        check(scores, (dict,), where)
        for task in scores:
            _number(scores, task, where, required=True)
    for label, table in (field(sweep, "significance", (dict, _NONE), str(path)) or {}).items():
        where = f"{path}: field 'significance'.{label!r:.40}"
        check(table, (dict,), where)
        for task, diff in table.items():
            here = f"{where}.{task!r:.40}"
            check(diff, (dict,), here)
            if "note" in diff:
                field(diff, "note", (str,), here)
                continue
            for key in ("delta", "low", "high", "p_value"):
                _number(diff, key, here, nan=True, required=True)
            field(diff, "significant", (bool,), here)
    return sweep


def _number(obj: dict[str, Any], key: str, where: str, *, nan: bool = False, required: bool = False) -> None:
    """``obj[key]`` a finite number or null; NaN too with ``nan`` (what a failed task or a zero vector gives)."""
    value = obj.get(key)
    if nan and isinstance(value, float) and math.isnan(value):
        return
    field(obj, key, _NUMBER if required else (*_NUMBER, _NONE), where)


def suite_backends(path: str | Path) -> list[str]:
    """The backends a ``bench --suite`` folder's ``suite.json`` ran, each a sub-folder's name.

    Raises:
        DataUnavailableError: no such file.
        UsageError: not JSON, no ``records`` list, or a backend that is not a plain folder name.
    """
    suite = json_object(path, read_json(path), "a suite record")
    backends = []
    for i, record in enumerate(field(suite, "records", (list,), str(path))):
        where = f"{path}: field 'records'[{i}]"
        check(record, (dict,), where)
        name = field(record, "backend", (str,), where)
        if name in ("", ".", "..") or Path(name).name != name:
            raise UsageError(f"{where}: field 'backend' {name!r:.60} is not a folder name")
        backends.append(name)
    return backends
