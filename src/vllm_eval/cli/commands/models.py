"""``vllm-eval models``: the model presets and what each sets."""

from __future__ import annotations

import argparse

from ..base import Command, Context
from ..tables import short


class ModelsCommand(Command):
    name = "models"
    help = "list model presets and what each sets"
    loads_model = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from ...models.kinds import KINDS

        with_presets = [k.name for k in KINDS.values() if k.preset_kinds]
        parser.add_argument("--kind", choices=with_presets, default=None, help="presets of this kind of model")

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from rich.console import Console
        from rich.table import Table

        from ...models.kinds import get_kind
        from ...models.presets import list_presets

        kinds = get_kind(args.kind).preset_kinds if args.kind else None
        table = Table(title="model presets (applied when named with --preset, or when the model name matches)")
        for col in ("name", "kind", "matches", "sets", "description"):
            table.add_column(col, overflow="fold")
        for p in list_presets():
            if kinds is not None and p.kind not in kinds:
                continue
            sets = "\n".join(f"{k}={short(v)}" for k, v in p.settings().items()) or "-"
            table.add_row(p.name, f"{p.backend_kind} ({p.kind})", "\n".join(p.patterns) or "-", sets, p.description)
        Console(width=max(140, Console().width)).print(table)
        return 0
