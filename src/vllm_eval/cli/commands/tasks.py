"""``vllm-eval tasks``: every task a command accepts, grouped by kind of model; or what a benchmark selects."""

from __future__ import annotations

import argparse
import json

from ..base import Command, Context
from ..tables import print_rows


class TasksCommand(Command):
    name = "tasks"
    help = "list every task the commands accept, or what a benchmark or filter selects"
    loads_model = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--tasks", nargs="+", default=None, help="task names")
        parser.add_argument("--benchmark", nargs="+", default=None, help="mteb benchmark names")
        parser.add_argument("--task-types", nargs="+", default=None, help="keep tasks of these mteb types")
        parser.add_argument("--languages", nargs="+", default=None, help="keep tasks in these ISO 639-3 languages")
        parser.add_argument(
            "--search",
            nargs="?",
            const="",
            default=None,
            metavar="TEXT",
            help="lm-eval's task, group and tag names containing TEXT (all without TEXT), for `generate --tasks`",
        )
        parser.add_argument("--include-path", default=None, help="with --search: your own lm-eval task YAMLs too")

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...tasks.listing import selected_task_rows, task_rows

        if args.search is not None:
            return _search(args)
        if args.tasks or args.benchmark or args.task_types or args.languages:
            rows, missing = selected_task_rows(
                args.tasks, benchmarks=args.benchmark, task_types=args.task_types, languages=args.languages
            )
            if args.json:
                print(json.dumps(rows, indent=2))
                return 0
            title = f"{len(rows)} tasks" + (f", {missing} not available offline" if missing else "")
            print_rows(rows, ["name", "type", "main_score", "languages", "dataset", "available"], title, width=120)
            return 0
        rows = task_rows()
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        from ...models.kinds import KINDS

        for kind in KINDS.values():
            mine = [r for r in rows if kind.name in r["kinds"]]
            if mine:
                print_rows(
                    mine,
                    ["name", "command", "type", "main_score", "source", "available"],
                    f"{kind.name}: {kind.description}",
                )
        print(
            "mteb tasks and benchmarks by name: `vllm-eval tasks --benchmark NAME`, `vllm-eval run --tasks NAME ...`."
        )
        print("lm-eval's tasks, groups and tags (generate --tasks): `vllm-eval tasks --search TEXT`.")
        print("lmms-eval's tasks: `vllm-eval generate --tasks lmms.<task>` (with the lmms extra installed).")
        print("your own data: --data FILE on every command (token-classify: CoNLL or tokens/tags files).")
        return 0


def _search(args: argparse.Namespace) -> int:
    """lm-eval's names containing the text (its registry, with the user's include path)."""
    from ...tasks.lmeval import search_rows, task_manager

    rows = search_rows(task_manager(args.include_path), args.search)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    title = f"{len(rows)} lm-eval names" + (f" containing {args.search!r}" if args.search else "")
    print_rows(rows, ["name", "type", "command"], title, width=120)
    return 0
