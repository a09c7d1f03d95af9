"""``vllm-eval run``: an embedding model (one vector per text, or one per token) on mteb tasks.

Parses its flags and calls :func:`vllm_eval.api.evaluate.evaluate`, then prints the table.
"""

from __future__ import annotations

import argparse

from ...api.evaluate import BACKEND_OPTIONS, BGE_M3_KINDS, POOLING_KINDS
from ...evaluation.scoring import SCORINGS
from ..base import Command, Context
from ..options import (
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
from ..tables import print_table, report_cache


class RunCommand(Command):
    name = "run"
    help = "evaluate an embedding model on mteb tasks"
    description = (
        "Evaluate an embedding model on mteb tasks. Unlisted vLLM EngineArgs are accepted as "
        "--name value (e.g. --kv-cache-memory-bytes 1073741824)."
    )
    kind = "encoder"
    backend_options = BACKEND_OPTIONS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--model",
            nargs="+",
            action=OneOrMany,
            default=None,
            help="model directory or hub id (default: packaged all-MiniLM-L6-v2); "
            "served: the served name (default: the server's). Several, a glob, or a training folder of "
            "checkpoint-* subfolders: a sweep, one job (results per model under --output-dir, sweep.json)",
        )
        parser.add_argument("--revision", default=None, help="hub revision")
        parser.add_argument("--model-name", default=None, help="name recorded in results (org/name)")
        add_tasks(parser, "task names, space or comma separated (default: the offline suite)")
        parser.add_argument("--benchmark", nargs="+", default=None, help='mteb benchmark names, e.g. "MTEB(eng, v2)"')
        parser.add_argument(
            "--task-types", nargs="+", default=None, help="keep tasks of these mteb types (e.g. STS Retrieval)"
        )
        parser.add_argument(
            "--languages", nargs="+", default=None, help="keep tasks in these ISO 639-3 languages (e.g. eng)"
        )
        parser.add_argument(
            "--data",
            default=None,
            help="your own data as an mteb task: a .jsonl/.csv/.parquet file (STS, pair classification, "
            "reranking, classification, image classification) or a BEIR directory (retrieval, text or image "
            "corpus); see docs/own-data.md for the schemas; or a "
            "benchmark replica written by `bench --suite BENCHMARK`",
        )
        parser.add_argument(
            "--data-type",
            choices=["STS", "PairClassification", "Reranking", "Retrieval", "Classification", "ImageClassification"],
            default=None,
            help="--data: the mteb task type (default: read from the fields)",
        )
        add_backend(parser, (*POOLING_KINDS.values(), "sparse_encoder"))
        parser.add_argument(
            "--pooling-task",
            choices=[*POOLING_KINDS, "sparse"],
            default=None,
            help="vLLM pooling task: embed (one vector per text) or token_embed (one per token, MaxSim, "
            "retrieval and reranking tasks), or sparse (a SPLADE model: one weight per vocabulary id); default: "
            "token_embed for a ColBERT architecture, sparse for a SPLADE model or a bare *ForMaskedLM checkpoint, "
            "else embed",
        )
        _add_sparse_flags(parser)
        parser.add_argument(
            "--store-dtype",
            choices=["float32", "float16"],
            default=None,
            help="--pooling-task token_embed: dtype the token vectors are kept and cached in (default float32)",
        )
        parser.add_argument(
            "--preset", default=None, help="embedding preset (see `vllm-eval models`); default: the matching one"
        )
        parser.add_argument(
            "--prompts",
            type=json_object,
            default=None,
            help='JSON object of static prefixes, e.g. \'{"query": "query: "}\'',
        )
        parser.add_argument(
            "--image-prompts",
            type=json_object,
            default=None,
            help='a vision-language embedder\'s prompts per input, e.g. \'{"text": "{text}", "image": '
            '"{image} Describe the image.", "text_image": "{image}\\n{text}"}\' ({image}: the model\'s image '
            "placeholder); default: the preset's",
        )
        parser.add_argument("--instruction-template", default=None, help="template containing {instruction}")
        parser.add_argument("--apply-instruction-to-documents", action="store_true")
        parser.add_argument("--dimensions", type=positive_int, default=None, help="matryoshka output width")
        parser.add_argument(
            "--chunk-size",
            type=positive_int,
            default=None,
            help="texts handed to the backend per step, and committed to the cache per batch (default 1024)",
        )
        parser.add_argument(
            "--check-parity",
            type=positive_int,
            default=None,
            metavar="N",
            help="also embed N of each task's inputs with the kind's reference backend "
            "and record the minimum cosine in the results and the table (sparse models: also the largest "
            "|Δ| of a weight; reference st for SPLADE, hf for BGE-M3)",
        )
        _add_scoring_flags(parser)
        add_common(parser, "write mteb result JSON, summary.json and the log here")
        add_run_flags(parser)
        add_remote_flags(parser, "/v1/embeddings")
        parser.add_argument(
            "--encoding-format",
            choices=["float", "base64"],
            default=None,
            help="served models: embedding transfer format (default float)",
        )
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.evaluate import evaluate

        result = self.call(evaluate, args, ctx)
        if hasattr(result, "models"):  # a sweep
            from ..tables import print_sweep

            print_sweep(result)
            report_cache(result.results[0].cache if result.results else None)
            if result.sweep_path:
                print(f"sweep: {result.sweep_path}")
            return 1 if result.failed else 0
        print_table(result.rows, f"{result.model_name} ({result.backend})")
        report_cache(result.cache)
        if result.results_dir:
            print(f"results: {result.results_dir}")
        return 1 if result.failed else 0


def _add_scoring_flags(parser: argparse.ArgumentParser) -> None:
    """How the tasks are evaluated: at once, and with which scoring code."""
    parser.add_argument(
        "--concurrent-tasks",
        type=positive_int,
        default=None,
        metavar="N",
        help="tasks evaluated at once: one scores on the CPU while another encodes, an encoder's each in a "
        "process of its own, with --ray-address a Ray actor on the cluster (default: 1 on a machine of 4 cores "
        "or fewer, else half the cores, at most 4, at most 8 for a sweep of models of up to 1 B parameters; 1 with "
        "--check-parity)",
    )
    parser.add_argument(
        "--scoring",
        choices=SCORINGS,
        default="fast",
        help="fast: mteb's metrics computed on arrays, the same numbers (default); mteb: mteb's own scoring code",
    )


def _add_sparse_flags(parser: argparse.ArgumentParser) -> None:
    """Sparse models: which BGE-M3 output, and the top-k of each sparse vector."""
    parser.add_argument(
        "--bge-m3-mode",
        choices=list(BGE_M3_KINDS),
        default=None,
        help="a BGE-M3 model's output: dense (CLS vector), sparse (lexical weights, dot product) or colbert "
        "(multi-vector, MaxSim); vLLM runs it as BgeM3EmbeddingModel with that output's pooling task; all: "
        "retrieval and reranking by the weighted sum of the three scores (FlagEmbedding's compute_score) over each "
        "query's dense top 100, one engine per output",
    )
    parser.add_argument(
        "--bge-m3-weights",
        type=float,
        nargs=3,
        default=None,
        metavar=("W_DENSE", "W_SPARSE", "W_COLBERT"),
        help="--bge-m3-mode all: weights of the dense, sparse and ColBERT scores, divided by their sum "
        "(default 1 1 1, FlagEmbedding's compute_score; its README's example: 0.4 0.2 0.4)",
    )
    parser.add_argument(
        "--max-active-dims",
        type=positive_int,
        default=None,
        help="sparse models (SPLADE, --bge-m3-mode sparse): keep each vector's N largest weights "
        "(sentence-transformers' max_active_dims; default: every non-zero)",
    )
