"""``vllm-eval report``: one self-contained HTML page for one or more run directories.

The page shows, per run, the scores with their telemetry (seconds split into encode and scoring,
tokens/s, cache hits), a plot of the time split and of throughput per task, the run's timeline (one
bar per phase over time, see :mod:`vllm_eval.utils.timeline`) with seconds per phase, the parity deltas of a
``compare.json`` next to the run (|Δ| per task and configuration against the tolerance, on a log
axis), and the provenance (model, revision, backend, device, engine options in force, prompts,
package versions, command, timestamps). Plots are drawn with matplotlib and inlined as PNG ``data:``
URLs, the style sheet is inline: the file opens anywhere with no network.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from ..utils.timeline import PHASES, phase_totals
from .compare import describe_agreement
from .runfiles import read_compare, read_summary, read_sweep, suite_backends

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fde2e2; } tr.pass td.result { color: #17632a; }
code, pre { background: #f4f4f4; font-size: 0.88em; } pre { padding: 0.6em; overflow-x: auto; }
img { max-width: 100%; }
"""


def load_run(path: str | Path) -> dict[str, Any]:
    """A run directory's ``summary.json`` (and ``compare.json`` when present), with its path, both checked
    (:mod:`vllm_eval.measure.runfiles`).

    Raises:
        UsageError: the directory has neither, or one that is damaged (file, field and reason named).
    """
    folder = Path(path)
    summary = folder / "summary.json"
    compare = folder / "compare.json"
    if not summary.is_file() and not compare.is_file() and (folder / "sweep.json").is_file():
        return {"sweep": read_sweep(folder / "sweep.json"), "path": str(folder)}
    if not summary.is_file() and not compare.is_file():
        raise UsageError(f"{str(path)!r} has neither summary.json nor compare.json; give a run's --output-dir")
    run: dict[str, Any] = read_summary(summary) if summary.is_file() else {}
    if compare.is_file():
        run["compare"] = read_compare(compare)
    run["path"] = str(folder)
    return run


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(width: float, height: float) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 2, figsize=(width, height))


def time_plot(scores: list[dict[str, Any]]) -> str | None:
    """Stacked bars of encode vs scoring seconds per task, and tokens/s per task, as a PNG data URL."""
    rows = [s for s in scores if not str(s.get("status", "")).startswith("failed")]
    if not rows:
        return None
    fig, (left, right) = _figure(11, 0.5 + 0.45 * len(rows))
    names = [r["task"] + (f" ({r['stage']})" if r.get("stage") else "") for r in rows]
    encode = [r.get("encode_seconds") or 0.0 for r in rows]
    other = [
        max((r.get("seconds") or 0.0) - e, 0.0) if not r.get("score_seconds") else r["score_seconds"]
        for r, e in zip(rows, encode, strict=True)
    ]
    left.barh(names, encode, label="encode (backend)", color="#4878cf")
    left.barh(names, other, left=encode, label="scoring (mteb)", color="#d5bb67")
    left.set_xlabel("seconds")
    left.set_title("time per task")
    left.legend(loc="lower right", fontsize=8)
    left.invert_yaxis()
    tps = [r.get("tokens_per_s") or 0.0 for r in rows]
    right.barh(names, tps, color="#6acc65")
    right.set_xlabel("tokens / s (computed inputs)")
    right.set_title("throughput")
    right.set_yticks(range(len(names)), [""] * len(names))
    right.invert_yaxis()
    return _png(fig)


#: A colour per timeline phase (matplotlib's "tab10" order; ``wait`` light grey).
_PHASE_COLOURS = dict(
    zip(
        PHASES,
        (
            "#7f7f7f",
            "#bcbd22",
            "#17becf",
            "#9467bd",
            "#d62728",
            "#8c564b",
            "#1f77b4",
            "#c7c7c7",
            "#ff7f0e",
            "#2ca02c",
            "#e377c2",
        ),
    )
)


def _lanes(phases: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Timeline phases by the row they are drawn on: the run's own, one per engine or replica, one per task."""
    engines = {p.get("detail") or "" for p in phases if p["phase"] == "engine"}
    lanes: dict[str, list[dict[str, Any]]] = {"run": []}
    lanes.update({f"engine {d}" if d.startswith("replica") else "engine": [] for d in sorted(engines)})
    for p in phases:
        if p["phase"] == "engine":
            lane = f"engine {p['detail']}" if str(p.get("detail", "")).startswith("replica") else "engine"
        else:
            lane = p.get("task") or "run"
        lanes.setdefault(lane, []).append(p)
    return lanes


def timeline_plot(timeline: dict[str, Any] | None) -> str | None:
    """The run's phases as bars over time (seconds since the process started), one row per engine
    or replica and per task, coloured by phase, as a PNG data URL; None for a run without a timeline."""
    phases = (timeline or {}).get("phases") or []
    if not phases:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = _lanes(phases)
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.32 * len(lanes)))
    for row, members in enumerate(lanes.values()):
        bars = [(p["start"], max(p["end"] - p["start"], 0.01)) for p in members]
        colours = [_PHASE_COLOURS.get(p["phase"], "#000000") for p in members]
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colours)
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the process started")
    ax.set_title("timeline")
    seen = [name for name in PHASES if any(p["phase"] == name for p in phases)]
    ax.legend(
        handles=[Patch(color=_PHASE_COLOURS[n], label=n) for n in seen],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.6 / (1 + len(lanes))),
        ncol=len(seen),
        fontsize=8,
        frameon=False,
    )
    return _png(fig)


def _totals_table(timeline: dict[str, Any]) -> str:
    totals = phase_totals(timeline)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in totals)
    cells = "".join(f"<td class='num'>{v:.2f}</td>" for v in totals.values())
    return f"<table><tr>{head}</tr><tr>{cells}</tr></table><p>seconds per phase (overlapping phases count in full)</p>"


def parity_plot(compare: dict[str, Any]) -> str | None:
    """|Δ main score| per task and configuration against the reference, log axis, with the tolerances."""
    rows = [
        r for r in compare.get("rows", []) if r["config"] != compare.get("reference") and r.get("delta") is not None
    ]
    if not rows:
        return None
    configs = sorted({r["config"] for r in rows})
    tasks = sorted({r["task"] for r in rows})
    fig, (ax, _unused) = _figure(11, 0.6 + 0.35 * len(tasks) * len(configs))
    _unused.axis("off")
    height = 0.8 / len(configs)
    for j, config in enumerate(configs):
        values = {r["task"]: max(r["delta"], 1e-12) for r in rows if r["config"] == config}
        ax.barh(
            [i + j * height for i in range(len(tasks))],
            [values.get(t, 1e-12) for t in tasks],
            height=height,
            label=config,
        )
    # One label per tolerance line, stacked, so close tolerances (1e-4, 1e-3) stay readable.
    for k, tol in enumerate(sorted({r["tolerance"] for r in rows})):
        ax.axvline(tol, color="#c44e52", linestyle="--", linewidth=1)
        ax.text(tol, -0.6 - 0.35 * k, f" tolerance {tol:.0e}", color="#c44e52", fontsize=8)
    ax.set_xscale("log")
    ax.set_yticks([i + height * (len(configs) - 1) / 2 for i in range(len(tasks))], tasks)
    ax.invert_yaxis()
    ax.set_xlabel(f"|Δ main score| vs {compare.get('reference')} (log; 1e-12 = equal)")
    ax.legend(fontsize=8)
    return _png(fig)


def sweep_plot(sweep: dict[str, Any]) -> str | None:
    """Each task's main score against the checkpoint's training step (the model's place in the sweep where no
    step is known), as a PNG data URL; a filled marker where the paired bootstrap finds the model different from
    the first (95 %)."""
    models, scores = sweep.get("models") or [], sweep.get("scores") or {}
    tasks = list(sweep.get("tasks") or {})
    if not models or not tasks:
        return None
    steps = [m.get("step") for m in models]
    xs = steps if all(isinstance(s, int) for s in steps) else list(range(len(models)))
    fig, (left, right) = _figure(12, 4.5)
    right.remove()
    for task in tasks:
        points = [(x, scores.get(m["label"], {}).get(task), m["label"]) for x, m in zip(xs, models, strict=True)]
        points = [(x, y, label) for x, y, label in points if y is not None]
        if not points:
            continue
        line = left.plot([p[0] for p in points], [p[1] for p in points], marker="o", mfc="white", label=task)
        marked = [p for p in points if (sweep.get("significance") or {}).get(p[2], {}).get(task, {}).get("significant")]
        left.scatter([p[0] for p in marked], [p[1] for p in marked], color=line[0].get_color(), zorder=3)
    left.set_xlabel("training step" if xs is steps else "model (sweep order)")
    left.set_ylabel("main score")
    left.set_title("main score per checkpoint (filled: differs from the first, paired bootstrap 95 %)")
    left.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7)
    return _png(fig)


def _sweep_table(sweep: dict[str, Any]) -> str:
    models = sweep.get("models") or []
    head = "".join(f"<th>{html.escape(m['label'])}</th>" for m in models)
    body = []
    for task, main in (sweep.get("tasks") or {}).items():
        cells = []
        for i, m in enumerate(models):
            score = (sweep.get("scores") or {}).get(m["label"], {}).get(task)
            diff = (sweep.get("significance") or {}).get(m["label"], {}).get(task, {})
            mark = " *" if i and diff.get("significant") else ""
            cells.append(_cell(score).replace("</td>", f"{mark}</td>"))
        body.append(f"<tr><td>{html.escape(task)}</td><td>{html.escape(main)}</td>{''.join(cells)}</tr>")
    return f"<table><tr><th>task</th><th>main score</th>{head}</tr>{''.join(body)}</table>"


def _cell(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td class="num">-</td>'
    if isinstance(value, float):
        text = f"{value:,.{digits}f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
        return f'<td class="num">{text}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value:,}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def _scores_table(scores: list[dict[str, Any]]) -> str:
    cols = [
        ("task", "task"),
        ("stage", "stage"),
        ("type", "task_type"),
        ("main score", "main_score_name"),
        ("value", "main_score"),
        ("seconds", "seconds"),
        ("encode s", "encode_seconds"),
        ("scoring s", "score_seconds"),
        ("tok/s", "tokens_per_s"),
        ("inputs", "inputs"),
        ("distinct", "distinct_inputs"),
        ("tokens", "tokens"),
        ("truncated", "truncated"),
        ("cache hits", "cache_hits"),
        ("status", "status"),
    ]
    if not any(s.get("stage") for s in scores):
        cols = [c for c in cols if c[0] != "stage"]
    head = "".join(f"<th>{name}</th>" for name, _ in cols)
    body = []
    for s in scores:
        cells = "".join(
            _cell(s.get(key), 1 if key in ("seconds", "encode_seconds", "score_seconds", "tokens_per_s") else 4)
            for _, key in cols
        )
        css = ' class="fail"' if str(s.get("status", "")).startswith("failed") else ""
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _compare_table(compare: dict[str, Any]) -> str:
    rows = []
    for r in compare.get("rows", []):
        ref = r["config"] == compare.get("reference")
        result = "reference" if ref else ("pass" if r["passed"] else "FAIL")
        css = "" if ref else (' class="pass"' if r["passed"] else ' class="fail"')
        rows.append(
            f"<tr{css}><td>{html.escape(r['task'])}</td><td>{html.escape(r['config'])}</td>"
            f"{_cell(r['main_score'], 6)}{_cell(r['delta'])}{_cell(r['tolerance'])}"
            f'<td class="result">{result}</td></tr>'
        )
    agree = "".join(
        f"<li>{html.escape(label)}: {html.escape(describe_agreement(a))}</li>"
        for label, a in (compare.get("agreement") or {}).items()
        if a and label != compare.get("reference")
    )
    return (
        "<table><tr><th>task</th><th>configuration</th><th>main score</th><th>|Δ|</th><th>tolerance</th>"
        f"<th>result</th></tr>{''.join(rows)}</table>" + (f"<ul>{agree}</ul>" if agree else "")
    )


def _provenance(run: dict[str, Any]) -> str:
    keys = [
        "model",
        "revision",
        "backend",
        "preset",
        "device",
        "engine_start_seconds",
        "max_length",
        "started_at",
        "finished_at",
        "total_seconds",
        "results_dir",
        "cache_dir",
    ]
    rows = "".join(f"<tr><th>{k}</th>{_cell(run[k], 2)}</tr>" for k in keys if run.get(k) is not None)
    blocks = []
    for key in ("engine_options_in_force", "prompts", "score_template", "versions", "command"):
        if run.get(key):
            text = " ".join(run[key]) if key == "command" else json.dumps(run[key], indent=2, default=str)
            blocks.append(f"<h4>{key.replace('_', ' ')}</h4><pre>{html.escape(text)}</pre>")
    return f"<table>{rows}</table>{''.join(blocks)}"


def render(runs: list[dict[str, Any]], title: str = "vllm-eval report") -> str:
    """The HTML page for ``runs`` (from :func:`load_run`)."""
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>{len(runs)} run(s); generated {datetime.now(timezone.utc).isoformat(timespec='seconds')}.</p>",
    ]
    for run in runs:
        if "sweep" in run:
            parts.append(f"<h2>sweep <small>({html.escape(run['path'])})</small></h2>" + _sweep_table(run["sweep"]))
            plot = sweep_plot(run["sweep"])
            if plot:
                parts.append(f"<img alt='main score per checkpoint' src='{plot}'>")
            continue
        name = run.get("model") or Path(run["path"]).name
        parts.append(
            f"<h2>{html.escape(str(name))} <small>("
            f"{html.escape(', '.join(str(x) for x in (run.get('backend'), run['path']) if x))})</small></h2>"
        )
        scores = run.get("scores") or []
        if scores:
            parts.append("<h3>Scores and telemetry</h3>" + _scores_table(scores))
            plot = time_plot(scores)
            if plot:
                parts.append(f"<img alt='time split and throughput per task' src='{plot}'>")
        plot = timeline_plot(run.get("timeline"))
        if plot:
            parts.append(f"<h3>Timeline</h3><img alt='phases over time' src='{plot}'>" + _totals_table(run["timeline"]))
        if run.get("compare"):
            parts.append("<h3>Parity against the reference</h3>" + _compare_table(run["compare"]))
            plot = parity_plot(run["compare"])
            if plot:
                parts.append(f"<img alt='parity deltas' src='{plot}'>")
        if scores:
            parts.append("<h3>Provenance</h3>" + _provenance(run))
    parts.append("</body></html>")
    return "\n".join(parts)


def _with_suite_runs(run_dirs: list[str | Path]) -> list[str | Path]:
    """``run_dirs`` with each ``bench --suite`` directory (a ``suite.json``) replaced by its backends' runs."""
    out: list[str | Path] = []
    for d in run_dirs:
        suite = Path(d) / "suite.json"
        if suite.is_file() and not (Path(d) / "summary.json").is_file():
            out.extend(Path(d) / b for b in suite_backends(suite) if (Path(d) / b / "summary.json").is_file())
        else:
            out.append(d)
    return out


def write_report(run_dirs: list[str | Path], output: str | Path, title: str = "vllm-eval report") -> Path:
    """Render ``run_dirs`` into one HTML file at ``output``; returns its path.

    Raises:
        UsageError: a directory without results, a damaged ``summary.json``, ``compare.json`` or ``suite.json``
            (file, field and reason named), or an output path that cannot be written.
    """
    runs = [load_run(d) for d in _with_suite_runs(run_dirs)]
    out = Path(output)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(runs, title), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--output {str(output)!r} cannot be written: {exc.strerror or exc}") from None
    return out
