"""``vllm-eval generate``: a chat LLM / VLM on multiple-choice tasks, by answer or by log-likelihood."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...api.checks import chat_template, open_cache, require_model, resolve_model, task_output_dirs
from ...tasks import split_names
from ...utils.errors import UsageError
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
from ..tables import report_cache

#: ``SamplingParams`` names and the argparse destinations they come from.
SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_tokens": "max_tokens",
    "seed": "sampling_seed",
}


class GenerateCommand(Command):
    name = "generate"
    help = "evaluate a chat LLM / VLM on multiple-choice tasks"
    description = (
        "Evaluate a generative model on multiple-choice tasks (PangLeePolarity: text, Digits: images). "
        "Writes results.json and samples.jsonl (prompt, raw output, parsed answer, target, correct per sample)."
    )
    kind = "generator"
    http_batch_size = 1
    backend_options = (
        "preset",
        "chat_template",
        "chat_template_kwargs",
        "think_end_token",
        "system_prompt",
        "raw_prompts",
        "image_position",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_model(parser)
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
        parser.add_argument("--answer-format", choices=["json", "xml", "boxed", "raw"], default="json")
        parser.add_argument(
            "--scoring",
            choices=["generate", "loglikelihood"],
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

    def options_of(self, args: argparse.Namespace) -> dict[str, Any]:
        options = super().options_of(args)
        options["chat_template"] = chat_template(args.chat_template)
        return options

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...tasks.generative import run_multiple_choice
        from ...utils.errors import MissingAnswersError

        spec = ctx.spec
        tasks = generative_tasks(args.tasks, args.data)
        require_model(args.model, spec.remote)
        model = resolve_model(args.model, spec.remote)
        _check_capabilities(args, spec.cls, tasks)
        outputs = task_output_dirs(args.output_dir, "generate", tasks)
        sampling = {name: v for name, dest in SAMPLING.items() if (v := getattr(args, dest)) is not None}
        internal: dict[str, Any] = {
            "sampling": sampling,
            "show_progress_bar": not args.no_progress,
            "max_images_per_prompt": 1 if any(t.modality == "image" for t in tasks) else None,
        }
        failed = 0
        cache = open_cache(args.cache_dir, args.no_cache)
        with spec.load(model, **internal) as generator:
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
                _print_result(args, task, results, out)
        report_cache(cache)
        return failed


def _print_result(args: argparse.Namespace, task: Any, results: dict[str, Any], out: str) -> None:
    m = results["metrics"]
    fmt = f", {args.answer_format}" if args.scoring == "generate" else ""
    cut = f" (reasoning unfinished {int(m['reasoning_unfinished'])})" if m.get("reasoning_unfinished") else ""
    print(
        f"{task.name} ({args.scoring}{fmt}): accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  "
        f"missing {int(m['missing'])}/{int(m['n_samples'])}{cut}  {results['seconds']:.1f} s"
    )
    print(f"results: {out}/results.json, {out}/samples.jsonl")


def generative_tasks(names: list[str] | None, data: str | None) -> list[Any]:
    """``generate``'s tasks: ``data`` as a multiple-choice task, else by name (required).

    Raises:
        UsageError: both or neither given; an unknown name; a hub task offline and not cached.
    """
    from ...tasks.registry import load_file, load_task

    if data:
        if names:
            raise UsageError("give --data FILE or --tasks, not both")
        return [load_file("generate", data)]
    if names is None:
        raise UsageError(
            "--tasks is required: PangLeePolarity, Digits, MMLU, ARC-Challenge ... (`vllm-eval tasks`), or --data FILE"
        )
    return [load_task("generate", name) for name in split_names(names)]


def _check_capabilities(args: argparse.Namespace, cls: type, tasks: list[Any]) -> None:
    """Refuse scoring and tasks the chosen generator backend cannot honour."""
    if args.scoring == "loglikelihood" and not cls.supports_loglikelihood:
        raise UsageError(
            f"--scoring loglikelihood needs exact prompt log-probabilities, which --backend "
            f"{args.backend} cannot give; use --scoring generate"
        )
    if not cls.supports_images:
        images = [t.name for t in tasks if t.modality != "text"]
        if images:
            raise UsageError(f"--backend {args.backend} is text-only; {', '.join(images)} shows images")
