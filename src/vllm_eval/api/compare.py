"""``vllm_eval.compare``: one model under several configurations, checked against its kind's reference, from
Python.

Everything ``vllm-eval compare`` does: every combination of backends, dtypes, quantization methods and matryoshka
widths runs the same tasks with the output cache (a configuration already run costs nothing), the reference
first; each main score is compared with the reference's against a tolerance, and each configuration's outputs
with the reference's on a sample of the very inputs the tasks sent. Finished run directories can be compared
instead (scores only). ``compare.json`` goes to the output directory. ``vllm-eval compare`` parses its flags
and calls it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..utils.errors import UsageError
from ..utils.timeline import phase
from .checks import check_model_argument, open_cache, resolve_model
from .session import Session, prepare

if TYPE_CHECKING:
    from ..measure.compare import Comparison

#: ``compare``'s served-model options: checked against its backends (none of them is served, so they are
#: refused, as on the command line); every other name of ``**options`` is a vLLM ``EngineArgs`` name.
SERVED_OPTIONS = ("endpoint", "api_key", "max_concurrency")


def compare(
    kind: str = "encoder",
    model: str | os.PathLike | None = None,
    *,
    backends: list[str] | None = None,
    dtypes: list[str] | None = None,
    quantization: list[str] | None = None,
    dimensions: list[int] | None = None,
    reference: str | None = None,
    runs: list[str | os.PathLike] | None = None,
    tasks: list[str] | str | None = None,
    data: str | os.PathLike | None = None,
    first_stage: str = "bm25s",
    top_k: int = 100,
    limit: int | None = None,
    tolerance: float | None = None,
    tolerance_16bit: float | None = None,
    sample: int = 256,
    prompts: dict[str, str] | None = None,
    preset: str | None = None,
    output_dir: str | os.PathLike = "results/compare",
    cache_dir: str | os.PathLike | None = None,
    no_cache: bool = False,
    show_progress: bool = True,
    verbose: bool = False,
    started: float | None = None,
    **options: Any,
) -> Comparison:
    """Run one model under several configurations and compare each with the reference configuration.

    Every keyword has the name of ``vllm-eval compare``'s flag (``--tolerance-16bit`` is ``tolerance_16bit=``); call
    it under ``if __name__ == "__main__":`` (vLLM starts its processes with ``spawn``).

    Args:
        kind: the kind of model (:mod:`vllm_eval.models.kinds`): ``encoder`` (default), ``reranker``,
            ``generator``, ``classifier``, ``token_classifier``, ``token_embedder``.
        model: a model directory or hub id (offline: a cached one); default for encoders: the packaged
            all-MiniLM-L6-v2, required otherwise.
        backends: local backends of the kind (default: ``vllm`` and the kind's reference).
        dtypes, quantization, dimensions: model dtypes (default: each backend's own), vLLM quantization methods
            (``none`` for the unquantized model; the vllm backend only), matryoshka widths (encoders); every
            combination with ``backends`` is one configuration.
        reference: ``BACKEND[:DTYPE]`` every configuration is compared with (default: the kind's reference, e.g.
            ``st:float32`` for encoders, or the first non-vllm backend of ``backends`` when that is another;
            with ``runs``, the first run).
        runs: finished run folders to compare instead of running configurations (a paired bootstrap per task).
        tasks, data: task names (a list, or one string separated by spaces or commas; default: the kind's), or your
            own data file or BEIR directory (token classifiers need one).
        first_stage, top_k: rerankers: the first stage (``bm25s`` or an embedding model) and candidates per query.
        limit: kinds with a runner of ours (generators, classifiers, token classifiers): first N items per task.
        tolerance, tolerance_16bit: |Δ main score| allowed in float32 (default 1e-4) and for 16-bit or quantized
            configurations (default 1e-3).
        sample: inputs compared one by one.
        prompts, preset: static prefixes and a model preset, for the backends that take them.
        output_dir: each configuration's results and ``compare.json`` (created now).
        cache_dir, no_cache: the output cache's folder (default ``$VLLMEVAL_CACHE_DIR``, else
            ``~/.cache/vllm-eval``), or none at all.
        show_progress: progress bars. ``verbose``: vLLM's INFO logs and third-party warnings.
        started: when the call started (``time.time()``); default now.
        **options: vLLM ``EngineArgs`` for the in-process vLLM configurations (``max_model_len``,
            ``max_num_seqs`` ...; checked against vLLM's list).

    Returns:
        The :class:`~vllm_eval.measure.compare.Comparison`: ``rows`` (task, configuration, main score, |Δ|,
        tolerance, passed), ``agreement`` per configuration, ``passed``, ``path`` of ``compare.json`` and the
        (closed) output ``cache``.

    Raises:
        UsageError: a bad option or combination (one line, before any model loads).
        OptionError, UnknownNameError: an unknown engine option, kind, backend or task (close names suggested).
        DataUnavailableError: a task whose data is not available offline.
        ModelNotFoundError: a local model that does not exist.
        EngineError: a failure of an engine while running.
    """
    check_model_argument(model)
    from ..measure import compare as cmp

    session, backends = _session(kind, (model, backends), options, output_dir, verbose, started)
    fp32 = cmp.TOLERANCE_FP32 if tolerance is None else tolerance
    sixteen = cmp.TOLERANCE_16BIT if tolerance_16bit is None else tolerance_16bit
    if runs:
        results = [cmp.read_run_dir(path) for path in runs]
        comparison = cmp.compare_results(results, results[0], fp32, sixteen)
        cmp.add_significance(comparison, runs, [r.config.label for r in results])
    else:
        resolved, selected, configs = _plan(kind, model, backends, (tasks, data), (dtypes, quantization, dimensions))
        configs = cmp.reference_first(configs, cmp.parse_reference(reference or cmp.default_reference(kind, backends)))
        _check_reference(kind, configs[0])
        shared = {k: v for k, v in {"prompts": prompts, "preset": preset}.items() if v}
        run = dict(first_stage=first_stage, top_k=top_k, limit=limit, sample_size=sample, backend_kwargs=shared)
        cache = open_cache(cache_dir, no_cache)
        try:
            results = _run(kind, configs, resolved, selected, (tasks, data), cache, session, show_progress, run)
        finally:
            if cache is not None:
                cache.close()
        comparison = cmp.compare_results(results, results[0], fp32, sixteen, kind)
        comparison.cache = cache
    cmp.save(comparison, session.output_dir)
    return comparison


def _session(
    kind: str,
    model_backends: tuple[Any, list[str] | None],
    options: dict[str, Any],
    output_dir: str | os.PathLike,
    verbose: bool,
    started: float | None,
) -> tuple[Session, list[str]]:
    """The shared checks (:func:`~vllm_eval.api.session.prepare`) for ``compare``'s backends (default: vLLM and the
    kind's reference; for a BGE-M3 sparse encoder, ``hf``: its lexical weights have no sentence-transformers
    reference) and options; and those backends."""
    from ..models.backends import DEFAULT_BACKEND
    from ..models.kinds import get_kind

    given = {k: v for k, v in options.items() if v is not None}
    served = {k: given.pop(k) for k in SERVED_OPTIONS if k in given}
    model, backends = model_backends
    reference = get_kind(kind).reference_backend
    if kind == "sparse_encoder" and not backends:
        from ..measure.bench import sparse_reference

        reference = sparse_reference(model and os.fspath(model))
    backends = list(backends or [DEFAULT_BACKEND, reference])
    with phase("imports"):  # the option checks import the backend classes (and vLLM for unlisted options)
        session = prepare(
            kind,
            backends,
            served,
            given,
            output_dir=os.fspath(output_dir),
            verbose=verbose,
            several=True,
            started=started,
        )
    return session, backends


def _run(
    kind: str,
    configs: list[Any],
    model: Any,
    tasks: list[Any],
    named: tuple[Any, Any],
    cache: Any,
    session: Session,
    show_progress: bool,
    run: dict[str, Any],
) -> list[Any]:
    """Each configuration's results, the reference's first (its recorded inputs are everyone's sample)."""
    from ..measure.compare import run_configuration

    results: list[Any] = []
    for i, config in enumerate(configs):
        # Fresh task objects per configuration: an mteb task keeps the random state of its
        # subsampling (clustering bootstraps), so a second run of one object draws other subsets.
        results.append(
            run_configuration(
                kind,
                config,
                model,
                tasks if i == 0 else compare_tasks(kind, *named),
                output_dir=Path(session.output_dir),
                cache=cache,
                engine_kwargs=session.engine,
                show_progress_bar=show_progress,
                sample=results[0].sample if results else None,
                **run,
            )
        )
    return results


def compare_tasks(kind: str, names: list[str] | str | None, data: str | os.PathLike | None = None) -> list[Any]:
    """The tasks ``compare`` runs for ``kind`` (its default when neither ``names`` nor ``data`` is given),
    checked for the kind.

    Raises:
        UsageError: a task the kind cannot run, ``names`` with ``data`` that is not a benchmark replica, a token
            classifier without data.
        DataUnavailableError: a task whose data is offline and not cached.
    """
    from ..models.kinds import get_kind
    from ..tasks import check_available, get_tasks, rerank_tasks, split_names

    data = None if data is None else os.fspath(data)
    described = get_kind(kind)
    if kind == "reranker":
        return rerank_tasks(names, data, what="--kind reranker")
    if kind in ("encoder", "token_embedder", "sparse_encoder"):
        if data:
            from ..tasks.owntasks import own_mteb_tasks

            tasks = own_mteb_tasks(data, names=split_names(names))
        else:
            tasks = get_tasks(split_names(names or list(described.default_tasks) or None))
            check_available(tasks)
        if kind == "token_embedder":
            from ..models.token_embedder.base import check_task_types

            check_task_types(tasks)
        return tasks
    from ..tasks.registry import load_file, load_task

    if data:
        if names:
            raise UsageError("give --data or --tasks, not both")
        return [load_file(described.command, data)]
    if not names and not described.default_tasks:
        raise UsageError(f"--kind {kind} has no packaged task: give --data FILE")
    tasks = [load_task(described.command, n) for n in split_names(names or list(described.default_tasks))]
    images = [t.name for t in tasks if getattr(t, "modality", "text") != "text"]
    if images:
        raise UsageError(
            f"compare scores generators by log-likelihood, for text tasks; {', '.join(images)} shows images"
        )
    return tasks


def _plan(
    kind: str, model: Any, backends: list[str], named: tuple[Any, Any], axes: tuple[Any, Any, Any]
) -> tuple[Any, list[Any], list[Any]]:
    """``(model, tasks, configurations)``, checked before any model loads; ``named``: the tasks' names and data,
    ``axes``: the dtypes, quantization methods and widths the configurations combine."""
    from ..measure.compare import configurations
    from ..models.backends import backend_names
    from .spec import capability

    local = backend_names(kind)
    for b in backends:
        if b not in local:
            raise UsageError(f"--backends {b}: not a {kind} backend; choose from {', '.join(local)}")
        if capability(kind, b) == "remote":
            raise UsageError("compare runs local backends; compare a served model's run directory with --runs")
    if kind != "encoder" and not model:
        raise UsageError(f"--model is required with --kind {kind}")
    if axes[2] and kind != "encoder":
        raise UsageError("--dimensions is for --kind encoder")
    resolved = resolve_model(None if model is None else os.fspath(model), False)
    tasks = compare_tasks(kind, *named)
    return resolved, tasks, configurations(backends, *axes)


def _check_reference(kind: str, reference: Any) -> None:
    """The reference must be a local backend of ``kind``."""
    from ..models.backends import backend_names
    from .spec import capability

    if reference.backend not in backend_names(kind) or capability(kind, reference.backend) == "remote":
        raise UsageError(f"--reference {reference.backend}: not a local {kind} backend")
