"""``vllm-eval rerank``: retrieve with a first stage, keep each query's top-k, rerank them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...api.checks import open_cache, resolve_model
from ...tasks import rerank_tasks
from ..base import Command, Context
from ..options import (
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
from ..tables import print_table, report_cache


class RerankCommand(Command):
    name = "rerank"
    help = "two stages: retrieve (bm25s or an embedding model), keep top-k, rerank"
    description = (
        "Retrieve with a first stage, keep each query's top-k and rerank them; prints both stages' "
        "main scores. Engine options apply to the reranker."
    )
    kind = "reranker"
    backend_options = ("preset", "prompts", "api")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--first-stage", default="bm25s", help="bm25s (default) or an embedding model path/id")
        parser.add_argument(
            "--reranker",
            default=None,
            help="reranker model directory or hub id (required unless served, where it is the served name)",
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
        import tempfile

        from ...evaluation.two_stage import evaluate_two_stage, is_bm25, load_first_stage
        from ...tasks import check_available

        spec = ctx.spec
        model = resolve_model(args.reranker, spec.remote, "--reranker")
        if not is_bm25(args.first_stage):
            resolve_model(args.first_stage, False, "--first-stage")
        tasks = rerank_tasks(args.tasks, args.data)
        check_available(tasks)
        show = not args.no_progress
        cache = open_cache(args.cache_dir, args.no_cache)
        first = load_first_stage(args.first_stage, show_progress_bar=show)
        if cache is not None and hasattr(first, "use_cache"):
            first.use_cache(cache)
        try:
            reranker = spec.load(model, show_progress_bar=show)
            reranker.use_cache(cache)
        except BaseException:
            getattr(first, "close", lambda: None)()
            raise
        with tempfile.TemporaryDirectory(prefix="vllm-eval-rerank-") as tmp:
            try:
                rows = evaluate_two_stage(
                    first,
                    reranker,
                    tasks,
                    top_k=args.top_k,
                    output_dir=args.output_dir or tmp,
                    show_progress_bar=show,
                    run_info=_run_info(args, reranker),
                    overwrite_strategy=args.overwrite_strategy,
                    continue_on_error=args.continue_on_error,
                    log_samples=args.log_samples,
                    started=ctx.started,
                )
            finally:
                reranker.close()
                getattr(first, "close", lambda: None)()
        name = reranker.mteb_model_meta.name
        print_table(rows, f"{args.first_stage} -> top {args.top_k} -> {name} ({args.backend})")
        report_cache(cache)
        if args.output_dir:
            print(f"results: {args.output_dir}/stage1, {args.output_dir}/stage2")
        return 0


def _run_info(args: argparse.Namespace, reranker: Any) -> dict[str, Any]:
    return {
        "first_stage": args.first_stage,
        "reranker": args.reranker,
        "backend": args.backend,
        "preset": getattr(getattr(reranker, "preset", None), "name", None),
        "engine_kwargs": getattr(reranker, "engine_kwargs", None),
        "command": sys.argv,
    }
