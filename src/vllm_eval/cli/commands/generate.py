"""``vllm-eval generate``: a chat LLM / VLM on multiple-choice tasks, by answer or by log-likelihood.

Parses its flags and calls :func:`vllm_eval.api.generate.generate`, then prints each task's line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...api.generate import ANSWER_FORMATS, BACKEND_OPTIONS, SCORINGS
from ..base import Command, Context
from ..options import (
    add_backend,
    add_cache_flags,
    add_common,
    add_engine_flags,
    add_model,
    add_remote_flags,
    add_scale_flags,
    add_tasks,
    fraction,
    integer,
    json_object,
    nonneg_float,
    positive_int,
)
from ..tables import report_cache, sweep_exit

#: Flags that are the library call's own keywords (the rest are backend and engine options).
_CALL_FLAGS = (
    "model",
    "tasks",
    "data",
    "backend",
    "answer_format",
    "scoring",
    "letters",
    "reasoning",
    "limit",
    "max_missing",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "sampling_seed",
    "output_dir",
    "cache_dir",
    "no_cache",
    "verbose",
)


class GenerateCommand(Command):
    name = "generate"
    help = "evaluate a chat LLM / VLM on multiple-choice tasks"
    description = (
        "Evaluate a generative model on multiple-choice tasks (PangLeePolarity: text, Digits: images). "
        "Writes results.json and samples.jsonl (prompt, raw output, parsed answer, target, correct per sample)."
    )
    kind = "generator"
    backend_options = BACKEND_OPTIONS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_model(parser, many=True)
        add_backend(parser, (self.kind,))
        add_tasks(
            parser,
            "generative tasks: PangLeePolarity, Digits (offline); MMLU, ARC-Challenge, ARC-Easy (hub); or --data",
            aliases=("--task",),
        )
        parser.add_argument(
            "--data",
            default=None,
            help="your own multiple-choice file: .jsonl/.csv/.parquet with question, options, answer [, image]",
        )
        parser.add_argument("--answer-format", choices=ANSWER_FORMATS, default="json")
        parser.add_argument(
            "--scoring",
            choices=SCORINGS,
            default="generate",
            help="generate: sample an answer and parse it; loglikelihood: the option whose tokens have the highest "
            "summed log-probability after the prompt (its images included)",
        )
        parser.add_argument(
            "--letters",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="name options by letter (default: the task's choice)",
        )
        parser.add_argument("--reasoning", action="store_true", help="ask for brief reasoning before the answer")
        parser.add_argument("--limit", type=positive_int, default=None, help="first N samples only")
        parser.add_argument(
            "--max-missing",
            type=nonneg_float,
            default=0.1,
            help="budget of unparsable answers: fraction if <= 1, else count (default 0.1)",
        )
        parser.add_argument("--preset", default=None, help="model preset (see `vllm-eval models`)")
        parser.add_argument("--chat-template", default=None, help="chat template: a file, or the Jinja text itself")
        parser.add_argument(
            "--chat-template-kwargs",
            type=json_object,
            default=None,
            help="JSON object of extra chat template variables, e.g. '{\"enable_thinking\": false}' (Qwen3)",
        )
        parser.add_argument(
            "--think-end-token",
            default=None,
            help="reasoning models: the text that ends the reasoning; the answer is read after it "
            "(default: the preset's, e.g. </think> for Qwen3; '' for none)",
        )
        parser.add_argument("--system-prompt", default=None)
        parser.add_argument("--raw-prompts", action="store_true", help="no chat template: send the text as is")
        parser.add_argument("--image-position", choices=["before", "after"], default=None)
        add_common(parser, "default: results/generate/<task>; with several tasks each goes to <output-dir>/<task>")
        add_cache_flags(parser)
        samp = parser.add_argument_group("sampling (SamplingParams names; defaults: temperature 0, top_p 1, seed 0)")
        samp.add_argument("--temperature", type=nonneg_float, default=None)
        samp.add_argument("--top-p", type=fraction, default=None)
        samp.add_argument("--top-k", type=integer, default=None)
        samp.add_argument("--max-tokens", type=positive_int, default=None, help="default 256")
        samp.add_argument("--sampling-seed", dest="sampling_seed", type=integer, default=None)
        add_remote_flags(parser, "/v1/chat/completions")
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.generate import generate

        call = {k: getattr(args, k) for k in _CALL_FLAGS}
        options = {k: v for k, v in self.options_of(args).items() if v is not None}
        result = generate(**call, show_progress=not args.no_progress, started=ctx.started, **options, **ctx.engine)
        if (code := sweep_exit(result)) is not None:
            return code
        for task, results in result.results.items():
            if task in result.errors:
                print(f"vllm-eval: error: {result.errors[task]}", file=sys.stderr)
            else:
                _print_result(args, task, results, result.output_dirs[task])
        report_cache(result.cache)
        return 1 if result.failed else 0


def _print_result(args: argparse.Namespace, task: str, results: dict[str, Any], out: Any) -> None:
    m = results["metrics"]
    fmt = f", {args.answer_format}" if args.scoring == "generate" else ""
    cut = f" (reasoning unfinished {int(m['reasoning_unfinished'])})" if m.get("reasoning_unfinished") else ""
    print(
        f"{task} ({args.scoring}{fmt}): accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  "
        f"missing {int(m['missing'])}/{int(m['n_samples'])}{cut}  {results['seconds']:.1f} s"
    )
    print(f"results: {out}/results.json, {out}/samples.jsonl")
