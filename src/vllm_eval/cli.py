"""``vllm-eval`` command line.

``vllm-eval run`` evaluates an embedding model on mteb tasks (default: the packaged
all-MiniLM-L6-v2 on the whole offline suite) and prints a table; ``rerank`` runs retrieve-then-rerank,
``generate`` a multiple-choice task, ``bench`` the throughput harness; ``tasks`` and ``models`` list
what is there. Engine options use vLLM's own flag names (``--max-model-len``, ``--dtype``,
``--gpu-memory-utilization`` ...); any other vLLM ``EngineArgs`` flag is accepted too and checked
against vLLM's list. ``--backend remote --endpoint URL ...`` uses running ``vllm serve`` instances;
``--data-parallel-size`` / ``--replicas-per-gpu`` run engine replicas (:mod:`vllm_eval.replicas`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# Named explicitly for --help; every other EngineArgs name is accepted as --snake-or-kebab-name.
_ENGINE_FLAGS: list[tuple[str, Any, str]] = [
    ("dtype", str, "model dtype: auto, float32, float16, bfloat16"),
    ("head_dtype", str, "pooling head dtype (vLLM hf_overrides['head_dtype'])"),
    ("max_model_len", int, "token limit; longer inputs are truncated and counted"),
    ("max_num_seqs", int, "max sequences per engine step"),
    ("max_num_batched_tokens", int, "max tokens per engine step"),
    ("tensor_parallel_size", int, "GPUs per engine"),
    ("gpu_memory_utilization", float, "share of GPU memory (of RAM on the CPU build)"),
    ("seed", int, "engine seed"),
    ("hf_overrides", json.loads, "JSON dict applied to the HF config"),
    ("pooler_config", json.loads, "JSON dict of vLLM PoolerConfig fields"),
]
_ENGINE_BOOLS = [
    ("enforce_eager", "disable CUDA graphs / torch.compile (default on the CPU build)"),
    ("enable_prefix_caching", "reuse KV cache across shared prefixes"),
    ("trust_remote_code", "run the model repository's own code (default off)"),
]


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_extra_engine_args(extra: list[str]) -> dict[str, Any]:
    """``--name value`` / ``--name=value`` / bare ``--flag`` pairs → dict of EngineArgs names.

    Values are parsed as JSON when they can be (numbers, booleans, dicts), else kept as strings.

    Raises:
        CliError: a token that is not a ``--option``.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--") or tok == "--":
            raise CliError(f"unexpected argument {tok!r}")
        name, eq, value = tok[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            out[key] = _parse_value(value)
            i += 1
        elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            out[key] = _parse_value(extra[i + 1])
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-eval", description="Evaluate models on benchmarks with vLLM as the inference engine."
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="show vLLM's INFO logs")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="evaluate an embedding model on mteb tasks",
        description="Evaluate an embedding model on mteb tasks. Unlisted vLLM EngineArgs are accepted as "
        "--name value (e.g. --kv-cache-memory-bytes 1073741824).",
    )
    run.add_argument("--model", default=None, help="model directory or hub id (default: packaged all-MiniLM-L6-v2)")
    run.add_argument("--revision", default=None, help="hub revision")
    run.add_argument("--model-name", default=None, help="name recorded in results (org/name)")
    run.add_argument("--tasks", nargs="+", default=None, help="task names, space or comma separated (default: offline suite)")
    run.add_argument("--backend", choices=["vllm", "st", "remote"], default="vllm",
                     help="vllm (in-process, default), st (sentence-transformers reference) or remote (vllm serve)")
    run.add_argument("--encoding-format", choices=["float", "base64"], default="float",
                     help="--backend remote: embedding transfer format")
    run.add_argument("--output-dir", default=None, help="write mteb result JSON and summary.json here")
    run.add_argument("--prompts", type=json.loads, default=None, help='JSON dict of static prefixes, e.g. \'{"query": "query: "}\'')
    run.add_argument("--instruction-template", default=None, help="template containing {instruction}")
    run.add_argument("--apply-instruction-to-documents", action="store_true")
    run.add_argument("--dimensions", type=int, default=None, help="matryoshka output width")
    run.add_argument("--device", default=None, help="torch device for --backend st")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_remote_flags(run, "/v1/embeddings")
    _add_scale_flags(run)
    _add_engine_flags(run)

    rr = sub.add_parser(
        "rerank",
        help="two stages: retrieve (bm25s or an embedding model), keep top-k, rerank",
        description="Retrieve with a first stage, keep each query's top-k and rerank them; prints both stages' "
        "main scores. Engine options apply to the reranker.",
    )
    rr.add_argument("--first-stage", default="bm25s", help="bm25s (default) or an embedding model path/id")
    rr.add_argument("--reranker", default=None, help="reranker model directory or hub id (required unless "
                    "--backend remote, where it is the served name)")
    rr.add_argument("--preset", default=None, help="reranker preset (see `vllm-eval models`), e.g. qwen3-reranker")
    rr.add_argument("--top-k", type=int, default=100, help="candidates per query kept for reranking (default 100)")
    rr.add_argument("--tasks", nargs="+", default=["LeeKnownItemRetrieval"], help="retrieval tasks")
    rr.add_argument("--backend", choices=["vllm", "st", "remote"], default="vllm",
                    help="reranker backend: vllm (in-process), st (reference) or remote (vllm serve)")
    rr.add_argument("--api", choices=["score", "rerank"], default="score", help="--backend remote: endpoint used")
    rr.add_argument("--prompts", type=json.loads, default=None, help="JSON dict of query/document prefixes")
    rr.add_argument("--output-dir", default=None, help="write both stages' mteb results here (default: a temp dir)")
    rr.add_argument("--device", default=None, help="torch device for --backend st")
    rr.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_remote_flags(rr, "/score or /rerank")
    _add_engine_flags(rr)

    gen = sub.add_parser(
        "generate",
        help="evaluate a chat LLM / VLM on a multiple-choice task",
        description="Evaluate a generative model on a multiple-choice task (PangLeePolarity: text, Digits: images). "
        "Writes results.json and samples.jsonl (prompt, raw output, parsed answer, target, correct per sample).",
    )
    gen.add_argument("--model", default=None, help="model directory or hub id (--backend remote: served name, "
                     "default: the server's)")
    gen.add_argument("--backend", choices=["vllm", "remote"], default="vllm",
                     help="vllm (in-process) or remote (vllm serve /v1/chat/completions)")
    gen.add_argument("--task", required=True, help="PangLeePolarity or Digits")
    gen.add_argument("--answer-format", choices=["json", "xml", "boxed", "raw"], default="json")
    gen.add_argument("--scoring", choices=["generate", "loglikelihood"], default="generate")
    gen.add_argument("--letters", action=argparse.BooleanOptionalAction, default=None,
                     help="name options by letter (default: the task's choice)")
    gen.add_argument("--reasoning", action="store_true", help="ask for brief reasoning before the answer")
    gen.add_argument("--limit", type=int, default=None, help="first N samples only")
    gen.add_argument("--max-missing", type=float, default=0.1,
                     help="budget of unparsable answers: fraction if <= 1, else count (default 0.1)")
    gen.add_argument("--preset", default=None, help="model preset (see `vllm-eval models`)")
    gen.add_argument("--chat-template", default=None, help="chat template file or string overriding the tokenizer's")
    gen.add_argument("--system-prompt", default=None)
    gen.add_argument("--raw-prompts", action="store_true", help="no chat template: send the text as is")
    gen.add_argument("--image-position", choices=["before", "after"], default=None)
    gen.add_argument("--output-dir", default=None, help="default: results/generate/<task>")
    gen.add_argument("--no-progress", action="store_true", help="hide progress bars")
    samp = gen.add_argument_group("sampling (SamplingParams names; defaults: temperature 0, top_p 1, seed 0)")
    samp.add_argument("--temperature", type=float, default=None)
    samp.add_argument("--top-p", type=float, default=None)
    samp.add_argument("--top-k", type=int, default=None)
    samp.add_argument("--max-tokens", type=int, default=None, help="default 256")
    samp.add_argument("--sampling-seed", dest="sampling_seed", type=int, default=None)
    _add_remote_flags(gen, "/v1/chat/completions")
    _add_engine_flags(gen)

    bench = sub.add_parser(
        "bench",
        help="encode throughput and latency: vllm (ours) vs st vs mteb-vllm",
        description="Measure texts/s, tokens/s and per-call latency of the encode backends on generated texts "
        "of controlled token length; writes bench.json and plots. Engine options apply to the vLLM backends.",
    )
    bench.add_argument("--model", default=None, help="model directory or hub id (default: packaged all-MiniLM-L6-v2)")
    bench.add_argument("--backends", nargs="+", default=["vllm", "st", "mteb-vllm"],
                       choices=["vllm", "st", "mteb-vllm", "remote"],
                       help="remote: the --endpoint servers (all of them, spread round-robin)")
    bench.add_argument("--dtypes", nargs="+", default=None, help="default: float32 on CPU, float16 float32 on GPU")
    bench.add_argument("--lengths", nargs="+", default=["fixed:130", "mixed:16-500"],
                       help="fixed:N or mixed:A-B token lengths (default: fixed:130 mixed:16-500)")
    bench.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 512, 2000],
                       help="texts per encode call (default 64 512 2000)")
    bench.add_argument("--n-texts", type=int, default=2000)
    bench.add_argument("--st-batch-size", type=int, default=128, help="sentence-transformers batch size")
    bench.add_argument("--output-dir", default="results/bench")
    _add_remote_flags(bench, "/v1/embeddings")
    bench.add_argument("--remote-batch-size", type=int, default=64, help="--backends remote: inputs per request")
    _add_scale_flags(bench, many=True)
    _add_engine_flags(bench)

    models = sub.add_parser("models", help="list model presets (the registry)")
    models.add_argument("--kind", choices=["embedding", "reranker", "language", "multimodal"], default=None)

    tasks = sub.add_parser("tasks", help="list the offline tasks")
    tasks.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _add_remote_flags(parser: argparse.ArgumentParser, what: str) -> None:
    rem = parser.add_argument_group(f"--backend remote ({what} of running `vllm serve` instances)")
    rem.add_argument("--endpoint", action="append", default=None,
                     help="a served base URL, e.g. http://127.0.0.1:8000 (repeat for several servers)")
    rem.add_argument("--api-key", default=None, help="key of servers started with --api-key")
    rem.add_argument("--max-concurrency", type=int, default=8, help="requests in flight over all endpoints (default 8)")


def _add_scale_flags(parser: argparse.ArgumentParser, many: bool = False) -> None:
    dp = parser.add_argument_group("engine replicas (--backend vllm)" + (": several values measure each" if many else ""))
    extra: dict[str, Any] = {"nargs": "+", "default": [1]} if many else {"default": 1}
    dp.add_argument("--data-parallel-size", type=int, **extra,
                    help="engine replicas over this machine's GPUs (each with --tensor-parallel-size GPUs) "
                    "or over disjoint CPU core sets; inputs are sharded, order kept (default 1)")
    dp.add_argument("--replicas-per-gpu", type=int, **extra,
                    help="engines sharing each GPU, for models too small to keep one busy; "
                    "--gpu-memory-utilization is split among them unless given (default 1)")


def _scale_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k in ("data_parallel_size", "replicas_per_gpu") if (v := getattr(args, k, 1)) != 1}


def _refuse_data_parallel(extra: dict[str, Any], command: str) -> None:
    if "data_parallel_size" in extra:
        raise CliError(f"`vllm-eval {command}` runs one in-process engine; to spread it over GPUs start one "
                       "`vllm serve` per GPU and pass them with --backend remote --endpoint URL ...")


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    eng = parser.add_argument_group("vLLM engine options (EngineArgs names)")
    for name, typ, help_ in _ENGINE_FLAGS:
        eng.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=help_)
    for name, help_ in _ENGINE_BOOLS:
        eng.add_argument("--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction,
                         default=None, help=help_)


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    engine = {name: getattr(args, name) for name, _, _ in _ENGINE_FLAGS}
    engine.update({name: getattr(args, name) for name, _ in _ENGINE_BOOLS})
    return {k: v for k, v in engine.items() if v is not None}


def _check_st_options(engine: dict[str, Any], extra: dict[str, Any], allowed: set[str]) -> None:
    """The st and remote backends start no vLLM engine: engine options would be silently ignored."""
    unused = sorted((set(engine) - allowed) | set(extra))
    if unused:
        raise CliError(f"this backend does not take vLLM engine options: {', '.join('--' + u.replace('_', '-') for u in unused)}")


def _task_names(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def _make_encoder(args: argparse.Namespace, extra: dict[str, Any]):
    common = dict(
        revision=args.revision,
        model_name=args.model_name,
        prompts=args.prompts,
        instruction_template=args.instruction_template,
        apply_instruction_to_documents=args.apply_instruction_to_documents,
        dimensions=args.dimensions,
        show_progress_bar=not args.no_progress,
    )
    engine = _engine_options(args)
    if args.backend != "vllm" and _scale_options(args):
        raise CliError("--data-parallel-size / --replicas-per-gpu need --backend vllm "
                       "(for servers, pass one --endpoint per replica)")
    if args.backend == "remote":
        _check_st_options(engine, extra, set())
        from .remote import RemoteEncoder

        common.pop("revision")
        return RemoteEncoder(args.endpoint, args.model, api_key=args.api_key, encoding_format=args.encoding_format,
                             max_concurrency=args.max_concurrency, **common)
    if args.backend == "st":
        _check_st_options(engine, extra, {"dtype", "max_model_len", "trust_remote_code"})
        from .st_backend import SentenceTransformerEncoder

        return SentenceTransformerEncoder(args.model, device=args.device, **common, **engine)
    from .encoder import VllmEncoder

    return VllmEncoder(args.model, **common, **_scale_options(args), **engine, **extra)


def _check_common(args: argparse.Namespace, extra: dict[str, Any]) -> None:
    """Checks every model command shares, before any model, engine or task loads."""
    from .engine import check_engine_kwargs

    backends = getattr(args, "backends", None) or [args.backend]
    if "remote" in backends and not args.endpoint:
        raise CliError(f"--backend{'s' if args.command == 'bench' else ''} remote needs at least one --endpoint URL")
    if "remote" not in backends and args.endpoint:
        raise CliError("--endpoint is for --backend remote")
    if args.command in ("rerank", "generate"):
        _refuse_data_parallel(extra, args.command)
    if extra and {"vllm", "mteb-vllm"} & set(backends):
        check_engine_kwargs(extra)


def _print_table(rows, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    staged = any(r.stage for r in rows)
    table = Table(title=title)
    table.add_column("task")
    if staged:
        table.add_column("stage")
    table.add_column("type")
    table.add_column("main score")
    table.add_column("value", justify="right")
    table.add_column("seconds", justify="right")
    for r in rows:
        cells = [r.task] + ([r.stage] if staged else []) + [r.task_type, r.main_score_name, f"{r.main_score:.4f}",
                                                             f"{r.seconds:.1f}"]
        table.add_row(*cells)
    Console(width=max(100, Console().width)).print(table)


def cmd_run(args: argparse.Namespace, extra: dict[str, Any]) -> int:
    from .engine import resolve_model
    from .tasks import get_tasks

    if args.model is not None and args.backend != "remote":
        resolve_model(args.model)  # a missing path fails before any engine or task loads
    tasks = get_tasks(_task_names(args.tasks))
    encoder = _make_encoder(args, extra)
    try:
        from .results import evaluate

        rows = evaluate(
            encoder,
            tasks,
            output_dir=args.output_dir,
            show_progress_bar=not args.no_progress,
            run_info={"backend": args.backend, "model_path": encoder.model,
                      "engine_kwargs": getattr(encoder, "engine_kwargs", None)},
        )
    finally:
        encoder.close()
    meta = encoder.mteb_model_meta
    _print_table(rows, f"{meta.name} ({args.backend})")
    if args.output_dir:
        print(f"results: {os.path.join(args.output_dir, 'results', meta.model_name_as_path(), meta.revision)}")
    return 0


def cmd_rerank(args: argparse.Namespace, extra: dict[str, Any]) -> int:
    import tempfile

    from .engine import resolve_model
    from .reranker import load_reranker
    from .results import evaluate_two_stage, load_first_stage
    from .tasks import get_tasks

    engine = _engine_options(args)
    if args.backend != "remote":
        if not args.reranker:
            raise CliError("--reranker MODEL is required (for --backend remote it is the served name, optional)")
        resolve_model(args.reranker)
    if args.first_stage.lower() not in ("bm25s", "bm25", "mteb/baseline-bm25s"):
        resolve_model(args.first_stage)
    if args.top_k < 1:
        raise CliError(f"--top-k must be >= 1, got {args.top_k}")
    if args.backend == "st":
        _check_st_options(engine, extra, {"max_model_len", "trust_remote_code"})
        kwargs: dict[str, Any] = {"device": args.device, **engine}
        if args.preset:
            raise CliError("--preset needs --backend vllm (templates have no sentence-transformers form)")
    elif args.backend == "remote":
        _check_st_options(engine, extra, set())
        from .registry import get_preset

        kwargs = {"endpoints": args.endpoint, "api": args.api, "api_key": args.api_key,
                  "max_concurrency": args.max_concurrency,
                  "score_template": get_preset(args.preset).score_template if args.preset else None}
    else:
        kwargs = {"preset": args.preset, **engine, **extra}
    tasks = get_tasks(_task_names(args.tasks))
    show = not args.no_progress
    first = load_first_stage(args.first_stage, show_progress_bar=show)
    try:
        reranker = load_reranker(args.reranker, args.backend, prompts=args.prompts, show_progress_bar=show, **kwargs)
    except BaseException:
        getattr(first, "close", lambda: None)()
        raise
    with tempfile.TemporaryDirectory(prefix="vllm-eval-rerank-") as tmp:
        try:
            rows = evaluate_two_stage(
                first, reranker, tasks, top_k=args.top_k, output_dir=args.output_dir or tmp, show_progress_bar=show,
                run_info={"first_stage": args.first_stage, "reranker": args.reranker, "backend": args.backend,
                          "preset": args.preset, "engine_kwargs": getattr(reranker, "engine_kwargs", None)},
            )
        finally:
            reranker.close()
            getattr(first, "close", lambda: None)()
    _print_table(rows, f"{args.first_stage} -> top {args.top_k} -> {reranker.mteb_model_meta.name} ({args.backend})")
    if args.output_dir:
        print(f"results: {args.output_dir}/stage1, {args.output_dir}/stage2")
    return 0


def cmd_generate(args: argparse.Namespace, extra: dict[str, Any]) -> int:
    from .engine import resolve_model
    from .generator import VllmGenerator
    from .tasks.generative import get_generative_task, run_multiple_choice
    from .tasks.multiple_choice import MissingAnswersError

    if args.backend == "vllm":
        if not args.model:
            raise CliError("--model is required (for --backend remote it is the served name, optional)")
        resolve_model(args.model)
    else:
        _check_st_options(_engine_options(args), extra, set())
    try:
        task = get_generative_task(args.task)
    except KeyError as exc:
        raise CliError(str(exc.args[0])) from None
    sampling = {k: v for k, v in {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                                  "max_tokens": args.max_tokens, "seed": args.sampling_seed}.items() if v is not None}
    chat_template = args.chat_template
    if chat_template and os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as fh:
            chat_template = fh.read()
    output_dir = args.output_dir or os.path.join("results", "generate", task.name)
    common = dict(system_prompt=args.system_prompt, raw_prompts=args.raw_prompts, sampling=sampling,
                  show_progress_bar=not args.no_progress)
    if args.backend == "remote":
        if chat_template or args.preset:
            raise CliError("--chat-template / --preset apply in-process; a server uses the template it was started with")
        from .remote import RemoteGenerator

        generator: Any = RemoteGenerator(args.endpoint, args.model, api_key=args.api_key,
                                         max_concurrency=args.max_concurrency,
                                         image_position=args.image_position or "before", **common)
    else:
        generator = VllmGenerator(
            args.model, preset=args.preset, chat_template=chat_template, image_position=args.image_position,
            max_images_per_prompt=1 if task.modality == "image" else None, **common, **_engine_options(args), **extra,
        )
    with generator:
        try:
            results = run_multiple_choice(
                generator, task, answer_format=args.answer_format, scoring=args.scoring, letters=args.letters,
                reasoning=args.reasoning, limit=args.limit, max_missing=args.max_missing, output_dir=output_dir,
            )
        except MissingAnswersError as exc:
            print(f"vllm-eval: error: {exc}", file=sys.stderr)
            return 1
    m = results["metrics"]
    print(f"{task.name} ({args.scoring}{', ' + args.answer_format if args.scoring == 'generate' else ''}): "
          f"accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  missing {int(m['missing'])}/{int(m['n_samples'])}  "
          f"{results['seconds']:.1f} s")
    print(f"results: {output_dir}/results.json, {output_dir}/samples.jsonl")
    return 0


def cmd_bench(args: argparse.Namespace, extra: dict[str, Any]) -> int:
    from .bench import run_bench
    from .engine import on_cpu, resolve_model

    if args.model is not None:
        resolve_model(args.model)
    engine = {k: v for k, v in {**_engine_options(args), **extra}.items() if k != "dtype"}
    dtypes = args.dtypes or ([args.dtype] if args.dtype else (["float32"] if on_cpu() else ["float16", "float32"]))
    remote = {"endpoints": args.endpoint, "api_key": args.api_key, "batch_size": args.remote_batch_size,
              "max_concurrency": args.max_concurrency} if args.endpoint else None
    replicas = [{"data_parallel_size": dp, "replicas_per_gpu": k}
                for dp in args.data_parallel_size for k in args.replicas_per_gpu]
    records = run_bench(args.model, backends=args.backends, dtypes=dtypes, lengths=args.lengths,
                        batch_sizes=args.batch_sizes, n_texts=args.n_texts, engine_kwargs=engine,
                        st_batch_size=args.st_batch_size, replicas=replicas, remote=remote,
                        output_dir=args.output_dir)
    best: dict[tuple[str, str, str], float] = {}
    for r in records:
        key = (r.backend, r.dtype, r.lengths)
        best[key] = max(best.get(key, 0.0), r.tokens_per_s)
    print("\nbest tokens/s per backend, dtype, lengths (ratios to st and to mteb-vllm):")
    for (backend, dtype, spec), tps in sorted(best.items()):
        ratios = [f"{tps / ref:.2f}x {name}" for name in ("st", "mteb-vllm")
                  if name != backend and (ref := best.get((name, dtype, spec)))]
        print(f"  {backend:12s} {dtype:9s} {spec:14s} {tps:>10.0f}  " + "  ".join(ratios))
    print(f"results: {args.output_dir}/bench.json and plots")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .registry import list_presets

    table = Table(title="model presets")
    for col in ("name", "kind", "model", "description"):
        table.add_column(col)
    for p in list_presets(args.kind):
        table.add_row(p.name, p.kind, p.model, p.description)
    Console(width=max(120, Console().width)).print(table)
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from .tasks import offline_tasks
    from .tasks.generative import GENERATIVE_TASKS

    rows = [
        {"name": name, "kind": "mteb", "type": cls.metadata.type, "main_score": cls.metadata.main_score,
         "description": cls.metadata.description}
        for name, cls in offline_tasks().items()
    ] + [
        {"name": t.name, "kind": "generative", "type": f"multiple choice ({t.modality})",
         "main_score": "accuracy", "description": t.description}
        for t in GENERATIVE_TASKS.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="offline tasks (gensim / scikit-learn data, no network)")
    for col in ("name", "kind", "type", "main_score"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["kind"], r["type"], r["main_score"])
    Console().print(table)
    print("mteb tasks: `vllm-eval run` / `rerank` (any mteb task name works too, its data then comes from the hub).")
    print("generative tasks: `vllm-eval generate`.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vllm-eval``; returns the process exit code (0 ok, 2 user error)."""
    parser = _build_parser()
    args, extra = parser.parse_known_args(argv)
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if extra and args.command not in ("run", "rerank", "generate", "bench"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from .engine import EngineError
    from .tasks import UnknownTaskError

    try:
        commands = {"run": cmd_run, "rerank": cmd_rerank, "generate": cmd_generate, "bench": cmd_bench}
        if args.command in commands:
            engine_extra = parse_extra_engine_args(extra)
            _check_common(args, engine_extra)
            return commands[args.command](args, engine_extra)
        if args.command == "models":
            return cmd_models(args)
        return cmd_tasks(args)
    except (CliError, UnknownTaskError, FileNotFoundError, TypeError, ValueError, EngineError) as exc:
        if args.verbose:
            raise
        print(f"vllm-eval: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, EngineError) else 2
    finally:
        from .engine import shutdown_all

        if "vllm" in sys.modules:
            shutdown_all()


def run() -> None:
    """Console entry point: :func:`main`, then a hard exit once vLLM has been loaded.

    Every engine is shut down and every result written before this point, but interpreter
    finalization itself sometimes aborted with vLLM loaded ("terminate called without an active
    exception", exit 134, 1 run in 4 of ``generate --scoring loglikelihood`` on the CPU build);
    the exit code must be the command's own.
    """
    code = main()
    if "vllm" in sys.modules:
        import logging

        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
