"""``vllm_eval.evaluate``: an embedding model on mteb tasks, everything ``vllm-eval run`` does, from Python.

The shape of mteb's ``mteb.evaluate`` and lm-evaluation-harness's ``simple_evaluate``: one call that selects
the tasks (names, benchmarks, type and language filters, or your own data file), checks every option before
anything loads, starts the backend (one vLLM engine, local replicas or Ray actors, a reference backend, or
servers), loads task data while the engine starts, scores tasks in processes of their own beside the encoding,
reads and writes the output cache, resumes from the results already written, records the run's timeline, and
writes mteb's result JSON and ``summary.json`` as each task finishes. ``vllm-eval run`` parses its flags and
calls it.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..evaluation.scoring import check_scoring
from ..utils.errors import UsageError, VllmEvalError
from ..utils.timeline import phase
from .checks import check_image_tasks, check_model_argument, open_cache, resolve_model
from .session import Session, prepare, split_options

logger = logging.getLogger(__name__)

#: The kinds ``evaluate`` runs, by vLLM pooling task.
POOLING_KINDS = {"embed": "encoder", "token_embed": "token_embedder"}
#: Backend options ``evaluate`` passes on when given (constructor keywords of the kind's backends); the
#: capability options (``device``, ``data_parallel_size``, ``endpoint`` ...) reach the backend too.
BACKEND_OPTIONS = (
    "revision",
    "preset",
    "model_name",
    "prompts",
    "instruction_template",
    "apply_instruction_to_documents",
    "image_prompts",
    "dimensions",
    "chunk_size",
    "store_dtype",
    "max_active_dims",
    "bge_m3_weights",
    "encoding_format",
)
#: ``bge_m3_mode``: the kind that evaluates each output of a BGE-M3 model; ``all`` (the weighted sum of the three
#: scores) is the sparse encoder's search with ``bge_m3_weights`` (:mod:`vllm_eval.models.sparse_encoder.hybrid`).
BGE_M3_KINDS = {"dense": "encoder", "sparse": "sparse_encoder", "colbert": "token_embedder", "all": "sparse_encoder"}
#: Settings the parity reference must share with the backend it checks.
_PARITY_SHARED = (
    "preset",
    "prompts",
    "instruction_template",
    "instructions",
    "apply_instruction_to_documents",
    "dimensions",
    "revision",
    "max_active_dims",
)


@dataclass
class EvaluationResult:
    """What :func:`evaluate` returns.

    Attributes:
        rows: one :class:`~vllm_eval.evaluation.results.TaskScore` per task, in task order (main score, seconds,
            status ``computed`` / ``reused`` / ``failed: <reason>``, telemetry).
        model_name: the model's name as recorded in the results (``org/name``).
        backend: the backend's table name (``vllm``, ``st``, ``remote`` ...).
        results_dir: where mteb's per-task result JSON went (None without ``output_dir``).
        summary_path: ``<output_dir>/summary.json`` (None without ``output_dir``).
        timeline: the run's phases and spans (:meth:`vllm_eval.utils.timeline.Timeline.as_json`), as
            ``summary.json`` keeps them.
        cache: the output cache (:class:`~vllm_eval.models.cache.OutputCache`, closed; ``cache.stats`` has its
            hits and misses, ``cache.directory`` its folder), None with ``no_cache``.
    """

    rows: list[Any]
    model_name: str
    backend: str
    results_dir: Path | None = None
    summary_path: Path | None = None
    timeline: dict[str, Any] = field(default_factory=dict)
    cache: Any = None

    @property
    def failed(self) -> list[Any]:
        """The rows of tasks that failed (with ``continue_on_error``)."""
        return [r for r in self.rows if r.status.startswith("failed")]

    @property
    def scores(self) -> dict[str, float]:
        """Main score by task name, of the tasks that did not fail."""
        return {r.task: r.main_score for r in self.rows if not r.status.startswith("failed")}


def evaluate(
    model: str | os.PathLike | None = None,
    tasks: list[str] | str | None = None,
    *,
    benchmark: list[str] | str | None = None,
    task_types: list[str] | None = None,
    languages: list[str] | None = None,
    data: str | os.PathLike | None = None,
    data_type: str | None = None,
    backend: str = "vllm",
    pooling_task: str | None = None,
    bge_m3_mode: str | None = None,
    output_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    no_cache: bool = False,
    overwrite_strategy: str = "only-missing",
    continue_on_error: bool = False,
    log_samples: bool = False,
    check_parity: int | None = None,
    concurrent_tasks: int | None = None,
    scoring: str = "fast",
    show_progress: bool = True,
    verbose: bool = False,
    started: float | None = None,
    **options: Any,
) -> EvaluationResult:
    """Evaluate an embedding model (one vector per text, or one per token) on mteb tasks.

    Every keyword has the name of ``vllm-eval run``'s flag (``--max-num-seqs`` is ``max_num_seqs=``). Call it under
    ``if __name__ == "__main__":``: vLLM and the task processes start their processes with ``spawn``.

    Args:
        model: a model directory, a hub id (offline: a cached one), or for a served model the served name;
            default: the packaged all-MiniLM-L6-v2. Several (a list, a glob, a folder of ``checkpoint-*``): a
            sweep (:mod:`vllm_eval.api.sweep`), returning a :class:`~vllm_eval.api.sweep.SweepResult`.
        tasks: mteb task names (a list, or one string of names separated by spaces or commas); a benchmark's
            name here runs that benchmark. Default: the offline suite (with no ``benchmark`` or ``data``).
        benchmark: mteb benchmark names, e.g. ``"MTEB(eng, v2)"``.
        task_types, languages: keep tasks of these mteb types (``STS``, ``Retrieval`` ...) and ISO 639-3 languages.
        data, data_type: your own data as an mteb task (a ``.jsonl``/``.csv``/``.parquet`` file, a BEIR directory, a
            ``bench --suite`` replica); its mteb task type when the fields do not say.
        backend: ``vllm`` (default), ``st`` (sentence-transformers, the reference), ``hf``, ``remote``.
        pooling_task: ``embed`` or ``token_embed``; default ``token_embed`` for a ColBERT architecture, and a sparse
            encoder (:mod:`vllm_eval.models.sparse_encoder`) for a SPLADE model (sentence-transformers'
            ``SpladePooling``).
        bge_m3_mode: a BGE-M3 model's output to evaluate: ``dense`` (CLS vector), ``sparse`` (lexical weights,
            dot product) or ``colbert`` (multi-vector, MaxSim); the vLLM backend runs it as ``BgeM3EmbeddingModel``
            with that output's pooling task; ``all``: retrieval by the weighted sum of the three scores, weights
            ``bge_m3_weights`` (default ``(1, 1, 1)``; :mod:`vllm_eval.models.sparse_encoder.hybrid`).
        output_dir: mteb's result JSON per task, ``summary.json`` and ``vllm-eval.log`` go here (created now).
        cache_dir, no_cache: the output cache's folder (default ``$VLLMEVAL_CACHE_DIR``, else ``~/.cache/vllm-eval``).
            ``log_samples``: ``<output_dir>/samples/<Task>.jsonl`` per task.
        overwrite_strategy: mteb's: ``only-missing`` (resume), ``always``, ``never``. ``continue_on_error``: a failed
            task becomes a row with ``status="failed: ..."`` and the run goes on.
        check_parity: embed this many of each task's inputs with the reference backend too: rows' minimum cosine
            ``parity_min_cosine`` (sparse: against ``st``/``hf`` for SPLADE/BGE-M3, and ``parity_max_abs_diff``).
        concurrent_tasks: tasks evaluated at once (default: by the machine's cores).
        scoring: ``fast`` (mteb's metrics computed on arrays: the same numbers, :mod:`vllm_eval.evaluation.scoring`)
            or ``mteb`` (mteb's own scoring code).
        show_progress, verbose: progress bars; vLLM's INFO logs and third-party warnings.
        started: when the run started (``time.time()``; ``summary.json``'s total counts from there); default now.
        **options: backend options (``preset``, ``prompts``, ``instruction_template``, ``dimensions``,
            ``chunk_size``, ``data_parallel_size``, ``replicas_per_gpu``, ``ray_address``, ``endpoint`` ...) and
            vLLM ``EngineArgs`` (``dtype``, ``max_model_len``, ``max_num_seqs`` ...; checked against vLLM's list).

    Returns:
        An :class:`EvaluationResult`.

    Raises:
        UsageError: a bad option or combination (one line, before anything loads).
        OptionError, UnknownNameError: an unknown engine option, task, benchmark or backend (close names suggested).
        DataUnavailableError, ModelNotFoundError: task data not available offline; a local model that is not there.
        EngineError, EndpointError: a failure of the engine or a server while running.
    """
    if (models := _sweep_models(model)) is not None:
        return _sweep(models, {k: v for k, v in locals().items() if k not in ("options", "models")}, options)
    check_scoring(scoring)
    kind, session = _prepare(model, backend, (pooling_task, bge_m3_mode), options, output_dir, verbose, started)
    _check(kind, (backend, model), session, log_samples, check_parity, concurrent_tasks)
    with phase("model"):
        resolved = resolve_model(
            None if model is None else os.fspath(model), session.spec.remote, revision=options.get("revision")
        )
    with phase("tasks"):
        selected = select(kind, tasks, benchmark, task_types, languages, data, data_type)
        check_image_tasks(resolved, selected)
        _check_mode_tasks(bge_m3_mode, selected)
    return _run(
        session,
        resolved,
        selected,
        (cache_dir, no_cache),
        check_parity=check_parity,
        concurrent_tasks=concurrent_tasks,
        scoring=scoring,
        show_progress=show_progress,
        overwrite_strategy=overwrite_strategy,
        continue_on_error=continue_on_error,
        log_samples=log_samples,
    )


def _sweep_models(model: Any) -> Any:
    """The models ``model`` names when it names several (:func:`vllm_eval.api.sweep.sweep_models`), else None."""
    from .sweep import sweep_models

    return sweep_models(model)


def _sweep(models: Any, given: dict[str, Any], options: dict[str, Any]) -> Any:
    """:func:`vllm_eval.api.sweep.sweep` of ``models`` with :func:`evaluate`'s other keywords ``given`` and
    ``options``."""
    from .sweep import sweep

    given.pop("model")
    return sweep(models, given.pop("tasks"), **given, **options)


def _prepare(
    model: Any,
    backend: str,
    task_and_mode: tuple[str | None, str | None],
    options: dict[str, Any],
    output_dir: Any,
    verbose: bool,
    started: Any,
) -> tuple[str, Session]:
    """The kind of model and the checked :class:`Session`, before anything loads."""
    from ..utils.hub import ensure_offline_if_unreachable

    check_model_argument(model)
    with phase("imports"):  # mostly the backend's and mteb's imports, then the option checks
        # First: the hub libraries read offline mode once, when imported; the kind may be read from a model's files.
        ensure_offline_if_unreachable()
        _bge_m3_weights(task_and_mode[1], options)
        backend_options, engine = split_options(options, BACKEND_OPTIONS)
        kind = _kind(model, backend, *task_and_mode, backend_options)
        engine = _bge_m3_engine(kind, backend, task_and_mode[1], engine)
        session = prepare(
            kind,
            [backend],
            backend_options,
            engine,
            output_dir=None if output_dir is None else os.fspath(output_dir),
            verbose=verbose,
            started=started,
        )
    return kind, session


def _run(session: Session, model: Any, tasks: list[Any], cache_at: tuple[Any, bool], **how: Any) -> EvaluationResult:
    """Start the backend and the task processes, evaluate, write results; the engine is shut down and the cache
    closed on return."""
    from ..evaluation.concurrency import task_workers
    from ..evaluation.prefetch import prefetch_for
    from ..evaluation.results import finish_summaries
    from ..evaluation.task_processes import start_for
    from ..utils import timeline

    spec = session.spec
    missing = unavailable_tasks(tasks, how["continue_on_error"])
    cache = open_cache(*cache_at)
    reference = _parity_reference(spec, model, how["check_parity"])
    workers = task_workers(how["concurrent_tasks"], len(tasks), recording=reference is not None)
    # The data loads while the engine starts: in the task processes where tasks are scored there, else on a
    # thread here. Results to be read back are not known before the model's metadata, so a resumed run may
    # load a task it then reuses.
    processes = start_for(tasks, workers, spec.cls, skip=list(missing), **_task_actors(spec.options))
    here = ([], ()) if processes else (tasks, _imports_ahead(spec.options))
    try:
        with (
            closing(processes) if processes else nullcontext(),
            closing(prefetch_for(here[0], workers, skip=list(missing), imports=here[1])) as prefetch,
        ):
            shared = Shared(cache, missing, processes, prefetch, workers, session.output_dir, session.started)
            result, _ = evaluate_model(spec, model, tasks, shared, how, reference=reference)
    finally:
        if reference is not None:
            reference.close()
        if cache is not None:
            cache.close()
    finish_summaries()  # the engine's shutdown is on the timeline too
    result.timeline = timeline.current().as_json(since=session.started)
    return result


def unavailable_tasks(tasks: list[Any], continue_on_error: bool) -> dict[str, str]:
    """The tasks whose data is not available here (name -> reason).

    Raises:
        DataUnavailableError: some are, without ``continue_on_error``, or all are (nothing to run: said now).
    """
    from ..tasks import unavailable
    from ..utils.errors import DataUnavailableError

    with phase("tasks"):
        missing = unavailable(tasks)
    if missing and (not continue_on_error or len(missing) == len(tasks)):
        raise DataUnavailableError(next(iter(missing.values())))
    return missing


@dataclass
class Shared:
    """What the evaluation of one model uses and does not own (a run's, or a sweep's for all its models): the
    output cache, the unavailable tasks, the task processes and prefetch, the tasks at once, where the results go
    and since when the summary counts; ``keep_processes``: the processes outlive this model (a sweep's)."""

    cache: Any
    missing: dict[str, str]
    processes: Any
    prefetch: Any
    workers: int
    output_dir: Any
    started: float
    keep_processes: bool = False


def evaluate_model(
    spec: Any, model: Any, tasks: list[Any], shared: Shared, how: dict[str, Any], reference: Any = None
) -> tuple[EvaluationResult, bool]:
    """Load the backend of ``model``, evaluate ``tasks`` with it into ``shared.output_dir`` and close it: the
    result, and whether the backend took a sweep's engine and loaded its weights into it
    (:mod:`vllm_eval.models.handoff`). ``how``: :func:`evaluate`'s keywords of the same names."""
    from ..evaluation.results import evaluate as evaluate_tasks
    from ..evaluation.results import results_dir
    from ..utils import timeline

    with spec.load(model, show_progress_bar=how.get("show_progress", True)) as encoder:
        encoder.use_cache(shared.cache)
        rows = evaluate_tasks(
            encoder,
            tasks,
            output_dir=shared.output_dir,
            show_progress_bar=how.get("show_progress", True),
            run_info=_run_info(spec, encoder, shared.cache),
            overwrite_strategy=how.get("overwrite_strategy", "only-missing"),
            continue_on_error=how.get("continue_on_error", False),
            log_samples=how.get("log_samples", False),
            skip=shared.missing,
            started=shared.started,
            parity_reference=reference,
            parity_sample=how.get("check_parity") or 0,
            prefetch=shared.prefetch,
            concurrent_tasks=shared.workers,
            processes=shared.processes,
            scoring=how.get("scoring", "fast"),
            keep_processes=shared.keep_processes,
        )
        meta, reused = encoder.mteb_model_meta, bool(getattr(encoder, "engine_reused", False))
    out = Path(shared.output_dir) if shared.output_dir else None
    result = EvaluationResult(
        rows=rows,
        model_name=meta.name,
        backend=spec.name,
        results_dir=results_dir(out, meta) if out else None,
        summary_path=out / "summary.json" if out else None,
        timeline=timeline.current().as_json(since=shared.started),
        cache=shared.cache,
    )
    return result, reused


def select(
    kind: str,
    tasks: list[str] | str | None = None,
    benchmark: list[str] | str | None = None,
    task_types: list[str] | None = None,
    languages: list[str] | None = None,
    data: str | os.PathLike | None = None,
    data_type: str | None = None,
) -> list[Any]:
    """The mteb tasks of a call: ``data`` as an mteb task, else by name, benchmark and filters; a token_embed
    model keeps (or insists on) the retrieval and reranking ones. A benchmark's name among ``tasks`` selects
    that benchmark.

    Raises:
        UsageError: ``data`` with ``benchmark``, or with ``tasks`` unless ``data`` is a benchmark replica (whose
            tasks they pick); ``data_type`` without ``data``; a token_embed model given other task types.
        UnknownNameError: an unknown task or benchmark name (close names suggested).
    """
    from ..tasks import select_tasks, split_names

    names, benchmarks = split_names(tasks), split_names(benchmark, "--benchmark")
    if data:
        from ..tasks.owntasks import own_mteb_tasks

        if benchmarks:
            raise UsageError("give --data or --benchmark, not both")
        selected = own_mteb_tasks(os.fspath(data), data_type, names)
    else:
        if data_type:
            raise UsageError("--data-type goes with --data FILE")
        selected = select_tasks(names, benchmarks=benchmarks, task_types=task_types, languages=languages)
    if kind == "token_embedder":
        from ..models.token_embedder.base import check_task_types

        if names is None and benchmarks is None and not data and not task_types:
            selected = [t for t in selected if t.metadata.type in ("Retrieval", "Reranking")]  # the offline suite's
        check_task_types(selected)
    return selected


def _kind(model: Any, backend: str, pooling_task: str | None, bge_m3_mode: str | None, options: dict[str, Any]) -> str:
    """encoder, token_embedder or sparse_encoder: ``bge_m3_mode``, else ``pooling_task``, else read from the
    model's files (a ColBERT architecture is token_embed, a SPLADE model sparse). ``store_dtype`` and
    ``max_active_dims`` are refused for the kinds that have none, here, before the backend spec."""
    if bge_m3_mode is not None:
        if bge_m3_mode not in BGE_M3_KINDS:
            raise UsageError(f"--bge-m3-mode must be one of {', '.join(BGE_M3_KINDS)}, not {bge_m3_mode!r}")
        if pooling_task is not None:
            raise UsageError("give --bge-m3-mode or --pooling-task, not both (the mode sets the pooling task)")
        kind = BGE_M3_KINDS[bge_m3_mode]
    else:
        if pooling_task is None:
            pooling_task = detect_pooling_task(
                None if model is None else os.fspath(model), backend, options.get("revision")
            )
        if pooling_task not in POOLING_KINDS and pooling_task != "sparse":
            raise UsageError(f"--pooling-task must be one of {', '.join(POOLING_KINDS)}, not {pooling_task!r}")
        kind = POOLING_KINDS.get(pooling_task, "sparse_encoder")
    if options.get("store_dtype") and kind != "token_embedder":
        raise UsageError("--store-dtype is for --pooling-task token_embed")
    if options.get("max_active_dims") and kind != "sparse_encoder":
        raise UsageError("--max-active-dims is for sparse models (SPLADE, --bge-m3-mode sparse)")
    return kind


def _bge_m3_weights(mode: str | None, options: dict[str, Any]) -> None:
    """``options["bge_m3_weights"]`` checked, and FlagEmbedding's default ``(1, 1, 1)`` for ``all`` mode when not
    given (``compute_score``'s ``weights_for_different_modes=None``).

    Raises:
        UsageError: weights without ``all`` mode, or weights that are not three numbers >= 0 with a positive sum.
    """
    from ..models.sparse_encoder.hybrid import DEFAULT_WEIGHTS, check_weights

    weights = check_weights(options.get("bge_m3_weights"))
    if weights is not None and mode != "all":
        raise UsageError("--bge-m3-weights weighs the three scores of --bge-m3-mode all; give that mode too")
    if mode == "all":
        options["bge_m3_weights"] = weights or DEFAULT_WEIGHTS


def _check_mode_tasks(mode: str | None, tasks: list[Any]) -> None:
    """``all`` mode's task types (retrieval, reranking), checked before anything loads."""
    if mode == "all":
        from ..models.sparse_encoder.hybrid import check_hybrid_task_types

        check_hybrid_task_types(tasks)


def _bge_m3_engine(kind: str, backend: str, mode: str | None, engine: dict[str, Any]) -> dict[str, Any]:
    """The engine options of a BGE-M3 mode's vLLM engine (dense, ColBERT), under the user's own (which win); a
    sparse encoder sets its own."""
    from ..engine.args import merge_engine_kwargs
    from .spec import capability

    if mode is None or kind == "sparse_encoder" or capability(kind, backend) != "engine":
        return engine
    from ..models.sparse_encoder.vllm import bge_m3_engine_options

    return merge_engine_kwargs(bge_m3_engine_options(mode), engine)


def detect_pooling_task(model: str | None, backend: str, revision: str | None) -> str:
    """``token_embed`` for a local model whose ``config.json`` names a ColBERT architecture, ``sparse`` for a SPLADE
    model (sentence-transformers' ``SpladePooling``), else ``embed``."""
    from ..models.backends import backend_names
    from ..models.token_embedder.base import TOKEN_EMBED_ARCHITECTURES
    from ..utils.modelinfo import ModelRef
    from .spec import capability

    kinds = [k for k in POOLING_KINDS.values() if backend in backend_names(k)]
    if model is None or any(capability(k, backend) == "remote" for k in kinds):
        return "embed"
    try:
        config = ModelRef.resolve(model, revision).config or {}
    except VllmEvalError:  # a missing model is reported by the call itself, by name
        return "embed"
    if set(config.get("architectures") or ()) & TOKEN_EMBED_ARCHITECTURES:
        return "token_embed"
    from ..models.sparse_encoder.base import sparse_flavour

    # A SPLADE model (not BGE-M3, whose three outputs --bge-m3-mode chooses between): its own kind, not a vLLM task.
    ref = ModelRef.resolve(model, revision)
    if sparse_flavour(ref) != "splade":
        return "embed"
    if not (Path(ref.path) / "modules.json").is_file():
        logger.info("%s: a masked-LM checkpoint without sentence-transformers' files: run as SPLADE", model)
    return "sparse"


def _check(
    kind: str,
    backend_model: tuple[str, Any],
    session: Session,
    log_samples: bool,
    check_parity: int | None,
    workers: int | None,
) -> None:
    """The combinations ``evaluate`` refuses, before anything loads; ``backend_model``: the backend's name and the
    model as given."""
    backend, model = backend_model
    if log_samples and not session.output_dir:
        raise UsageError("--log-samples needs --output-dir (the samples go to <output-dir>/samples/)")
    if check_parity is None:
        return
    if (workers or 1) > 1:
        raise UsageError("--check-parity records each task's inputs one task at a time: drop --concurrent-tasks")
    reference = _parity_backend(kind, model, session.spec.options.get("revision"))
    if kind == "token_embedder":
        raise UsageError(
            f"--check-parity compares one vector per text; compare a {kind} model's run with --backend {reference}"
        )
    if session.spec.options.get("bge_m3_weights"):
        raise UsageError(
            "--check-parity checks one output per run, not --bge-m3-mode all's three: check --bge-m3-mode sparse "
            "and --bge-m3-mode dense"
        )
    if backend == reference:
        raise UsageError(f"--check-parity compares with --backend {reference}; run it with another backend")
    if session.spec.remote:
        raise UsageError("--check-parity needs the model's files here; compare a server's run with `compare --runs`")


def _task_actors(options: dict[str, Any]) -> dict[str, Any]:
    """``start_for``'s launcher: with ``ray_address``, the tasks are scored in Ray actors on that cluster too."""
    if not options.get("ray_address"):
        return {}
    from functools import partial

    from ..evaluation.ray_tasks import RayTaskProcesses

    return {"start": partial(RayTaskProcesses, options["ray_address"])}


def _imports_ahead(options: dict[str, Any]) -> tuple[str, ...]:
    """What ``mteb.evaluate`` imports on its first call, imported while GPU replicas start (the parent has nothing
    else to do then). Not with an engine in this process (the two would take turns on the interpreter), nor with
    CPU replicas, which use every core: two on this 2-core machine were ready after 13.3 s instead of 8.5 s."""
    from ..engine.args import on_cpu

    replicas = (options.get("data_parallel_size") or 1) * (options.get("replicas_per_gpu") or 1)
    elsewhere = options.get("ray_address") or replicas > 1
    return ("sentence_transformers",) if elsewhere and not on_cpu() else ()


def _run_info(spec: Any, encoder: Any, cache: Any) -> dict[str, Any]:
    return {
        "backend": spec.name,
        "model_path": encoder.model,
        "preset": getattr(getattr(encoder, "preset", None), "name", None),
        "engine_kwargs": getattr(encoder, "engine_kwargs", None),
        "command": sys.argv,
        "cache_dir": str(cache.directory) if cache else None,
    }


def _parity_backend(kind: str, model: Any, revision: str | None = None) -> str:
    """The backend ``check_parity`` compares with: the kind's reference, and for a sparse encoder the model's own
    (``st`` for SPLADE, ``hf`` for BGE-M3: :func:`vllm_eval.measure.bench.sparse_reference`, as ``compare``'s)."""
    from ..models.kinds import get_kind

    if kind == "sparse_encoder":
        from ..measure.bench import sparse_reference

        return sparse_reference(model, revision)
    return get_kind(kind).reference_backend


def _parity_reference(spec: Any, model: Any, check_parity: int | None) -> Any:
    """``check_parity``: the reference backend (:func:`_parity_backend`) on the same model and prompts, or None."""
    from ..models.backends import load_backend

    if not check_parity:
        return None
    shared = {k: v for k, v in spec.options.items() if k in _PARITY_SHARED}
    reference = _parity_backend(spec.kind, model, spec.options.get("revision"))
    return load_backend(spec.kind, reference, model, show_progress_bar=False, **shared)
