"""``vllm-eval report``: one self-contained HTML page for run directories."""

from __future__ import annotations

import argparse

from ..base import Command, Context


class ReportCommand(Command):
    name = "report"
    help = "one self-contained HTML page for run directories"
    description = (
        "Render run directories (their summary.json, and compare.json when present) "
        "into one HTML file with no network assets: scores, telemetry, plots, parity, provenance."
    )
    loads_model = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "runs",
            nargs="+",
            help="run directories (a run's or a comparison's --output-dir, a bench --suite folder, or a sweep's "
            "--output-dir: its table and each task's score per training step)",
        )
        parser.add_argument("--output", "-o", default="report.html", help="HTML file to write (default report.html)")
        parser.add_argument("--title", default="vllm-eval report")

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        from ...measure.report import write_report

        print(f"report: {write_report(args.runs, args.output, args.title)}")
        return 0
