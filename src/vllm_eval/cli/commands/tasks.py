"""``vllm-eval tasks``: every task a command accepts, grouped by kind of model; or what a benchmark selects."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ...tasks import split_names
from ..base import Command, Context
from ..tables import print_rows

#: mteb task types a reranker and a multi-vector model also run.
_RETRIEVAL = ("Retrieval", "Reranking")


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

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        if args.tasks or args.benchmark or args.task_types or args.languages:
            return _list_selected(args)
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
        print("your own data: --data FILE on every command (token-classify: CoNLL or tokens/tags files).")
        return 0


def task_rows() -> list[dict[str, Any]]:
    """Every packaged task and every hub task with a runner of ours, as JSON-ready rows.

    ``kind`` is where the task comes from (``mteb``: the offline mteb suite; ``generative``,
    ``classification``, ``preference``: offline tasks with our own runners; ``hub``: loaded through
    ``datasets``, offline only when cached); ``kinds`` the kinds of model that run it and ``command``
    the commands.
    """
    from ...tasks import offline_tasks
    from ...tasks.registry import task_rows as own_rows
    from ...utils.hub import ensure_offline_if_unreachable

    ensure_offline_if_unreachable()  # a hub task is available offline only from the local cache
    rows = []
    for name, cls in offline_tasks(images=True).items():
        retrieval = cls.metadata.type in _RETRIEVAL
        rows.append(
            {
                "name": name,
                "kind": "mteb",
                "kinds": ["encoder", "token_embedder", "reranker"] if retrieval else ["encoder"],
                "command": "run, rerank" if retrieval else "run",
                "type": cls.metadata.type,
                "main_score": cls.metadata.main_score,
                "source": "offline",
                "available": True,
                "description": cls.metadata.description,
            }
        )
    for row in own_rows():
        offline = row["source"] == "offline"
        family = {"generate": "generative", "classify": "classification", "reward": "preference"}
        rows.append(
            {
                **row,
                "kind": family.get(row["command"], row["command"]) if offline else "hub",
                "kinds": [row["kind"]],
            }
        )
    return rows


def _list_selected(args: argparse.Namespace) -> int:
    """``vllm-eval tasks --benchmark/--tasks/--task-types/--languages``: what a run would evaluate."""
    from ...utils.hub import ensure_offline_if_unreachable

    ensure_offline_if_unreachable()
    from ...tasks import select_tasks, unavailable

    tasks = select_tasks(
        split_names(args.tasks), benchmarks=args.benchmark, task_types=args.task_types, languages=args.languages
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
    title = f"{len(rows)} tasks" + (f", {len(missing)} not available offline" if missing else "")
    print_rows(rows, ["name", "type", "main_score", "languages", "dataset", "available"], title, width=120)
    return 0
