"""``vllm-eval compare``: one model under several configurations, checked against a reference.

Each configuration (backend × dtype × quantization × ``dimensions``) runs the same tasks with the
output cache, so a configuration already run costs nothing; the reference (default: the
sentence-transformers backend in float32 for encoders and rerankers, transformers (``hf``) in
float32 for generators and classifiers) is the yardstick. Per task, each configuration's main score, its
difference to the reference and pass/fail against a tolerance (default 1e-4 for float32, 1e-3 for
16-bit and quantized configurations); per configuration, per-input agreement on a sample of the
very inputs the tasks sent: the minimum and median cosine of embeddings (encoder), the maximum and
median |Δ| of sparse vectors' weights (sparse encoder: each input's largest |Δ| over the vocabulary, an id
missing on one side counting as 0), of scores (reranker), of log-likelihoods in nats (generator,
multiple choice scored by log-likelihood) or of class probabilities (classifier). Existing run directories
can be compared too (scores only). The command exits 1 when a tolerance fails, so it can gate CI.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UsageError

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
    """Every combination, in the order given (quantization applies to the vllm backend only; ``none``
    in ``quantization`` stands for the unquantized model).

    Raises:
        UsageError: a configuration given twice.
    """
    out: list[Config] = []
    for backend in backends:
        for dtype in dtypes or [None]:
            quants = [None if q in (None, "none") else q for q in (quantization or [None])]
            for quant in quants if backend == "vllm" else [None]:
                for dims in dimensions or [None]:
                    out.append(Config(backend, dtype, quant, dims))
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise UsageError(f"a configuration is given twice: {', '.join(labels)}")
    return out


def default_reference(kind: str, backends: list[str] | None = None) -> str:
    """``BACKEND:DTYPE`` of ``kind``'s reference (:mod:`vllm_eval.models.kinds`), used when ``--reference`` is not
    given; when ``backends`` leave that backend out, the first of them besides the default backend (``vllm hf``
    for a vision-language embedder, whose sentence-transformers load would not prompt its images)."""
    from ..models.backends import DEFAULT_BACKEND
    from ..models.kinds import get_kind

    default = get_kind(kind).reference
    backend, _, dtype = default.partition(":")
    others = [b for b in backends or () if b != DEFAULT_BACKEND]
    if others and backend not in (backends or ()):
        return f"{others[0]}:{dtype}" if dtype else others[0]
    return default


def reference_first(configs: list[Config], wanted: Config) -> list[Config]:
    """``configs`` with the reference first: the one ``wanted`` names (its dtype or the backend's default,
    unquantized, full width), or ``wanted`` itself added when none is. The reference's inputs are the sample
    every other configuration is compared on, so it runs first."""
    plain = [c for c in configs if c.backend == wanted.backend and not c.quantization and not c.dimensions]
    reference = next((c for c in plain if c.dtype in (wanted.dtype, None)), wanted)
    ordered = list(configs) if reference in configs else [reference, *configs]
    return sorted(ordered, key=lambda c: c != reference)


@dataclass
class ConfigResult:
    """What one configuration gave: main score per task, and its outputs on the shared sample
    (embeddings (n, dim) for an encoder, scores (n,) for a reranker, log-likelihoods (n,) for a
    generator)."""

    config: Config
    scores: dict[str, float]
    sample: list[Any] = field(default_factory=list, repr=False)
    outputs: np.ndarray | None = field(default=None, repr=False)


def run_configuration(
    kind: str,
    config: Config,
    model: Any,
    tasks: list[Any],
    *,
    output_dir: Path,
    cache: Any,
    sample_size: int,
    backend_kwargs: dict[str, Any],
    show_progress_bar: bool,
    engine_kwargs: dict[str, Any] | None = None,
    sample: list[Any] | None = None,
    first_stage: str = "bm25s",
    top_k: int = 100,
    limit: int | None = None,
) -> ConfigResult:
    """Evaluate ``tasks`` with one configuration of a ``kind`` backend, then run the sample through it
    (the sample is collected here, from the inputs the tasks sent, when ``sample`` is None).

    Encoders run the mteb tasks; rerankers rerank the top ``top_k`` of ``first_stage`` per query;
    generators score the multiple-choice tasks by log-likelihood (first ``limit`` questions).
    ``engine_kwargs`` (vLLM ``EngineArgs``) go to the configurations that run a vLLM engine; keyword
    arguments a reference backend does not take (presets ...) are left out.
    """
    from ..models.backends import backend_class, load_backend

    cls = backend_class(kind, config.backend)
    engine = engine_kwargs if cls.engine_options is None else None
    kwargs = {**backend_kwargs, **(engine or {}), **config.kwargs(), "show_progress_bar": show_progress_bar}
    if cls.engine_options is not None:  # not a vLLM engine: keep what its signature names
        accepted = set(inspect.signature(cls).parameters)
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    with load_backend(kind, config.backend, model, **kwargs) as backend:
        backend.use_cache(cache)
        collect = sample is None
        if collect:
            backend.record_inputs(sample_size)
        scores = _RUNNERS[kind](backend, tasks, output_dir, show_progress_bar, first_stage, top_k, limit)
        inputs = backend.recorded_inputs() if collect else sample
        backend.record_inputs(0)
        outputs = _sample_outputs(kind, backend, inputs) if inputs else None
    return ConfigResult(config, scores, list(inputs or []), outputs)


def _run_encoder(encoder: Any, tasks: list[Any], output_dir: Path, show: bool, *_: Any) -> dict[str, float]:
    from ..evaluation.results import evaluate

    return {r.task: r.main_score for r in evaluate(encoder, tasks, output_dir=output_dir, show_progress_bar=show)}


def _run_reranker(
    reranker: Any, tasks: list[Any], output_dir: Path, show: bool, first_stage: str, top_k: int, _limit: Any
) -> dict[str, float]:
    from ..evaluation.two_stage import evaluate_two_stage, load_first_stage

    first = load_first_stage(first_stage, show_progress_bar=show)
    if reranker.cache is not None and hasattr(first, "use_cache"):
        first.use_cache(reranker.cache)
    try:
        rows = evaluate_two_stage(first, reranker, tasks, top_k=top_k, output_dir=output_dir, show_progress_bar=show)
    finally:
        getattr(first, "close", lambda: None)()
    return {r.task: r.main_score for r in rows}


def _own_runner(module: str, function: str, metric: str, **fixed: Any) -> Any:
    """A runner for tasks with a runner of ours: ``vllm_eval.tasks.<module>.<function>`` per task (with
    ``fixed`` keywords), into its own folder per configuration; the score is ``metrics[metric]``."""

    def run(
        backend: Any, tasks: list[Any], output_dir: Path, _show: bool, _first: Any, _top_k: Any, limit: int | None
    ) -> dict[str, float]:
        import importlib

        runner = getattr(importlib.import_module(f"vllm_eval.tasks.{module}"), function)
        folder = "-".join(str(v) for v in backend.experiment().values())
        return {
            task.name: float(
                runner(backend, task, limit=limit, output_dir=output_dir / folder / task.name, **fixed)["metrics"][
                    metric
                ]
            )
            for task in tasks
        }

    return run


_RUNNERS = {
    "encoder": _run_encoder,
    "reranker": _run_reranker,
    "generator": _own_runner("generative", "run_multiple_choice", "accuracy", scoring="loglikelihood"),
    "classifier": _own_runner("classification", "run_classification", "accuracy"),
    "token_classifier": _own_runner("ner", "run_token_classification", "f1"),
    "token_embedder": _run_encoder,
    "sparse_encoder": _run_encoder,
}


def _sample_outputs(kind: str, backend: Any, inputs: list[Any]) -> np.ndarray | None:
    if kind in ("encoder", "token_embedder"):
        return _stacked(backend.encode_texts(inputs, show_progress_bar=False))
    if kind == "sparse_encoder":
        return backend.encode_sparse(inputs)  # scipy CSR (n, vocab): kept sparse for the agreement
    if kind == "token_classifier":
        return _stacked(backend.word_probs(inputs, show_progress_bar=False))
    if kind == "reranker":
        return backend.score_pairs([q for q, _ in inputs], [d for _, d in inputs], show_progress_bar=False)
    if kind == "classifier":
        return backend.classify(inputs, show_progress_bar=False)
    return backend.loglikelihoods([c for c, _ in inputs], [x for _, x in inputs])


def _stacked(outputs: Any) -> np.ndarray:
    """One row per vector: ragged outputs (one array per input: token vectors, word probabilities) joined."""
    if isinstance(outputs, np.ndarray):
        return outputs
    return np.concatenate([np.asarray(o, dtype=np.float32) for o in outputs]) if len(outputs) else np.zeros((0, 0))


def agreement(reference: Any, other: Any, cosine: bool = True) -> dict[str, float] | None:
    """Per-input agreement of two configurations' outputs on the same sample.

    Embeddings (2-D, ``cosine``): ``min_cosine`` and ``median_cosine`` of matching rows (widths
    that differ, ``dimensions``, compare their common prefix). Scores, log-likelihoods (1-D),
    class probabilities (2-D, ``cosine=False``) or sparse vectors (scipy sparse matrices, any ``cosine``):
    ``max_abs_diff`` and ``median_abs_diff`` per input (the largest |Δ| of its row). Plus ``n``, the sample
    size. None when either is missing.
    """
    import scipy.sparse as sp

    if sp.issparse(reference) or sp.issparse(other):
        if reference is None or other is None or reference.shape != other.shape or not reference.shape[0]:
            return None
        from ..models.sparse_encoder.base import row_max_abs_diff

        rows = row_max_abs_diff(reference, other)
        return {"max_abs_diff": float(rows.max()), "median_abs_diff": float(np.median(rows)), "n": len(rows)}
    if reference is None or other is None or not len(reference) or len(reference) != len(other):
        return None  # ragged outputs of different lengths (another tokenization) have no row-wise agreement
    if reference.ndim == 1 or not cosine:
        diff = np.abs(np.asarray(reference, dtype=np.float64) - np.asarray(other, dtype=np.float64))
        diff = diff.reshape(len(diff), -1).max(axis=1)
        return {"max_abs_diff": float(diff.max()), "median_abs_diff": float(np.median(diff)), "n": len(diff)}
    width = min(reference.shape[1], other.shape[1])
    a = reference[:, :width] / np.linalg.norm(reference[:, :width], axis=1, keepdims=True)
    b = other[:, :width] / np.linalg.norm(other[:, :width], axis=1, keepdims=True)
    cos = np.sum(a * b, axis=1)
    return {"min_cosine": float(cos.min()), "median_cosine": float(np.median(cos)), "n": len(cos)}


def describe_agreement(agree: dict[str, float]) -> str:
    """One line for an :func:`agreement` dict, e.g. ``min cosine 0.99999994, median 1.00000000 over 256 inputs``."""
    if "min_cosine" in agree:
        return f"min cosine {agree['min_cosine']:.8f}, median {agree['median_cosine']:.8f} over {agree['n']} inputs"
    return f"max |Δ| {agree['max_abs_diff']:.2e}, median {agree['median_abs_diff']:.2e} over {agree['n']} inputs"


@dataclass
class Comparison:
    """The comparison table: one row per (task, configuration), plus per-configuration agreement.

    Attributes:
        reference: the reference configuration's label.
        rows: per task and configuration: ``task``, ``config``, ``main_score``, ``delta`` (None when either side
            has no score), ``tolerance``, ``passed``.
        agreement: per configuration, its outputs' :func:`agreement` with the reference's on the sample.
        path: where :func:`save` wrote ``compare.json`` (None before).
        cache: the output cache the configurations ran with (closed), None without one.
    """

    reference: str
    rows: list[dict[str, Any]]
    agreement: dict[str, dict[str, float] | None]
    path: Path | None = field(default=None, compare=False)
    cache: Any = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """True when every configuration is within its tolerance on every task."""
        return all(r["passed"] for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        """The comparison as a JSON-able dict (``compare.json``)."""
        return {"reference": self.reference, "passed": self.passed, "rows": self.rows, "agreement": self.agreement}


def compare_results(
    results: list[ConfigResult], reference: ConfigResult, fp32: float, sixteen_bit: float, kind: str = "encoder"
) -> Comparison:
    """Score differences to the reference, pass/fail against tolerances, and sample agreement
    (cosine for vectors: embeddings, token vectors; |Δ| for every other kind's outputs)."""
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
    from ..models.kinds import get_kind

    cosine = get_kind(kind).cosine
    agree = {res.config.label: agreement(reference.outputs, res.outputs, cosine) for res in results}
    return Comparison(reference.config.label, rows, agree)


def read_run_dir(path: str | Path) -> ConfigResult:
    """A finished run's scores: a ``run``'s from its ``summary.json``, another command's from each task's
    ``results.json`` (:func:`~vllm_eval.measure.runfiles.read_task_runs`); its configuration named from them.

    Raises:
        UsageError: neither file there, or a damaged one (file, field and reason named).
    """
    from .runfiles import main_metric, read_summary, read_task_runs

    summary_path = Path(path) / "summary.json"
    if not summary_path.is_file():
        tasks = read_task_runs(path)
        if not tasks:
            raise UsageError(f"{str(path)!r} is not a run directory (no summary.json, no results.json)")
        first = next(iter(tasks.values()))[0]
        engine = first.get("engine_kwargs") if isinstance(first.get("engine_kwargs"), dict) else {}
        dtype = engine.get("dtype")
        scores = {task: float(rec["metrics"][main_metric(rec["metrics"])]) for task, (rec, _) in tasks.items()}
        label = f"{first.get('backend') or 'run'}[{Path(path).name}]"
        return ConfigResult(Config(label, dtype and str(dtype).removeprefix("torch.")), scores)
    summary = read_summary(summary_path)
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
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"compared with {comparison.reference}"))
    tested = any("significance" in r for r in comparison.rows)
    extra = ("b - a [95 % interval]", "p") if tested else ()
    for col in ("task", "configuration", "main score", "|Δ|", "tolerance", "result", *extra):
        table.add_column(col, justify="left" if col in ("task", "configuration", "result") else "right")
    for r in comparison.rows:
        delta = "-" if r["delta"] is None else f"{r['delta']:.2e}"
        result = "reference" if r["config"] == comparison.reference else ("pass" if r["passed"] else "FAIL")
        cells = [r["task"], r["config"], f"{r['main_score']:.6f}", delta, f"{r['tolerance']:.0e}", result]
        cells += _significance_cells(r.get("significance")) if tested else ()
        table.add_row(*(escape(c) for c in cells))  # a run's label is `backend[folder]`: not markup
    console = Console(width=max(140 if tested else 100, Console().width))
    console.print(table)
    for label, agree in comparison.agreement.items():
        if agree and label != comparison.reference:
            console.print(f"{label} against {comparison.reference}: {describe_agreement(agree)}")


def _significance_cells(diff: dict[str, Any] | None) -> list[str]:
    """A row's paired bootstrap against the reference run: the difference with its interval (``*`` where the
    interval leaves out 0), and the p-value; the note where there is none."""
    if not diff:
        return ["", ""]
    if "note" in diff:
        return [diff["note"], "-"]
    mark = " *" if diff["significant"] else ""
    return [f"{diff['delta']:+.4f} [{diff['low']:+.4f}, {diff['high']:+.4f}]{mark}", f"{diff['p_value']:.3g}"]


def add_significance(comparison: Comparison, runs: list[str | Path], labels: list[str]) -> None:
    """Each run after the first against the first, task by task: the paired bootstrap of their per-unit scores
    (:func:`vllm_eval.measure.significance.compare_runs`) in each row's ``significance``; ``labels``: the runs'
    configuration labels (:func:`read_run_dir`'s)."""
    from .runfiles import main_metric, read_summary, read_task_runs
    from .significance import compare_runs

    summary = Path(runs[0]) / "summary.json"
    if summary.is_file():
        rows = read_summary(summary).get("scores") or []
        tasks = {r["task"]: str(r.get("main_score_name") or "main score") for r in rows}
    else:
        tasks = {task: main_metric(rec["metrics"]) for task, (rec, _) in read_task_runs(runs[0]).items()}
    for label, path in zip(labels[1:], runs[1:], strict=True):
        table = compare_runs(runs[0], path, tasks=tasks)
        for row in comparison.rows:
            if row["config"] == label and row["task"] in table:
                row["significance"] = table[row["task"]]


def save(comparison: Comparison, output_dir: str | Path) -> Path:
    """Write ``compare.json`` into ``output_dir``; returns its path (also kept in ``comparison.path``)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compare.json"
    path.write_text(json.dumps(comparison.to_json(), indent=2, default=str) + "\n")
    comparison.path = path
    return path
