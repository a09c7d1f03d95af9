"""``vllm-eval bench``: encode throughput and latency of the encoder backends, or a whole suite per backend.

Parses its flags and calls :func:`vllm_eval.api.bench.bench`, then prints the tables.
"""

from __future__ import annotations

import argparse

from ...utils.errors import UsageError
from ..base import Command, Context
from ..options import add_engine_flags, add_remote_flags, add_scale_flags, positive_int

#: Flags that are the library call's own keywords (the rest are engine options).
_CALL_FLAGS = (
    "model",
    "backends",
    "dtypes",
    "lengths",
    "batch_sizes",
    "n_texts",
    "st_batch_size",
    "output_dir",
    "suite",
    "fraction",
    "n_docs",
    "n_queries",
    "restart",
    "time_limit",
    "endpoint",
    "api_key",
    "max_concurrency",
    "remote_batch_size",
    "data_parallel_size",
    "replicas_per_gpu",
    "ray_address",
    "verbose",
)


class BenchCommand(Command):
    name = "bench"
    help = "encode throughput and latency: ours against the references and mteb's vLLM wrapper"
    description = (
        "Measure texts/s, tokens/s and per-call latency of the encode backends on generated texts "
        "of controlled token length; writes bench.json and plots. Engine options apply to the vLLM backends."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from ...measure.bench import PEER, default_backends
        from ...models.backends import backend_names

        names = backend_names("encoder")

        parser.add_argument(
            "--model", default=None, help="model directory or hub id (default: packaged all-MiniLM-L6-v2)"
        )
        parser.add_argument(
            "--backends",
            nargs="+",
            default=None,
            choices=[*names, PEER],
            help=f"{PEER}: mteb's own vLLM wrapper; served backends: the --endpoint servers (all, round-robin); "
            f"default: {' '.join(default_backends())}, for a sparse model (SPLADE, BGE-M3) vllm and its reference "
            "(st for SPLADE, hf for BGE-M3)",
        )
        parser.add_argument("--dtypes", nargs="+", default=None, help="default: float32 on CPU, float16 float32 on GPU")
        parser.add_argument(
            "--lengths",
            nargs="+",
            default=["fixed:130", "mixed:16-500"],
            help="fixed:N or mixed:A-B token lengths (default: fixed:130 mixed:16-500)",
        )
        parser.add_argument(
            "--batch-sizes",
            nargs="+",
            type=positive_int,
            default=[64, 512, 2000],
            help="texts per encode call (default 64 512 2000)",
        )
        parser.add_argument("--n-texts", type=positive_int, default=2000)
        parser.add_argument("--st-batch-size", type=positive_int, default=128, help="sentence-transformers batch size")
        parser.add_argument(
            "--output-dir", default=None, help="default results/bench; --suite: results/bench/suite-SUITE"
        )
        parser.add_argument(
            "--suite",
            default=None,
            metavar="SUITE",
            help="time a whole task suite per backend instead, each in a fresh process from start to results "
            "written (ours: `vllm-eval run --no-cache`; the others through mteb.evaluate), scores checked "
            "equal: offline (the packaged tasks), synthetic (a retrieval task built from the vocabulary), or "
            'an mteb benchmark name (e.g. "MTEB(eng, v2)"), run as an offline replica of its tasks\' sizes '
            "and text lengths (mteb's descriptive statistics)",
        )
        parser.add_argument(
            "--fraction",
            type=float,
            default=1.0,
            help="--suite BENCHMARK: scale the replica's sample counts by this (0 < f <= 1; default 1)",
        )
        parser.add_argument(
            "--n-docs", type=positive_int, default=200_000, help="--suite synthetic: documents (default 200000)"
        )
        parser.add_argument(
            "--n-queries", type=positive_int, default=1_000, help="--suite synthetic: queries (default 1000)"
        )
        parser.add_argument(
            "--restart",
            action="store_true",
            help="--suite: remove the earlier runs in --output-dir and start over (by default a suite run again "
            "with the same --output-dir and settings resumes: finished backends are read back, a stopped one "
            "runs its missing tasks)",
        )
        parser.add_argument(
            "--time-limit",
            type=float,
            default=None,
            metavar="SECONDS",
            help="--suite: stop a backend's process after this many seconds (SIGTERM, then SIGKILL 30 s later), "
            "record its attempt and stop the suite; the same command again resumes",
        )
        add_remote_flags(parser, "/v1/embeddings")
        parser.add_argument(
            "--remote-batch-size",
            type=positive_int,
            default=None,
            help="served backends: inputs per request (default 64)",
        )
        add_scale_flags(parser, many=True)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.bench import bench, bench_dir

        records = bench(**{k: getattr(args, k) for k in _CALL_FLAGS}, started=ctx.started, **ctx.engine)
        out = bench_dir(args.output_dir, args.suite)
        if not args.suite:
            from ...measure.bench import print_best

            print_best(records)
            print(f"results: {out}/bench.json and plots")
            return 0
        from ...measure.suite import print_phases, print_suite, suite_problem

        print_suite(records, args.suite)
        print_phases(records)
        print(f"results: {out}/suite.json; each backend's run and log in {out}/<backend>/")
        problem = suite_problem(records, out, args.time_limit)
        if problem:
            raise UsageError(problem)
        return 0
