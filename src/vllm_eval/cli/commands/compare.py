"""``vllm-eval compare``: one model under several configurations, checked against its kind's reference.

Parses its flags and calls :func:`vllm_eval.api.compare.compare`, then prints the comparison.
"""

from __future__ import annotations

import argparse

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

#: Flags that are the library call's own keywords (the rest are engine options).
_CALL_FLAGS = (
    "kind",
    "model",
    "backends",
    "dtypes",
    "quantization",
    "dimensions",
    "reference",
    "runs",
    "tasks",
    "data",
    "first_stage",
    "top_k",
    "limit",
    "tolerance",
    "tolerance_16bit",
    "sample",
    "prompts",
    "preset",
    "output_dir",
    "cache_dir",
    "no_cache",
    "endpoint",
    "api_key",
    "max_concurrency",
    "verbose",
)


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

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.compare import compare
        from ...measure.compare import print_comparison

        call = {k: getattr(args, k) for k in _CALL_FLAGS}
        comparison = compare(**call, show_progress=not args.no_progress, started=ctx.started, **ctx.engine)
        report_cache(comparison.cache)
        print_comparison(comparison)
        print(f"results: {comparison.path}")
        return 0 if comparison.passed else 1
