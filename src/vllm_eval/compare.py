"""``vllm-eval compare``: one model under several configurations, checked against a reference.

Each configuration (backend × dtype × quantization × ``dimensions``) runs the same tasks through
:func:`vllm_eval.results.evaluate` (with the output cache, so a configuration already run costs
nothing); the reference (default: the sentence-transformers backend in float32) is the yardstick.
Per task, each configuration's main score, its difference to the reference and pass/fail against a
tolerance (default 1e-4 for float32, 1e-3 for 16-bit and quantized configurations); per
configuration, per-input agreement on a sample of the very inputs the tasks sent (the minimum and
median cosine of the embeddings). Existing run directories can be compared too (scores only).
The command exits 1 when a tolerance fails, so it can gate CI.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UsageError

#: Default tolerances on |Δ main score| against the reference.
TOLERANCE_FP32 = 1e-4
TOLERANCE_16BIT = 1e-3
_SIXTEEN = {"float16", "bfloat16", "half"}


@dataclass(frozen=True)
class Config:
    """One configuration of the compared model.

    Attributes:
        backend: backend name (``vllm``, ``st``, ``remote``).
        dtype: model dtype (None: the backend's default).
        quantization: vLLM quantization method (``fp8`` ...), vllm backend only.
        dimensions: matryoshka width.
    """

    backend: str
    dtype: str | None = None
    quantization: str | None = None
    dimensions: int | None = None

    @property
    def label(self) -> str:
        """E.g. ``vllm float16``, ``vllm bfloat16 fp8``, ``st float32 d=128``."""
        parts = [self.backend, self.dtype or "default"]
        if self.quantization:
            parts.append(self.quantization)
        if self.dimensions:
            parts.append(f"d={self.dimensions}")
        return " ".join(parts)

    def tolerance(self, fp32: float, sixteen_bit: float) -> float:
        """The tolerance that applies: 16-bit or quantized configurations get the looser one."""
        return sixteen_bit if (self.dtype in _SIXTEEN or self.quantization) else fp32

    def kwargs(self) -> dict[str, Any]:
        """The backend keyword arguments this configuration sets."""
        out: dict[str, Any] = {}
        if self.dtype:
            out["dtype"] = self.dtype
        if self.quantization:
            out["quantization"] = self.quantization
        if self.dimensions:
            out["dimensions"] = self.dimensions
        return out


def parse_reference(text: str) -> Config:
    """``"st"``, ``"st:float32"`` or ``"vllm:bfloat16"`` → a :class:`Config`.

    Raises:
        UsageError: more than two fields.
    """
    parts = text.split(":")
    if len(parts) > 2 or not parts[0]:
        raise UsageError(f"--reference must be BACKEND or BACKEND:DTYPE, got {text!r}")
    return Config(parts[0], parts[1] if len(parts) == 2 else None)


def configurations(
    backends: list[str], dtypes: list[str] | None, quantization: list[str] | None, dimensions: list[int] | None
) -> list[Config]:
    """Every combination, in the order given (quantization applies to the vllm backend only).

    Raises:
        UsageError: a configuration given twice.
    """
    out: list[Config] = []
    for backend in backends:
        for dtype in dtypes or [None]:
            for quant in (quantization or [None]) if backend == "vllm" else [None]:
                for dims in dimensions or [None]:
                    out.append(Config(backend, dtype, quant, dims))
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise UsageError(f"a configuration is given twice: {', '.join(labels)}")
    return out


@dataclass
class ConfigResult:
    """What one configuration gave: main score per task, and the sample of its embeddings."""

    config: Config
    scores: dict[str, float]
    sample: list[str] = field(default_factory=list, repr=False)
    embeddings: np.ndarray | None = field(default=None, repr=False)


def run_configuration(
    config: Config,
    model: Any,
    tasks: list[Any],
    *,
    output_dir: Path,
    cache: Any,
    sample_size: int,
    backend_kwargs: dict[str, Any],
    show_progress_bar: bool,
    sample: list[str] | None = None,
) -> ConfigResult:
    """Evaluate ``tasks`` with one configuration; embed the sample (collected here when ``sample`` is None)."""
    from .backends import load_backend
    from .results import evaluate

    kwargs = {**backend_kwargs, **config.kwargs(), "show_progress_bar": show_progress_bar}
    if config.backend == "st":
        kwargs = {k: v for k, v in kwargs.items() if k in _ST_KEYS}
    with load_backend("encoder", config.backend, model, **kwargs) as encoder:
        encoder.use_cache(cache)
        collect = sample is None
        if collect:
            encoder.record_inputs(sample_size)
        rows = evaluate(encoder, tasks, output_dir=output_dir, show_progress_bar=show_progress_bar)
        texts = encoder.recorded_inputs() if collect else sample
        embeddings = encoder.encode_texts(texts, show_progress_bar=False) if texts else None
    return ConfigResult(config, {r.task: r.main_score for r in rows}, list(texts or []), embeddings)


#: Keyword arguments the sentence-transformers encoder takes from a comparison.
_ST_KEYS = {
    "dtype",
    "dimensions",
    "device",
    "prompts",
    "instruction_template",
    "instructions",
    "preset",
    "apply_instruction_to_documents",
    "show_progress_bar",
    "max_model_len",
    "revision",
}


def agreement(reference: np.ndarray | None, other: np.ndarray | None) -> tuple[float, float] | None:
    """(min, median) cosine of matching rows; widths that differ (``dimensions``) compare their common prefix."""
    if reference is None or other is None or not len(reference):
        return None
    width = min(reference.shape[1], other.shape[1])
    a = reference[:, :width] / np.linalg.norm(reference[:, :width], axis=1, keepdims=True)
    b = other[:, :width] / np.linalg.norm(other[:, :width], axis=1, keepdims=True)
    cos = np.sum(a * b, axis=1)
    return float(cos.min()), float(np.median(cos))


@dataclass
class Comparison:
    """The comparison table: one row per (task, configuration), plus per-configuration agreement."""

    reference: str
    rows: list[dict[str, Any]]
    agreement: dict[str, dict[str, float] | None]

    @property
    def passed(self) -> bool:
        """True when every configuration is within its tolerance on every task."""
        return all(r["passed"] for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        """The comparison as a JSON-able dict (``compare.json``)."""
        return {"reference": self.reference, "passed": self.passed, "rows": self.rows, "agreement": self.agreement}


def compare_results(
    results: list[ConfigResult], reference: ConfigResult, fp32: float, sixteen_bit: float
) -> Comparison:
    """Score differences to the reference, pass/fail against tolerances, and sample agreement."""
    rows = []
    for res in results:
        tol = res.config.tolerance(fp32, sixteen_bit)
        for task, score in res.scores.items():
            ref = reference.scores.get(task)
            delta = None if ref is None or math.isnan(score) or math.isnan(ref) else abs(score - ref)
            rows.append(
                {
                    "task": task,
                    "config": res.config.label,
                    "main_score": score,
                    "delta": delta,
                    "tolerance": tol,
                    "passed": res is reference or (delta is not None and delta <= tol),
                }
            )
    agree = {}
    for res in results:
        pair = agreement(reference.embeddings, res.embeddings)
        agree[res.config.label] = (
            None if pair is None else {"min_cosine": pair[0], "median_cosine": pair[1], "n": len(res.sample)}
        )
    return Comparison(reference.config.label, rows, agree)


def read_run_dir(path: str | Path) -> ConfigResult:
    """A finished run's scores from its ``summary.json`` (its configuration named from the summary).

    Raises:
        UsageError: no ``summary.json`` there.
    """
    summary_path = Path(path) / "summary.json"
    if not summary_path.is_file():
        raise UsageError(f"{str(path)!r} is not a run directory (no summary.json)")
    summary = json.loads(summary_path.read_text())
    engine = summary.get("engine_options_in_force") or {}
    dtype = engine.get("dtype") if isinstance(engine, dict) else None
    config = Config(summary.get("backend") or "run", dtype and str(dtype).removeprefix("torch."))
    scores = {
        s["task"]: s["main_score"] for s in summary.get("scores", []) if not str(s.get("status")).startswith("failed")
    }
    return ConfigResult(Config(f"{config.backend}[{Path(path).name}]", config.dtype), scores)


def print_comparison(comparison: Comparison) -> None:
    """The comparison as a table on standard output."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"compared with {comparison.reference}")
    for col in ("task", "configuration", "main score", "|Δ|", "tolerance", "result"):
        table.add_column(col, justify="right" if col in ("main score", "|Δ|", "tolerance") else "left")
    for r in comparison.rows:
        delta = "-" if r["delta"] is None else f"{r['delta']:.2e}"
        result = "reference" if r["config"] == comparison.reference else ("pass" if r["passed"] else "FAIL")
        table.add_row(r["task"], r["config"], f"{r['main_score']:.6f}", delta, f"{r['tolerance']:.0e}", result)
    console = Console(width=max(100, Console().width))
    console.print(table)
    for label, agree in comparison.agreement.items():
        if agree and label != comparison.reference:
            console.print(
                f"{label}: per-input cosine to {comparison.reference} over {agree['n']} inputs: "
                f"min {agree['min_cosine']:.8f}, median {agree['median_cosine']:.8f}"
            )


def save(comparison: Comparison, output_dir: str | Path) -> Path:
    """Write ``compare.json`` into ``output_dir``; returns its path."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compare.json"
    path.write_text(json.dumps(comparison.to_json(), indent=2, default=str) + "\n")
    return path
