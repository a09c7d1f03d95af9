"""``vllm-eval rerank``: retrieve with a first stage, keep each query's top-k, rerank them.

Parses its flags and calls :func:`vllm_eval.api.rerank.rerank`, then prints the table.
"""

from __future__ import annotations

import argparse

from ...api.rerank import BACKEND_OPTIONS
from ..base import Command, Context
from ..options import (
    SWEEP_HELP,
    OneOrMany,
    add_backend,
    add_common,
    add_engine_flags,
    add_remote_flags,
    add_run_flags,
    add_scale_flags,
    add_tasks,
    json_object,
    positive_int,
)
from ..tables import print_table, report_cache, sweep_exit

#: Flags that are the library call's own keywords (the rest are backend and engine options).
_CALL_FLAGS = (
    "tasks",
    "first_stage",
    "top_k",
    "data",
    "backend",
    "output_dir",
    "cache_dir",
    "no_cache",
    "overwrite_strategy",
    "continue_on_error",
    "log_samples",
    "verbose",
)


class RerankCommand(Command):
    name = "rerank"
    help = "two stages: retrieve (bm25s or an embedding model), keep top-k, rerank"
    description = (
        "Retrieve with a first stage, keep each query's top-k and rerank them; prints both stages' "
        "main scores. Engine options apply to the reranker."
    )
    kind = "reranker"
    backend_options = BACKEND_OPTIONS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--first-stage", default="bm25s", help="bm25s (default) or an embedding model path/id")
        parser.add_argument(
            "--reranker",
            default=None,
            nargs="+",
            action=OneOrMany,
            help="reranker model directory or hub id (required unless served, where it is the served name)"
            + SWEEP_HELP,
        )
        parser.add_argument(
            "--preset", default=None, help="reranker preset (see `vllm-eval models`), e.g. qwen3-reranker"
        )
        parser.add_argument(
            "--top-k", type=positive_int, default=100, help="candidates per query kept for reranking (default 100)"
        )
        add_tasks(parser, "retrieval tasks (default LeeKnownItemRetrieval)")
        parser.add_argument(
            "--data", default=None, help="your own retrieval (BEIR directory) or reranking (.jsonl/.csv/.parquet) data"
        )
        add_backend(parser, (self.kind,))
        parser.add_argument("--prompts", type=json_object, default=None, help="JSON object of query/document prefixes")
        add_common(parser, "write both stages' mteb results here (default: a temp dir)")
        add_run_flags(parser, overwrite_default="always")
        add_remote_flags(parser, "/score or /rerank")
        parser.add_argument(
            "--api", choices=["score", "rerank"], default=None, help="served models: endpoint used (default score)"
        )
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.rerank import rerank

        call = {k: getattr(args, k) for k in _CALL_FLAGS}
        options = {k: v for k, v in self.options_of(args).items() if v is not None}
        result = rerank(
            args.reranker,
            **call,
            show_progress=not args.no_progress,
            started=ctx.started,
            **options,
            **ctx.engine,
        )
        if (code := sweep_exit(result)) is not None:
            return code
        print_table(result.rows, f"{args.first_stage} -> top {args.top_k} -> {result.model_name} ({args.backend})")
        report_cache(result.cache)
        if result.stage_dirs:
            print(f"results: {', '.join(map(str, result.stage_dirs))}")
        return 0
