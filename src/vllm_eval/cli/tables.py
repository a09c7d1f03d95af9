"""What the commands print: the result table, the cache line, short values."""

from __future__ import annotations

import json
from typing import Any


def print_table(rows: list[Any], title: str) -> None:
    """One rich table of :class:`~vllm_eval.evaluation.results.TaskRow` rows (stage, rate, parity and status
    columns only when some row has them)."""
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
    weighed = any(getattr(r, "parity_max_abs_diff", None) is not None for r in rows)  # sparse encoders' |Δ|
    if weighed:
        table.add_column("parity max |Δ|", justify="right")
    if marked:
        table.add_column("status", overflow="fold")
    for r in rows:
        value = "-" if r.status.startswith("failed") else f"{r.main_score:.4f}"
        cells = [r.task, *([r.stage] if staged else []), r.task_type, r.main_score_name, value, f"{r.seconds:.1f}"]
        if rated:
            cells.append(f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-")
        if checked:
            cells.append(f"{r.parity_min_cosine:.8f} ({r.parity_n})" if r.parity_n else "-")
        if weighed:
            cells.append("-" if r.parity_max_abs_diff is None else f"{r.parity_max_abs_diff:.2e}")
        table.add_row(*cells, *([r.status] if marked else []))
    Console(width=max(100, Console().width)).print(table)


def print_sweep(result: Any) -> None:
    """A sweep's table: one row per task, one column per model (main scores); a model's score that differs from the
    first model's by more than the paired bootstrap's noise is marked ``*`` (95 % interval without 0), and one that
    could not be tested (no per-unit scores) ``?``."""
    from rich.console import Console
    from rich.table import Table

    labels = [m.label for m in result.models[: len(result.results)]]
    table = Table(title="sweep: main scores (* differs from the first model, paired bootstrap, 95 %)")
    table.add_column("task", no_wrap=True)
    table.add_column("main score")
    for label, model in zip(labels, result.models, strict=False):
        table.add_column(label if model.step is None else f"{label}\n(step {model.step})", justify="right")
    tasks: dict[str, str] = {}
    for r in result.results:
        for row in r.rows:
            tasks.setdefault(row.task, row.main_score_name)
    for task, main in tasks.items():
        cells = []
        for i, r in enumerate(result.results):
            score = r.scores.get(task)
            mark = ""
            if i and score is not None:
                diff = result.significance.get(labels[i], {}).get(task, {})
                mark = " *" if diff.get("significant") else ("" if "significant" in diff else " ?")
            cells.append("-" if score is None else f"{score:.4f}{mark}")
        table.add_row(task, main, *cells)
    Console(width=max(60 + 17 * len(labels), Console().width)).print(table)
    seconds = ", ".join(f"{label} {s:.1f}" for label, s in zip(labels, result.seconds, strict=False))
    print(f"seconds per model: {seconds}")


def sweep_exit(result: Any) -> int | None:
    """A sweep's (a command given several models) table and ``sweep.json``'s path printed, and its exit code (1
    when a task of a model failed); None, printing nothing, for one model's result."""
    from ..api.sweep import SweepResult

    if not isinstance(result, SweepResult):
        return None
    print_sweep(result)
    if result.sweep_path:
        print(f"sweep: {result.sweep_path}")
    return 1 if result.failed else 0


def print_rows(rows: list[dict[str, Any]], columns: list[str], title: str, width: int = 100) -> None:
    """A rich table of dict rows, one column per key in ``columns`` (lists joined, None as ``-``)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*(_cell(r.get(c)) for c in columns))
    Console(width=max(width, Console().width)).print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value[:6]))
    return str(value)


def report_cache(cache: Any) -> None:
    """Close ``cache`` and print its hits, misses and size (nothing for None)."""
    if cache is not None:
        cache.close()
        st = cache.stats
        print(
            f"cache: {st.hits} hits, {st.misses} computed and stored"
            + (f", {st.damaged} damaged entries recomputed" if st.damaged else "")
            + f"; {cache.size_bytes() / 2**20:.1f} MiB in {cache.directory}"
        )


def short(value: Any) -> str:
    """A value as at most 160 characters of JSON (dataclasses as dicts, strings quoted)."""
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        value = asdict(value)
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 160 else text[:157] + "..."
