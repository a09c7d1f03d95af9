"""``vllm-eval compare``: one model under several configurations, checked against its kind's reference."""

from __future__ import annotations

import argparse
from typing import Any

from ...api.checks import open_cache, resolve_model
from ...tasks import split_names
from ...utils.errors import UsageError
from ..base import Command, Context
from ..options import (
    add_cache_flags,
    add_engine_flags,
    add_remote_flags,
    add_tasks,
    json_object,
    nonneg_float,
    positive_int,
)
from ..tables import report_cache


class CompareCommand(Command):
    name = "compare"
    help = "one model under several configurations, checked against a reference"
    description = (
        "Run the same tasks with every combination of --backends, --dtypes, --quantization and "
        "--dimensions (or read finished run directories with --runs), and print each main score, its "
        "difference to the reference configuration, pass/fail against the tolerances, and the per-input "
        "agreement on a sample of the inputs (vectors: cosine; scores, probabilities and log-likelihoods: |Δ|). "
        "Exits 1 when a tolerance fails. Engine options apply to the in-process vLLM configurations."
    )
    several_backends = True
    backend_options = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from ...models.backends import DEFAULT_BACKEND, backend_names
        from ...models.kinds import KINDS

        parser.add_argument(
            "--kind",
            choices=list(KINDS),
            default="encoder",
            help="; ".join(f"{k.name}: {k.description}" for k in KINDS.values()) + " (default encoder)",
        )
        parser.add_argument(
            "--model",
            default=None,
            help="model directory or hub id (default for encoders: packaged all-MiniLM-L6-v2; required otherwise)",
        )
        parser.add_argument(
            "--backends",
            nargs="+",
            default=None,
            choices=sorted({name for kind in KINDS for name in backend_names(kind)}),
            help=f"default: {DEFAULT_BACKEND} and the kind's reference",
        )
        parser.add_argument("--dtypes", nargs="+", default=None, help="model dtypes (default: each backend's own)")
        parser.add_argument(
            "--quantization", nargs="+", default=None, help="vLLM quantization methods (in-process vLLM), e.g. none fp8"
        )
        parser.add_argument(
            "--dimensions", nargs="+", type=positive_int, default=None, help="matryoshka widths (encoders)"
        )
        parser.add_argument(
            "--reference",
            default=None,
            help="BACKEND[:DTYPE] every configuration is compared with (default: the kind's reference, "
            "e.g. st:float32 for encoders, or the first non-vllm backend of --backends when that is another, "
            "e.g. hf for a vision-language embedder; with --runs, the first run)",
        )
        parser.add_argument("--runs", nargs="+", default=None, help="compare these finished run directories instead")
        add_tasks(parser, "tasks (default: the kind's: the offline suite for encoders, LeeKnownItemRetrieval ...)")
        parser.add_argument(
            "--data",
            default=None,
            help="your own data instead of --tasks (a file or BEIR directory, as the kind's command takes; "
            "token classifiers need one)",
        )
        parser.add_argument(
            "--first-stage", default="bm25s", help="--kind reranker: bm25s (default) or an embedding model"
        )
        parser.add_argument(
            "--top-k", type=positive_int, default=100, help="--kind reranker: candidates per query (default 100)"
        )
        parser.add_argument("--limit", type=positive_int, default=None, help="own-runner kinds: first N items per task")
        parser.add_argument(
            "--tolerance", type=nonneg_float, default=None, help="|Δ main score| allowed in float32 (1e-4)"
        )
        parser.add_argument(
            "--tolerance-16bit",
            type=nonneg_float,
            default=None,
            help="|Δ main score| allowed for 16-bit and quantized configurations (1e-3)",
        )
        parser.add_argument("--sample", type=positive_int, default=256, help="inputs compared one by one (default 256)")
        parser.add_argument("--prompts", type=json_object, default=None, help="JSON object of static prefixes")
        parser.add_argument("--preset", default=None, help="model preset (see `vllm-eval models`)")
        parser.add_argument(
            "--output-dir", default="results/compare", help="results and compare.json (default results/compare)"
        )
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
        add_cache_flags(parser)
        add_remote_flags(parser, "/v1/embeddings")
        add_engine_flags(parser)

    def kind_of(self, args: argparse.Namespace) -> str:
        return args.kind

    def backends_of(self, args: argparse.Namespace) -> list[str]:
        from ...models.backends import DEFAULT_BACKEND
        from ...models.kinds import get_kind

        return list(args.backends or [DEFAULT_BACKEND, get_kind(args.kind).reference_backend])

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from pathlib import Path

        from ...measure import compare as cmp

        fp32 = cmp.TOLERANCE_FP32 if args.tolerance is None else args.tolerance
        sixteen = cmp.TOLERANCE_16BIT if args.tolerance_16bit is None else args.tolerance_16bit
        if args.runs:
            results = [cmp.read_run_dir(path) for path in args.runs]
            comparison = cmp.compare_results(results, results[0], fp32, sixteen)
        else:
            model, tasks, configs = _plan(args)
            shared: dict[str, Any] = {k: v for k, v in {"prompts": args.prompts, "preset": args.preset}.items() if v}
            cache = open_cache(args.cache_dir, args.no_cache)
            results: list[Any] = []
            for i, config in enumerate(configs):
                # Fresh task objects per configuration: an mteb task keeps the random state of its
                # subsampling (clustering bootstraps), so a second run of one object draws other subsets.
                results.append(
                    cmp.run_configuration(
                        args.kind,
                        config,
                        model,
                        tasks if i == 0 else compare_tasks(args.kind, args.tasks, args.data),
                        output_dir=Path(args.output_dir),
                        cache=cache,
                        sample_size=args.sample,
                        backend_kwargs=shared,
                        engine_kwargs=ctx.engine,
                        show_progress_bar=not args.no_progress,
                        sample=results[0].sample if results else None,
                        first_stage=args.first_stage,
                        top_k=args.top_k,
                        limit=args.limit,
                    )
                )
            comparison = cmp.compare_results(results, results[0], fp32, sixteen, args.kind)
            report_cache(cache)
        cmp.print_comparison(comparison)
        print(f"results: {cmp.save(comparison, args.output_dir)}")
        return 0 if comparison.passed else 1


def compare_tasks(kind: str, names: list[str] | None, data: str | None = None) -> list[Any]:
    """The tasks ``compare`` runs for ``kind`` (its default when neither ``names`` nor ``data`` is given),
    checked for the kind.

    Raises:
        UsageError: a task the kind cannot run, both ``names`` and ``data``, a token classifier without data.
        DataUnavailableError: a task whose data is offline and not cached.
    """
    from ...api.rerank import rerank_tasks
    from ...models.kinds import get_kind
    from ...tasks import check_available, get_tasks

    if names and data:
        raise UsageError("give --data or --tasks, not both")
    described = get_kind(kind)
    if kind == "reranker":
        return rerank_tasks(names, data, what="--kind reranker")
    if kind in ("encoder", "token_embedder"):
        if data:
            from ...tasks.owntasks import own_mteb_tasks

            tasks = own_mteb_tasks(data)
        else:
            tasks = get_tasks(split_names(names or list(described.default_tasks) or None))
            check_available(tasks)
        if kind == "token_embedder":
            from ...models.token_embedder.base import check_task_types

            check_task_types(tasks)
        return tasks
    from ...tasks.registry import load_file, load_task

    if data:
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


def _default_reference(kind: str, backends: list[str]) -> str:
    """The kind's reference, unless --backends names another reference backend (``vllm hf`` for a
    vision-language embedder, whose sentence-transformers load would not prompt its images)."""
    from ...measure import compare as cmp
    from ...models.backends import DEFAULT_BACKEND

    default = cmp.default_reference(kind)
    backend, _, dtype = default.partition(":")
    others = [b for b in backends if b != DEFAULT_BACKEND]
    if others and backend not in backends:
        return f"{others[0]}:{dtype}" if dtype else others[0]
    return default


def _plan(args: argparse.Namespace) -> tuple[Any, list[Any], list[Any]]:
    """``(model, tasks, configurations with the reference first)``, checked before any model loads."""
    from ...api.spec import capability
    from ...measure import compare as cmp
    from ...models.backends import backend_names

    kind = args.kind
    names = backend_names(kind)
    backends = CompareCommand().backends_of(args)
    for b in backends:
        if b not in names:
            raise UsageError(f"--backends {b}: not a {kind} backend; choose from {', '.join(names)}")
        if capability(kind, b) == "remote":
            raise UsageError("compare runs local backends; compare a served model's run directory with --runs")
    if kind != "encoder" and not args.model:
        raise UsageError(f"--model is required with --kind {kind}")
    if args.dimensions and kind != "encoder":
        raise UsageError("--dimensions is for --kind encoder")
    model = resolve_model(args.model, False)
    tasks = compare_tasks(kind, args.tasks, args.data)
    configs = cmp.configurations(backends, args.dtypes, args.quantization, args.dimensions)
    wanted = cmp.parse_reference(args.reference or _default_reference(kind, backends))
    if wanted.backend not in names or capability(kind, wanted.backend) == "remote":
        raise UsageError(f"--reference {wanted.backend}: not a local {kind} backend")
    reference = next(
        (
            c
            for c in configs
            if c.backend == wanted.backend
            and c.dtype in (wanted.dtype, None)
            and not c.quantization
            and not c.dimensions
        ),
        wanted,
    )
    if reference not in configs:
        configs.insert(0, reference)
    configs.sort(key=lambda c: c != reference)  # the reference first: its inputs are the sample
    return model, tasks, configs
