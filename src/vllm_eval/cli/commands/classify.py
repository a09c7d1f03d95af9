"""``vllm-eval classify``: a sequence classifier on labelled texts (a packaged task or your file)."""

from __future__ import annotations

import argparse

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
    positive_int,
)
from ..tables import report_cache, sweep_exit


class ClassifyCommand(Command):
    name = "classify"
    help = "evaluate a sequence classifier (*ForSequenceClassification) on labelled texts"
    description = (
        "Classify labelled texts (a packaged task, or your own --data FILE with text and label fields) "
        "and report accuracy, macro-F1, per-class precision/recall/F1 and log-loss. Writes results.json and "
        "samples.jsonl (text, probability per label, predicted, target, correct)."
    )
    kind = "classifier"
    backend_options = ("labels",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_model(parser, many=True)
        add_backend(parser, (self.kind,))
        add_tasks(parser, "packaged labelled texts: PangLeePolarity (default, unless --data is given)")
        parser.add_argument(
            "--data", default=None, help="your own file: .jsonl, .csv or .parquet with text and label fields"
        )
        parser.add_argument("--limit", type=positive_int, default=None, help="first N texts only")
        parser.add_argument("--labels", nargs="+", default=None, help="served models: class names in index order")
        add_common(parser, "default: results/classify/<task>")
        add_cache_flags(parser)
        add_remote_flags(parser, "/classify")
        add_scale_flags(parser)
        add_engine_flags(parser)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...api.classify import classify

        result = self.call(classify, args, ctx)
        if (code := sweep_exit(result)) is not None:
            return code
        for res in result.results:
            m = res["metrics"]
            print(
                f"{res['task']} ({result.model_name}, {result.backend}): accuracy {m['accuracy']:.4f}  "
                f"macro-F1 {m['macro_f1']:.4f}  log-loss {m['log_loss']:.4f}  n {m['n_samples']}  "
                f"{res['seconds']:.1f} s"
            )
            print(f"results: {res['output_dir']}/results.json, {res['output_dir']}/samples.jsonl")
        report_cache(result.cache)
        return 0
