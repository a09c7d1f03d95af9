"""``vllm-eval generate``: a generative model on lm-evaluation-harness's tasks (lm-eval's names, options, prompts,
metrics and result files), or on this project's multiple-choice tasks and files, by answer or by log-likelihood.

Parses its flags and calls :func:`vllm_eval.api.generate.generate`, then prints lm-eval's table, or each task's line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...api.eva_tasks import EVA_OPTIONS
from ...api.generate import ANSWER_FORMATS, BACKEND_OPTIONS, LM_EVAL_KEYWORDS, SCORINGS
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
    limit_value,
    nonneg_float,
    nonneg_int,
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
    *LM_EVAL_KEYWORDS,
    *EVA_OPTIONS,
)


class GenerateCommand(Command):
    name = "generate"
    help = "evaluate a generative model on lm-eval's tasks (mmlu, gsm8k ...) or multiple-choice tasks"
    description = (
        "Evaluate a generative model on lm-evaluation-harness's tasks by lm-eval's names (its prompts, metrics and "
        "results_<date>.json / samples_<task>_<date>.jsonl), or on this project's multiple-choice tasks "
        "(PangLeePolarity: text, Digits: images) and files (results.json and samples.jsonl)."
    )
    kind = "generator"
    backend_options = BACKEND_OPTIONS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_model(parser, many=True)
        add_backend(parser, (self.kind,))
        add_tasks(
            parser,
            "lm-eval's task, group and tag names or task YAMLs (mmlu, gsm8k, hellaswag ...: `vllm-eval tasks "
            "--search TEXT`); or PangLeePolarity, Digits (offline); or --data",
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
        parser.add_argument(
            "--limit",
            type=limit_value,
            default=None,
            help="first N samples of each task (lm-eval's: or a fraction < 1)",
        )
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
        _add_lm_eval_flags(parser)
        _add_eva_flags(parser)
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
        if result.lm_eval is not None:
            _print_lm_eval(result.lm_eval)
            report_cache(result.cache)
            return 0
        for task, results in result.results.items():
            if task in result.errors:
                print(f"vllm-eval: error: {result.errors[task]}", file=sys.stderr)
            else:
                _print_result(args, task, results, result.output_dirs[task])
        report_cache(result.cache)
        return 1 if result.failed else 0


def _print_result(args: argparse.Namespace, task: str, results: dict[str, Any], out: Any) -> None:
    if "main_score" in results:  # eva's task: eva's metrics, mean over its runs
        for split, stats in results["metrics"].items():
            for row in stats:
                line = "  ".join(f"{k.split('/')[-1]} {v['mean']:.4f}" for k, v in row.items())
                print(f"{task} {split} (n={results['n_samples'][split]}, {results['config']['n_runs']} run(s)): {line}")
        print(f"results: {out}/results.json (eva's metrics), {out}/samples.jsonl")
        return
    m = results["metrics"]
    fmt = f", {args.answer_format}" if args.scoring == "generate" else ""
    cut = f" (reasoning unfinished {int(m['reasoning_unfinished'])})" if m.get("reasoning_unfinished") else ""
    print(
        f"{task} ({args.scoring}{fmt}): accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  "
        f"missing {int(m['missing'])}/{int(m['n_samples'])}{cut}  {results['seconds']:.1f} s"
    )
    print(f"results: {out}/results.json, {out}/samples.jsonl")


def _add_lm_eval_flags(parser: argparse.ArgumentParser) -> None:
    """lm-eval's options under lm-eval's names (``lm_eval --help``), for lm-eval's tasks."""
    g = parser.add_argument_group("lm-eval's tasks (lm-eval's option names)")
    g.add_argument("--include-path", default=None, help="a folder of your own task YAMLs (they may override lm-eval's)")
    g.add_argument("--num-fewshot", type=nonneg_int, default=None, help="few-shot examples (default: the task's)")
    g.add_argument(
        "--apply-chat-template",
        nargs="?",
        const=True,
        default=None,
        metavar="TEMPLATE",
        help="render prompts with the model's chat template (or the named one of several)",
    )
    g.add_argument(
        "--fewshot-as-multiturn",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="few-shot examples as chat turns (lm-eval's default with --apply-chat-template)",
    )
    g.add_argument("--system-instruction", default=None, help="a system instruction before every prompt")
    g.add_argument("--gen-kwargs", default=None, help="generation options over the tasks': 'temperature=0,top_p=1'")
    g.add_argument("--samples", type=json_object, default=None, help='JSON: {"task": [doc indices]} instead of --limit')
    g.add_argument(
        "--log-samples",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write samples_<task>_<date>.jsonl (default on)",
    )
    for seed in ("random", "numpy-random", "torch-random", "fewshot-random"):
        g.add_argument(f"--{seed}-seed", type=integer, default=None, help=argparse.SUPPRESS)
    g.add_argument("--confirm-run-unsafe-code", action="store_true", default=None, help="allow code-running tasks")
    g.add_argument("--predict-only", action="store_true", default=None, help="generate and log, compute no metric")
    g.add_argument("--bootstrap-iters", type=nonneg_int, default=None, help="stderr bootstrap iterations")
    g.add_argument("--max-gen-toks", type=positive_int, default=None, help="tokens per generation (default 256)")
    g.add_argument("--add-bos-token", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--prefix-token-id", type=integer, default=None, help="the token an empty context is scored after")
    g.add_argument("--truncation-side", choices=["left", "right", "middle"], default=None)


def _add_eva_flags(parser: argparse.ArgumentParser) -> None:
    """eva's settings (its environment variables' names in its configs), for eva's tasks."""
    g = parser.add_argument_group("kaiko-eva's tasks (eva.PatchCamelyon, eva.PathMMUAtlas, eva.PubMedQA, eva.QuiltVQA)")
    g.add_argument(
        "--data-root",
        default=None,
        help="eva's DATA_ROOT: a folder holding each task's folder (patch_camelyon, path_mmu_atlas, pubmedqa, "
        "quilt_vqa) or one task's files (default .data)",
    )
    g.add_argument("--judge-model", default=None, help="Quilt-VQA's judge, run here after the model")
    g.add_argument("--judge-endpoint", default=None, help="Quilt-VQA's judge, a served /v1/chat/completions")
    g.add_argument("--missing-limit", type=nonneg_int, default=None, help="eva's MISSING_LIMIT (default 5)")
    g.add_argument("--n-runs", type=positive_int, default=None, help="eva's N_RUNS (default: the task config's)")
    g.add_argument(
        "--download",
        action="store_true",
        default=None,
        help="first fetch the task's files into <data root>/<task folder>, as eva's download: true does (needs the "
        "network; files already there with eva's MD5 are kept)",
    )


def _print_lm_eval(ran: dict[str, Any]) -> None:
    """lm-eval's (or lmms-eval's) own tables (``make_table``), then where its files and ``summary.json`` went."""
    framework = ran.get("framework", "lm-eval")
    if framework == "lmms-eval":
        from lmms_eval.utils import make_table
    else:
        from lm_eval.utils import make_table

    print(make_table(ran["results"]))
    if ran["results"].get("groups"):
        print(make_table(ran["results"], "groups"))
    for kind, n in ran["truncated"].items():
        if n:
            print(f"{n} {kind} requests longer than the context were cut on the left (as lm-eval does)")
    if ran["results_path"] is not None:
        print(f"results: {ran['results_path']} ({framework}'s format), {ran['summary_path']}")
