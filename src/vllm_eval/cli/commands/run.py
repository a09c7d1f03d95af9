"""``vllm-eval run``: an embedding model (one vector per text, or one per token) on mteb tasks."""

from __future__ import annotations

import argparse
import sys
from contextlib import closing, nullcontext
from typing import Any

from ...utils.errors import UsageError, VllmEvalError
from ...utils.timeline import phase
from ..base import Command, Context
from ..checks import check_image_tasks, open_cache, resolve_model
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
    split_names,
)
from ..tables import print_table, report_cache

#: The kinds ``run`` evaluates, by vLLM pooling task.
POOLING_KINDS = {"embed": "encoder", "token_embed": "token_embedder"}
#: Settings the parity reference must share with the backend it checks.
_PARITY_SHARED = (
    "preset",
    "prompts",
    "instruction_template",
    "instructions",
    "apply_instruction_to_documents",
    "dimensions",
    "revision",
)


class RunCommand(Command):
    name = "run"
    help = "evaluate an embedding model on mteb tasks"
    description = (
        "Evaluate an embedding model on mteb tasks. Unlisted vLLM EngineArgs are accepted as "
        "--name value (e.g. --kv-cache-memory-bytes 1073741824)."
    )
    kind = "encoder"
    backend_options = (
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
        "encoding_format",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--model",
            default=None,
            help="model directory or hub id (default: packaged all-MiniLM-L6-v2); "
            "served: the served name (default: the server's)",
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
            "corpus); see the README's schemas; or a "
            "benchmark replica written by `bench --suite BENCHMARK`",
        )
        parser.add_argument(
            "--data-type",
            choices=["STS", "PairClassification", "Reranking", "Retrieval", "Classification", "ImageClassification"],
            default=None,
            help="--data: the mteb task type (default: read from the fields)",
        )
        add_backend(parser, tuple(POOLING_KINDS.values()))
        parser.add_argument(
            "--pooling-task",
            choices=list(POOLING_KINDS),
            default=None,
            help="vLLM pooling task: embed (one vector per text) or token_embed (one per token, MaxSim, "
            "retrieval and reranking tasks); default: token_embed for a ColBERT architecture, else embed",
        )
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
            "and record the minimum cosine in the results and the table",
        )
        parser.add_argument(
            "--concurrent-tasks",
            type=positive_int,
            default=None,
            metavar="N",
            help="tasks evaluated at once: one scores on the CPU while another encodes (default: 1 on a machine "
            "of 4 cores or fewer, else half the cores, at most 4; 1 with --check-parity)",
        )
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

    def kind_of(self, args: argparse.Namespace) -> str:
        """encoder or token_embedder: ``--pooling-task``, else read from the model's architecture (a ColBERT
        one is token_embed). ``--store-dtype`` is refused for single vectors here, before the backend spec."""
        if args.pooling_task is None:
            args.pooling_task = _detect_pooling_task(args.model, args.backend, args.revision)
        kind = POOLING_KINDS[args.pooling_task]
        if args.store_dtype and kind != "token_embedder":
            raise UsageError("--store-dtype is for --pooling-task token_embed")
        return kind

    def check(self, args: argparse.Namespace, ctx: Context) -> None:
        if args.log_samples and not args.output_dir:
            raise UsageError("--log-samples needs --output-dir (the samples go to <output-dir>/samples/)")
        if args.check_parity and (args.concurrent_tasks or 1) > 1:
            raise UsageError("--check-parity records each task's inputs one task at a time: drop --concurrent-tasks")
        if args.check_parity:
            from ...models.kinds import get_kind

            reference = get_kind(ctx.spec.kind).reference_backend
            if ctx.spec.kind == "token_embedder":
                raise UsageError(
                    f"--check-parity compares single vectors; compare a token_embed model with --backend {reference}"
                )
            if args.backend == reference:
                raise UsageError(f"--check-parity compares with --backend {reference}; run it with another backend")
            if ctx.spec.remote:
                raise UsageError(
                    "--check-parity needs the model's files here; compare a server's run with `compare --runs`"
                )

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...evaluation.concurrency import task_workers
        from ...evaluation.prefetch import prefetch_for
        from ...evaluation.results import evaluate, results_dir
        from ...evaluation.task_processes import start_for
        from ...tasks import unavailable
        from ...utils.errors import DataUnavailableError

        spec = ctx.spec
        with phase("model"):
            model = resolve_model(args.model, spec.remote, revision=args.revision)
        with phase("tasks"):
            tasks = _tasks(args, spec.kind)
            check_image_tasks(model, tasks)
            missing = unavailable(tasks)
        if missing and (not args.continue_on_error or len(missing) == len(tasks)):  # nothing to run: say so now
            raise DataUnavailableError(next(iter(missing.values())))
        cache = open_cache(args)
        reference = _parity_reference(args, spec, model)
        workers = task_workers(args.concurrent_tasks, len(tasks), recording=reference is not None)
        # The data loads while the engine starts: in the task processes where tasks are scored there, else on a
        # thread here. Results to be read back are not known before the model's metadata, so a resumed run may
        # load a task it then reuses.
        processes = start_for(tasks, workers, spec.cls, skip=list(missing))
        here = ([], ()) if processes else (tasks, _imports_ahead(args))
        with (
            closing(processes) if processes else nullcontext(),
            closing(prefetch_for(here[0], workers, skip=list(missing), imports=here[1])) as prefetch,
            spec.load(model, show_progress_bar=not args.no_progress) as encoder,
        ):
            encoder.use_cache(cache)
            rows = evaluate(
                encoder,
                tasks,
                output_dir=args.output_dir,
                show_progress_bar=not args.no_progress,
                run_info=_run_info(args, encoder, cache),
                overwrite_strategy=args.overwrite_strategy,
                continue_on_error=args.continue_on_error,
                log_samples=args.log_samples,
                skip=missing,
                started=ctx.started,
                parity_reference=reference,
                parity_sample=args.check_parity or 0,
                prefetch=prefetch,
                concurrent_tasks=workers,
                processes=processes,
            )
        if reference is not None:
            reference.close()
        meta = encoder.mteb_model_meta
        print_table(rows, f"{meta.name} ({args.backend})")
        report_cache(cache)
        if args.output_dir:
            print(f"results: {results_dir(args.output_dir, meta)}")
        return 1 if any(r.status.startswith("failed") for r in rows) else 0


def _imports_ahead(args: argparse.Namespace) -> tuple[str, ...]:
    """What ``mteb.evaluate`` imports on its first call, imported while GPU replicas start (the parent has nothing
    else to do then). Not with an engine in this process (the two would take turns on the interpreter), nor with
    CPU replicas, which use every core: two on this 2-core machine were ready after 13.3 s instead of 8.5 s."""
    from ...engine.args import on_cpu

    replicas = (getattr(args, "data_parallel_size", None) or 1) * (getattr(args, "replicas_per_gpu", None) or 1)
    elsewhere = getattr(args, "ray_address", None) or replicas > 1
    return ("sentence_transformers",) if elsewhere and not on_cpu() else ()


def _run_info(args: argparse.Namespace, encoder: Any, cache: Any) -> dict[str, Any]:
    return {
        "backend": args.backend,
        "model_path": encoder.model,
        "preset": getattr(getattr(encoder, "preset", None), "name", None),
        "engine_kwargs": getattr(encoder, "engine_kwargs", None),
        "command": sys.argv,
        "cache_dir": str(cache.directory) if cache else None,
    }


def _detect_pooling_task(model: str | None, backend: str, revision: str | None) -> str:
    from ...models.backends import backend_names
    from ...models.token_embedder.base import TOKEN_EMBED_ARCHITECTURES
    from ...utils.modelinfo import ModelRef
    from ..spec import capability

    kinds = [k for k in POOLING_KINDS.values() if backend in backend_names(k)]
    if model is None or any(capability(k, backend) == "remote" for k in kinds):
        return "embed"
    try:
        config = ModelRef.resolve(model, revision).config or {}
    except VllmEvalError:  # a missing model is reported by the command itself, by name
        return "embed"
    return "token_embed" if set(config.get("architectures") or ()) & TOKEN_EMBED_ARCHITECTURES else "embed"


def _tasks(args: argparse.Namespace, kind: str) -> list[Any]:
    """``run``'s tasks: ``--data`` as an mteb task, else by name, benchmark and filters; a token_embed
    model keeps (or insists on) the retrieval and reranking ones."""
    from ...tasks import select_tasks

    if args.data:
        from ...tasks.owntasks import own_mteb_tasks

        if args.tasks or args.benchmark:
            raise UsageError("give --data or --tasks/--benchmark, not both")
        tasks = own_mteb_tasks(args.data, args.data_type)
    else:
        if args.data_type:
            raise UsageError("--data-type goes with --data FILE")
        tasks = select_tasks(
            split_names(args.tasks), benchmarks=args.benchmark, task_types=args.task_types, languages=args.languages
        )
    if kind == "token_embedder":
        from ...models.token_embedder.base import check_task_types

        if args.tasks is None and args.benchmark is None and not args.data and not args.task_types:
            tasks = [t for t in tasks if t.metadata.type in ("Retrieval", "Reranking")]  # the offline suite's
        check_task_types(tasks)
    return tasks


def _parity_reference(args: argparse.Namespace, spec: Any, model: Any) -> Any:
    """``--check-parity``: the kind's reference backend on the same model and prompts, or None."""
    from ...models.backends import load_backend
    from ...models.kinds import get_kind

    if not args.check_parity:
        return None
    shared = {k: v for k, v in spec.options.items() if k in _PARITY_SHARED}
    reference = get_kind(spec.kind).reference_backend
    return load_backend(spec.kind, reference, model, show_progress_bar=False, **shared)
