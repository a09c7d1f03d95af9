"""Two-stage retrieval: a first stage (an embedding model or mteb's BM25 baseline) retrieves, a reranker reorders
each query's best candidates; both stages are evaluated with :func:`vllm_eval.evaluation.results.evaluate` and keep
mteb's
results format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from .results import TaskScore, evaluate


def stage_dirs(output_dir: Path) -> tuple[Path, Path]:
    """Where a two-stage run writes each stage's mteb results and ``summary.json``: ``<output_dir>/stage1`` (the
    first stage's retrieval) and ``<output_dir>/stage2`` (the reranking)."""
    return output_dir / "stage1", output_dir / "stage2"


def load_first_stage(spec: str, **encoder_kwargs: Any) -> Any:
    """First-stage retriever: ``"bm25s"`` (mteb's ``mteb/baseline-bm25s``) or an embedding model for
    the vLLM encoder backend.

    Raises:
        ModelNotFoundError: a model path that does not exist.
    """
    if is_bm25(spec):
        from ..engine.procenv import set_env_default

        # bm25s runs a JAX top-k at import where JAX is installed, and JAX on a GPU takes 75 % of its memory at
        # once: a reranker on that GPU then ran out of memory (an 8B CrossEncoder on an H100). bm25s's scores are
        # NumPy arrays on the CPU; JAX stays there unless the user chose otherwise.
        set_env_default("JAX_PLATFORMS", "cpu")
        import mteb

        return mteb.get_model("mteb/baseline-bm25s")
    from ..models.backends import load_backend

    # One engine, as before layouts were chosen: the reranker's engines share the GPUs with it.
    layout = {"data_parallel_size": 1, "replicas_per_gpu": 1}
    return load_backend("encoder", "vllm", spec, **{**layout, **encoder_kwargs})


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
    overwrite_strategy: str = "always",
    **evaluate_kwargs: Any,
) -> list[TaskScore]:
    """Retrieve with ``first_stage``, keep each query's ``top_k`` and rerank them with ``reranker``.

    The first stage runs through ``mteb.evaluate`` with a prediction folder; each task is then
    turned into a reranking task with mteb's ``convert_to_reranking(predictions, top_k)`` and
    evaluated with the reranker. Both stages' mteb results are written under ``output_dir``
    (``stage1/`` and ``stage2/``).

    ``overwrite_strategy`` (default ``always``: the second stage is built from the first stage's
    predictions of this run) and ``evaluate_kwargs`` are passed to both stages' :func:`evaluate`.

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
        output_dir=stage_dirs(out)[0],
        show_progress_bar=show_progress_bar,
        run_info=run_info,
        overwrite_strategy=overwrite_strategy,
        **evaluate_kwargs,
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
        fresh = getattr(task, "fresh_copy", None)  # a task its class cannot make anew says how (a replica's)
        second_task = (fresh() if fresh else type(task)()).convert_to_reranking(out / "predictions", top_k=k)
        rows.append(first)
        rows.extend(
            evaluate(
                reranker,
                [second_task],
                output_dir=stage_dirs(out)[1],
                show_progress_bar=show_progress_bar,
                run_info={**(run_info or {}), "top_k": k},
                overwrite_strategy=overwrite_strategy,
                **evaluate_kwargs,
                stage="rerank",
            )
        )
    return rows
