"""``vllm-eval bench``: encode throughput and latency of the encoder backends, or a whole suite per backend."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ...api.checks import resolve_model
from ...utils.errors import UsageError
from ..base import Command, Context
from ..options import add_engine_flags, add_remote_flags, add_scale_flags, positive_int

#: The bench's peer outside the backend table: mteb's own vLLM wrapper (runs an engine here).
PEER = "mteb-vllm"


class BenchCommand(Command):
    name = "bench"
    help = "encode throughput and latency: ours against the references and mteb's vLLM wrapper"
    description = (
        "Measure texts/s, tokens/s and per-call latency of the encode backends on generated texts "
        "of controlled token length; writes bench.json and plots. Engine options apply to the vLLM backends."
    )
    kind = "encoder"
    several_backends = True
    peers = {PEER: "engine"}
    backend_options = ("remote_batch_size",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from ...api.spec import capability
        from ...measure.bench import BACKENDS as DEFAULT_BACKENDS
        from ...models.backends import backend_names

        names = backend_names(self.kind)
        # Served backends only with --endpoint: not in the default list.
        default = [b for b in DEFAULT_BACKENDS if b == PEER or (b in names and capability(self.kind, b) != "remote")]

        parser.add_argument(
            "--model", default=None, help="model directory or hub id (default: packaged all-MiniLM-L6-v2)"
        )
        parser.add_argument(
            "--backends",
            nargs="+",
            default=default,
            choices=[*names, PEER],
            help=f"{PEER}: mteb's own vLLM wrapper; served backends: the --endpoint servers (all, round-robin)",
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
        parser.add_argument("--output-dir", default="results/bench")
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
        add_remote_flags(parser, "/v1/embeddings")
        parser.add_argument(
            "--remote-batch-size",
            type=positive_int,
            default=None,
            help="served backends: inputs per request (default 64)",
        )
        add_scale_flags(parser, many=True)
        add_engine_flags(parser)

    def backends_of(self, args: argparse.Namespace) -> list[str]:
        return list(args.backends)

    def check(self, args: argparse.Namespace, ctx: Context) -> None:
        from ...engine.args import DTYPES
        from ...measure.bench import parse_lengths

        if args.model is not None:
            resolve_model(args.model, False)
        for spec in args.lengths:
            parse_lengths(spec)
        for dtype in args.dtypes or ():
            if dtype not in DTYPES:
                raise UsageError(f"--dtypes: {dtype!r} is not one of {', '.join(DTYPES)}")
        if args.dtypes and args.dtype:
            raise UsageError("give --dtypes or --dtype, not both")
        if args.suite:
            from ...measure.suite import check_suite

            check_suite(args.suite, args.fraction)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        if args.suite:
            return _suite(args, ctx.engine)
        return _throughput(args, ctx.engine)


def _throughput(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from ...engine.args import on_cpu
    from ...measure.bench import run_bench

    engine = {k: v for k, v in engine.items() if k != "dtype"}
    dtypes = args.dtypes or ([args.dtype] if args.dtype else (["float32"] if on_cpu() else ["float16", "float32"]))
    remote = None
    if args.endpoint:
        from ...models.http import HttpOptions

        http = {"api_key": args.api_key}
        for key, value in (("max_concurrency", args.max_concurrency), ("batch_size", args.remote_batch_size)):
            if value is not None:
                http[key] = value
        opts = HttpOptions(tuple(args.endpoint), **http)
        remote = {
            "endpoints": list(opts.endpoints),
            "api_key": opts.api_key,
            "batch_size": opts.batch_size,
            "max_concurrency": opts.max_concurrency,
        }
    ray = {"ray_address": args.ray_address} if args.ray_address else {}
    replicas = [
        {"data_parallel_size": dp, "replicas_per_gpu": k, **ray}
        for dp in args.data_parallel_size or [1]
        for k in args.replicas_per_gpu or [1]
    ]
    records = run_bench(
        args.model,
        backends=args.backends,
        dtypes=dtypes,
        lengths=args.lengths,
        batch_sizes=args.batch_sizes,
        n_texts=args.n_texts,
        engine_kwargs=engine,
        st_batch_size=args.st_batch_size,
        replicas=replicas,
        remote=remote,
        output_dir=args.output_dir,
    )
    _print_best(records)
    print(f"results: {args.output_dir}/bench.json and plots")
    return 0


def _print_best(records: list[Any]) -> None:
    from ...models.kinds import get_kind

    best: dict[tuple[str, str, str], float] = {}
    for r in records:
        key = (r.backend, r.dtype, r.lengths)
        best[key] = max(best.get(key, 0.0), r.tokens_per_s)
    peers = (get_kind("encoder").reference_backend, PEER)
    print(f"\nbest tokens/s per backend, dtype, lengths (ratios to {' and to '.join(peers)}):")
    for (backend, dtype, spec), tps in sorted(best.items()):
        ratios = [
            f"{tps / ref:.2f}x {name}" for name in peers if name != backend and (ref := best.get((name, dtype, spec)))
        ]
        print(f"  {backend:12s} {dtype:9s} {spec:14s} {tps:>10.0f}  " + "  ".join(ratios))


def _suite(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    """``bench --suite``: one fresh process per backend, wall time from start to results written."""
    from pathlib import Path

    from ...measure.suite import SUITE_BACKENDS, run_suite
    from ...utils.modelinfo import packaged_model_path

    bad = [b for b in args.backends if b not in SUITE_BACKENDS]
    if bad:
        raise UsageError(f"--suite times {', '.join(SUITE_BACKENDS)}; not {', '.join(bad)}")
    if args.dtypes and len(args.dtypes) > 1:
        raise UsageError("--suite runs one dtype: give --dtype")
    layout = {}
    for name in ("data_parallel_size", "replicas_per_gpu"):
        values = getattr(args, name) or [1]
        if len(values) > 1:
            raise UsageError(f"--suite runs one layout: give one --{name.replace('_', '-')}")
        layout[name] = values[0]
    if args.ray_address:
        layout["ray_address"] = args.ray_address
    dtype = engine.pop("dtype", None) or (args.dtypes[0] if args.dtypes else None)
    engine.pop("use_tqdm_on_load", None)  # display only; each process sets its own
    out = Path(args.output_dir)
    if args.output_dir == "results/bench":
        out = out / ("suite-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", args.suite).strip("_"))
    records = run_suite(
        args.model or packaged_model_path(),
        args.suite,
        backends=args.backends,
        output_dir=out,
        dtype=dtype,
        engine_kwargs=engine,
        replicas=layout,
        n_docs=args.n_docs,
        n_queries=args.n_queries,
        fraction=args.fraction,
    )
    _print_suite(records, args.suite)
    _print_phases(records)
    print(f"results: {out}/suite.json; each backend's run and log in {out}/<backend>/")
    failed = [r.backend for r in records if r.returncode != 0]
    if failed:
        raise UsageError(f"--suite: {', '.join(failed)} failed; see {out}/<backend>/log.txt")
    return 0


def _print_suite(records: list[Any], suite: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from ...models.backends import DEFAULT_BACKEND

    table = Table(title=f"suite {suite}: process start to results written")
    for col in (
        "backend",
        "seconds",
        "engine start s",
        f"seconds / {DEFAULT_BACKEND}'s",
        "tasks",
        "max |Δ main score|",
        "exit",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    ours = next((r.seconds for r in records if r.backend == DEFAULT_BACKEND), None)
    for r in records:
        table.add_row(
            r.backend,
            f"{r.seconds:.1f}",
            "-" if r.engine_start_s is None else f"{r.engine_start_s:.1f}",
            "-" if not ours else f"{r.seconds / ours:.2f}x",
            str(len(r.scores)),
            "-" if r.max_delta is None else f"{r.max_delta:.2e}",
            str(r.returncode),
        )
    Console(width=max(100, Console().width)).print(table)


def _print_phases(records: list[Any]) -> None:
    """Each backend's seconds per timeline phase, side by side (overlapping phases count in full)."""
    from rich.console import Console
    from rich.table import Table

    from ...utils.timeline import PHASES

    timed = [r for r in records if r.phases]
    if not timed:
        return
    table = Table(title="seconds per phase (from each run's timeline; phases may overlap)")
    table.add_column("phase")
    for r in timed:
        table.add_column(r.backend, justify="right")
    for name in (*PHASES, "wall"):
        if any(name in r.phases for r in timed):
            table.add_row(name, *("-" if name not in r.phases else f"{r.phases[name]:.1f}" for r in timed))
    Console(width=max(100, Console().width)).print(table)
