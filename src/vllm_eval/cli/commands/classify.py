"""``vllm-eval classify``: a sequence classifier on labelled texts (a packaged task or your file)."""

from __future__ import annotations

import argparse
from typing import Any

from ...api.checks import open_cache, require_model, resolve_model, task_output_dirs
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
    positive_int,
)
from ..tables import report_cache


def command_tasks(command: str, names: list[str] | None, data: str | None) -> list[Any]:
    """A classifier command's tasks: ``data`` (a file) or the named tasks (default: the kind's).

    Raises:
        UsageError: both given; an unknown name; a bad file (named with its line).
        DataUnavailableError: a hub task offline and not cached.
    """
    from ...models.kinds import get_kind
    from ...tasks.registry import load_file, load_task, own_tasks

    if data and names:
        raise UsageError("give --data FILE or --tasks, not both")
    if data:
        return [load_file(command, data)]
    default = get_kind("classifier").default_tasks if command == "classify" else [t.name for t in own_tasks(command)]
    return [load_task(command, n) for n in split_names(names or list(default))]


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
        add_model(parser)
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
        from ...tasks.classification import run_classification

        spec = ctx.spec
        require_model(args.model, spec.remote)
        tasks = command_tasks(self.name, args.tasks, args.data)
        model = resolve_model(args.model, spec.remote)
        outputs = task_output_dirs(args.output_dir, self.name, tasks)
        cache = open_cache(args.cache_dir, args.no_cache)
        with spec.load(model, show_progress_bar=not args.no_progress) as classifier:
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
        report_cache(cache)
        return 0
