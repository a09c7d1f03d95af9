"""``vllm_eval.rerank``: retrieve with a first stage, keep each query's top-k, rerank them; everything
``vllm-eval rerank`` does, from Python.

One call checks every option before anything loads, selects the retrieval or reranking tasks (by name or your
own data), opens the output cache, loads the first stage (mteb's BM25 baseline or an embedding model on vLLM)
and the reranker, runs both stages through mteb and writes both stages' results. ``vllm-eval rerank`` parses
its flags and calls it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from ..utils.timeline import phase
from .checks import check_model_argument, open_cache, resolve_model
from .command_sweep import sweepable
from .evaluate import EvaluationResult
from .session import Session, prepare, split_options

#: Task types a reranker can be evaluated on.
#: Backend options ``rerank`` passes on when given; the capability options (``device``, ``endpoint`` ...) too.
BACKEND_OPTIONS = ("preset", "prompts", "api")


@dataclass
class RerankResult(EvaluationResult):
    """What :func:`rerank` returns: an :class:`~vllm_eval.api.evaluate.EvaluationResult` whose rows are each
    task's two stages, ``stage="first"`` then ``stage="rerank"``.

    Attributes:
        model_name: the reranker's name as recorded in the results.
        results_dir: where mteb's result JSON of the reranker went (under ``<output_dir>/stage2``; None without
            ``output_dir``).
        summary_path: ``<output_dir>/stage2/summary.json`` (None without ``output_dir``).
        stage_dirs: ``<output_dir>/stage1`` and ``<output_dir>/stage2`` (each with mteb's result JSON and a
            ``summary.json``), None without ``output_dir``.
        first_stage: the first stage as given (``bm25s`` or an embedding model).
        top_k: candidates per query handed to the reranker.
    """

    stage_dirs: tuple[Path, Path] | None = None
    first_stage: str = "bm25s"
    top_k: int = 100

    @property
    def scores(self) -> dict[str, float]:
        """The reranked main score by task name, of the tasks that did not fail."""
        return self._stage_scores("rerank")

    @property
    def first_stage_scores(self) -> dict[str, float]:
        """The first stage's main score by task name, of the tasks that did not fail."""
        return self._stage_scores("first")

    def _stage_scores(self, stage: str) -> dict[str, float]:
        return {r.task: r.main_score for r in self.rows if r.stage == stage and not r.status.startswith("failed")}


@sweepable("rerank")
def rerank(
    model: str | os.PathLike | None = None,
    tasks: list[str] | str | None = None,
    *,
    first_stage: str | os.PathLike = "bm25s",
    top_k: int = 100,
    data: str | os.PathLike | None = None,
    backend: str = "vllm",
    output_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    no_cache: bool = False,
    overwrite_strategy: str = "always",
    continue_on_error: bool = False,
    log_samples: bool = False,
    show_progress: bool = True,
    verbose: bool = False,
    started: float | None = None,
    **options: Any,
) -> RerankResult:
    """Evaluate a reranker (a cross-encoder, or an LLM with a reranker recipe) on retrieval tasks in two stages.

    The first stage retrieves, each query keeps its ``top_k`` best documents, the reranker reorders them; both
    stages are scored by mteb. Every keyword has the name of ``vllm-eval rerank``'s flag (the reranker,
    ``--reranker``, is ``model``). Call it under ``if __name__ == "__main__":``: vLLM starts its processes with
    ``spawn``.

    Args:
        model: the reranker: a model directory or hub id (offline: a cached one); for a served model the served
            name (optional).
        tasks: mteb retrieval or reranking task names (a list, or one string of names separated by spaces or
            commas); default ``LeeKnownItemRetrieval``.
        first_stage: ``bm25s`` (mteb's BM25 baseline) or an embedding model (directory or hub id) run on vLLM.
        top_k: candidates per query kept for reranking (a task's whole corpus when it is smaller).
        data: your own data instead of ``tasks``: a BEIR directory (retrieval) or a ``.jsonl``/``.csv``/``.parquet``
            reranking file.
        backend: the reranker's backend: ``vllm`` (default), ``st`` (sentence-transformers' CrossEncoder, the
            reference), ``remote`` (``/score`` or ``/rerank`` of running servers).
        output_dir: both stages' mteb results and ``summary.json`` go to ``stage1/`` and ``stage2/`` here (created
            now); default: a temporary folder, removed on return.
        cache_dir, no_cache: the output cache's folder (default ``$VLLMEVAL_CACHE_DIR``, else
            ``~/.cache/vllm-eval``), or none at all.
        overwrite_strategy: mteb's, for both stages; default ``always`` (the second stage is built from the first
            stage's predictions of this call).
        continue_on_error: a failed task becomes a row with ``status="failed: ..."`` and the call goes on.
        log_samples: ``<output_dir>/stage*/samples/<Task>.jsonl`` per task.
        show_progress: progress bars. ``verbose``: vLLM's INFO logs and third-party warnings.
        started: when the call started (``time.time()``), for the summaries' totals; default now.
        **options: the reranker's backend options (``preset``, ``prompts``, ``api``, ``device``,
            ``data_parallel_size``, ``endpoint`` ...) and vLLM ``EngineArgs`` (``dtype``, ``max_model_len``,
            ``max_num_seqs`` ...; checked against vLLM's list), all for the reranker.

    Returns:
        A :class:`RerankResult`.

    Raises:
        UsageError: a bad option or combination, a task that is not a retrieval task, no reranker for a local
            backend (one line, before anything loads).
        OptionError: an unknown engine option (close names suggested).
        UnknownNameError: an unknown task or backend.
        DataUnavailableError: a task whose data is not available offline.
        ModelNotFoundError: a reranker or first-stage model that does not exist.
        EngineError, EndpointError: a failure of the engine or a server while running.
    """
    check_model_argument(model)
    if top_k < 1:
        raise UsageError(f"--top-k: must be a positive integer, got {top_k!r}")
    with phase("imports"):  # mostly the backend's and mteb's imports, then the option checks
        backend_options, engine = split_options(options, BACKEND_OPTIONS)
        session = prepare(
            "reranker",
            [backend],
            backend_options,
            engine,
            output_dir=None if output_dir is None else os.fspath(output_dir),
            verbose=verbose,
            started=started,
        )
    first_stage = os.fspath(first_stage)
    with phase("model"):
        resolved = _resolve_models(session, model, first_stage)
    with phase("tasks"):
        from ..tasks import check_available, rerank_tasks

        selected = rerank_tasks(tasks, None if data is None else os.fspath(data))
        check_available(selected)
    return _run(
        session,
        resolved,
        selected,
        (cache_dir, no_cache),
        first_stage=first_stage,
        reranker=None if model is None else os.fspath(model),
        top_k=top_k,
        show_progress=show_progress,
        overwrite_strategy=overwrite_strategy,
        continue_on_error=continue_on_error,
        log_samples=log_samples,
    )


def _resolve_models(session: Session, model: Any, first_stage: str) -> Any:
    """The reranker resolved once (handed to its backend); a first-stage model that does not exist fails now."""
    from ..evaluation.two_stage import is_bm25

    resolved = resolve_model(None if model is None else os.fspath(model), session.spec.remote, "--reranker")
    if not is_bm25(first_stage):
        resolve_model(first_stage, False, "--first-stage")
    return resolved


def _run(session: Session, model: Any, tasks: list[Any], cache_at: tuple[Any, bool], **how: Any) -> RerankResult:
    """Load both stages, evaluate, write results; the engines are shut down and the cache closed on return."""
    from ..evaluation.results import finish_summaries, results_dir
    from ..evaluation.two_stage import evaluate_two_stage, load_first_stage, stage_dirs
    from ..utils import timeline

    show = how["show_progress"]
    cache = open_cache(*cache_at)
    first = load_first_stage(how["first_stage"], show_progress_bar=show)
    if cache is not None and hasattr(first, "use_cache"):  # mteb's BM25 computes no outputs to cache
        first.use_cache(cache)
    try:
        reranker = session.spec.load(model, show_progress_bar=show)
        reranker.use_cache(cache)
    except BaseException:
        getattr(first, "close", lambda: None)()
        if cache is not None:
            cache.close()
        raise
    try:
        with tempfile.TemporaryDirectory(prefix="vllm-eval-rerank-") as tmp:
            rows = evaluate_two_stage(
                first,
                reranker,
                tasks,
                top_k=how["top_k"],
                output_dir=session.output_dir or tmp,
                show_progress_bar=show,
                run_info=_run_info(session.spec, how, reranker),
                overwrite_strategy=how["overwrite_strategy"],
                continue_on_error=how["continue_on_error"],
                log_samples=how["log_samples"],
                started=session.started,
            )
    finally:
        reranker.close()
        getattr(first, "close", lambda: None)()
        if cache is not None:
            cache.close()
    finish_summaries()  # the engines' shutdown is on the timeline too
    meta = reranker.mteb_model_meta
    out = Path(session.output_dir) if session.output_dir else None
    stages = stage_dirs(out) if out else None
    return RerankResult(
        rows=rows,
        model_name=meta.name,
        backend=session.spec.name,
        results_dir=results_dir(stages[1], meta) if stages else None,
        summary_path=stages[1] / "summary.json" if stages else None,
        timeline=timeline.current().as_json(since=session.started),
        cache=cache,
        stage_dirs=stages,
        first_stage=how["first_stage"],
        top_k=how["top_k"],
    )


def _run_info(spec: Any, how: dict[str, Any], reranker: Any) -> dict[str, Any]:
    return {
        "first_stage": how["first_stage"],
        "reranker": how["reranker"],
        "backend": spec.name,
        "preset": getattr(getattr(reranker, "preset", None), "name", None),
        "engine_kwargs": getattr(reranker, "engine_kwargs", None),
        "command": sys.argv,
    }
