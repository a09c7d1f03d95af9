"""Time to result for a whole task suite: ``vllm-eval bench --suite``.

Each backend runs the same suite in a fresh process of its own, timed from process start to results
on disk, so engine start, imports, data loading and mteb's evaluation all count, as they do for a
user:

* ``vllm``      — ours, as users run it: ``vllm-eval run --no-cache`` (default layout, no output cache);
* ``st``        — ``mteb.evaluate(SentenceTransformer(model), tasks)``, mteb's reference path;
* ``mteb-vllm`` — ``mteb.evaluate(VllmEncoderWrapper(...), tasks)``, mteb's own vLLM wrapper with the
  same engine options, in an environment without the settings our engines make.

Suites: ``offline`` (the packaged offline tasks, see :mod:`vllm_eval.tasks.offline`),
``synthetic`` (one retrieval task in BEIR layout built from the model's own vocabulary, by default
200,000 documents and 1,000 queries: see :func:`build_synthetic_retrieval`), or any mteb benchmark
name, run as its offline replica shaped by mteb's descriptive statistics (see
:mod:`vllm_eval.tasks.shaped`). Every run writes its timeline (:mod:`vllm_eval.utils.timeline`): the record
keeps each backend's seconds per phase. The main scores of
every backend are compared with ours (``max_delta``): the timings count only if the backends
computed the same thing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError

SUITES = ("offline", "synthetic")
SUITE_BACKENDS = ("vllm", "st", "mteb-vllm")


@dataclass
class SuiteRecord:
    """One backend's run of a suite. ``seconds``: process start to exit, wall clock."""

    backend: str
    seconds: float
    scores: dict[str, float]
    returncode: int
    #: Largest |main score - ours| over the suite's tasks (0 for ours; None when a side has no scores).
    max_delta: float | None = None
    #: Seconds ours waited for its engine (from the run's results); None for the peers.
    engine_start_s: float | None = None
    #: The run's combined stdout and stderr.
    log: str = ""
    #: Seconds per timeline phase (:func:`vllm_eval.utils.timeline.phase_totals`), ``wall`` included.
    phases: dict[str, float] | None = None


def build_synthetic_retrieval(
    directory: str | Path, model: str, n_docs: int = 200_000, n_queries: int = 1_000, seed: int = 0
) -> Path:
    """Write a retrieval task in BEIR layout (``corpus.jsonl``, ``queries.jsonl``, ``qrels.tsv``).

    Documents are 32–160 tokens of the model tokenizer's single-token words
    (:func:`vllm_eval.measure.bench.make_texts`); each query is 8 consecutive words of one document, its
    only relevant one. Built once per ``(model's tokenizer, n_docs, n_queries, seed)`` into
    ``directory`` (reused when its ``meta.json`` matches).

    Returns:
        the directory, ready for ``vllm-eval run --data``.
    """
    import numpy as np
    from transformers import AutoTokenizer

    from .bench import make_texts

    out = Path(directory)
    meta = {"n_docs": n_docs, "n_queries": n_queries, "seed": seed, "tokenizer": str(model)}
    if (out / "meta.json").is_file() and json.loads((out / "meta.json").read_text()) == meta:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(model)
    docs, _ = make_texts(tokenizer, n_docs, "mixed:32-160", seed)
    rng = np.random.default_rng(seed + 1)
    picked = rng.choice(n_docs, size=min(n_queries, n_docs), replace=False)
    with open(out / "corpus.jsonl", "w") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"_id": f"d{i}", "text": text}) + "\n")
    with open(out / "queries.jsonl", "w") as f, open(out / "qrels.tsv", "w") as g:
        g.write("query-id\tcorpus-id\tscore\n")
        for j, i in enumerate(picked):
            words = docs[i].split()
            start = int(rng.integers(0, max(len(words) - 8, 0) + 1))
            f.write(json.dumps({"_id": f"q{j}", "text": " ".join(words[start : start + 8])}) + "\n")
            g.write(f"q{j}\td{i}\t1\n")
    (out / "meta.json").write_text(json.dumps(meta) + "\n")
    return out


def check_suite(suite: str, fraction: float = 1.0) -> None:
    """Refuse a suite that is neither ``offline``, ``synthetic`` nor an mteb benchmark, and a fraction
    outside (0, 1], before any model loads.

    Raises:
        UsageError: naming the suite (with close benchmark names) or the fraction.
    """
    import difflib

    if not 0 < fraction <= 1:
        raise UsageError(f"--fraction must be in (0, 1], got {fraction}")
    if suite in SUITES:
        return
    import mteb

    names = [b.name for b in mteb.get_benchmarks()]
    if suite not in names:
        close = difflib.get_close_matches(suite, names, n=3, cutoff=0.5)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise UsageError(f"--suite {suite!r} is not offline, synthetic or an mteb benchmark{hint}")


def _engine_flags(engine_kwargs: dict[str, Any]) -> list[str]:
    """vLLM engine options as ``vllm-eval run`` flags (``--name value``; booleans ``--name``/``--no-name``)."""
    flags: list[str] = []
    for key, value in engine_kwargs.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(name if value else "--no-" + key.replace("_", "-"))
        else:
            flags += [name, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return flags


def _command(backend: str, model: str, task_args: list[str], out: Path, dtype: str | None, engine: dict) -> list[str]:
    if backend == "vllm":
        cmd = [sys.executable, "-m", "vllm_eval", "run", "--model", model, *task_args, "--output-dir", str(out)]
        cmd += ["--no-cache", "--no-progress", *(["--dtype", dtype] if dtype else []), *_engine_flags(engine)]
        return cmd
    return [
        sys.executable,
        "-m",
        "vllm_eval.measure.suite",
        backend,
        "--model",
        model,
        *task_args,
        "--output-dir",
        str(out),
        *(["--dtype", dtype] if dtype else []),
        "--engine",
        json.dumps(engine),
    ]


def _scores(out: Path) -> tuple[dict[str, float], float | None, dict[str, float] | None]:
    """A finished run's main scores (as ``compare --runs`` reads them), its engine start seconds and
    its seconds per timeline phase."""
    from ..utils.timeline import phase_totals
    from .compare import read_run_dir
    from .runfiles import read_summary

    if not (out / "summary.json").is_file():
        return {}, None, None
    scores = read_run_dir(out).scores
    summary = read_summary(out / "summary.json")
    return scores, summary.get("engine_start_seconds"), phase_totals(summary.get("timeline")) or None


def run_suite(
    model: str,
    suite: str = "offline",
    *,
    backends: Sequence[str] = SUITE_BACKENDS,
    output_dir: str | Path,
    dtype: str | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    replicas: dict[str, int] | None = None,
    n_docs: int = 200_000,
    n_queries: int = 1_000,
    fraction: float = 1.0,
) -> list[SuiteRecord]:
    """Run ``suite`` once per backend, each in a fresh process; time each; compare scores with ours.

    Writes ``<output_dir>/<backend>/`` (each run's results and ``log.txt``) and
    ``<output_dir>/suite.json``. ``engine_kwargs`` (vLLM ``EngineArgs``) go to ``vllm`` and ``mteb-vllm``,
    ``replicas`` (``data_parallel_size``, ``replicas_per_gpu``) to ``vllm``.

    ``suite``: ``offline``, ``synthetic``, or an mteb benchmark name, run as its offline replica
    (:func:`vllm_eval.tasks.shaped.build_replica`, counts scaled by ``fraction``).

    Raises:
        UsageError: an unknown suite (benchmark) or backend.
    """
    from ..utils.modelinfo import ModelRef

    bad = [b for b in backends if b not in SUITE_BACKENDS]
    if bad:
        raise UsageError(f"--suite runs {', '.join(SUITE_BACKENDS)}; not {', '.join(bad)}")
    model = ModelRef.resolve(model).path
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if suite == "synthetic":
        data = build_synthetic_retrieval(out / "synthetic-data", model, n_docs, n_queries)
        task_args = ["--data", str(data)]
    elif suite == "offline":
        from ..tasks import offline_tasks

        task_args = ["--tasks", *offline_tasks()]
    else:
        from ..tasks.shaped import build_replica

        data = build_replica(out / "replica-data", suite, model, fraction)
        task_args = ["--data", str(data)]
    engine = dict(engine_kwargs or {})
    from ..engine.procenv import user_environment

    env = user_environment()  # each process makes its own settings (or, the peers, none)
    records: list[SuiteRecord] = []
    for backend in backends:
        run_dir = out / backend
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").unlink(missing_ok=True)  # a failed run must not show an older run's scores
        layout = {k: v for k, v in (replicas or {}).items() if v != 1} if backend == "vllm" else {}
        cmd = _command(backend, model, task_args, run_dir, dtype, {**engine, **layout})
        print(f"[suite] {backend}: {' '.join(cmd)}", flush=True)
        started = time.perf_counter()
        with open(run_dir / "log.txt", "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
        seconds = round(time.perf_counter() - started, 2)
        scores, engine_start, phases = _scores(run_dir)
        log = str(run_dir / "log.txt")
        records.append(SuiteRecord(backend, seconds, scores, proc.returncode, None, engine_start, log, phases))
        print(f"[suite] {backend}: {seconds:.1f} s, exit {proc.returncode}, {len(scores)} task score(s)", flush=True)
    ours = next((r for r in records if r.backend == "vllm"), None)
    for r in records if ours is not None else ():
        common = set(r.scores) & set(ours.scores)
        r.max_delta = max((abs(r.scores[t] - ours.scores[t]) for t in common), default=None)
    payload = {
        "model": model,
        "suite": suite,
        "tasks": task_args,
        "dtype": dtype,
        "engine_kwargs": engine,
        "replicas": replicas,
        "n_docs": n_docs if suite == "synthetic" else None,
        "n_queries": n_queries if suite == "synthetic" else None,
        "fraction": fraction if suite not in SUITES else None,
        "records": [asdict(r) for r in records],
    }
    (out / "suite.json").write_text(json.dumps(payload, indent=2) + "\n")
    return records


def print_suite(records: Sequence[SuiteRecord], suite: str) -> None:
    """The suite's table: each backend's seconds, engine start, ratio to ours, tasks, max |Δ main score|, exit."""
    from rich.console import Console
    from rich.table import Table

    from ..models.backends import DEFAULT_BACKEND

    table = Table(title=f"suite {suite}: process start to results written")
    for col in (
        "backend",
        "seconds",
        "engine start s",
        f"seconds / {DEFAULT_BACKEND}'s",
        "tasks",
        "max |Δ main score|",
        "exit",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    ours = next((r.seconds for r in records if r.backend == DEFAULT_BACKEND), None)
    for r in records:
        table.add_row(
            r.backend,
            f"{r.seconds:.1f}",
            "-" if r.engine_start_s is None else f"{r.engine_start_s:.1f}",
            "-" if not ours else f"{r.seconds / ours:.2f}x",
            str(len(r.scores)),
            "-" if r.max_delta is None else f"{r.max_delta:.2e}",
            str(r.returncode),
        )
    Console(width=max(100, Console().width)).print(table)


def print_phases(records: Sequence[SuiteRecord]) -> None:
    """Each backend's seconds per timeline phase, side by side (overlapping phases count in full)."""
    from rich.console import Console
    from rich.table import Table

    from ..utils.timeline import PHASES

    timed = [r for r in records if r.phases]
    if not timed:
        return
    table = Table(title="seconds per phase (from each run's timeline; phases may overlap)")
    table.add_column("phase")
    for r in timed:
        table.add_column(r.backend, justify="right")
    for name in (*PHASES, "wall"):
        if any(name in r.phases for r in timed):
            table.add_row(name, *("-" if name not in r.phases else f"{r.phases[name]:.1f}" for r in timed))
    Console(width=max(100, Console().width)).print(table)


def _peer_model(backend: str, model: str, dtype: str | None, engine: dict[str, Any]) -> Any:
    if backend == "st":
        import torch
        from sentence_transformers import SentenceTransformer

        dtypes = {"float": torch.float32, "float32": torch.float32, "half": torch.float16}
        dtypes.update(float16=torch.float16, bfloat16=torch.bfloat16)
        return SentenceTransformer(model, model_kwargs={"torch_dtype": dtypes[dtype]} if dtype in dtypes else None)
    from ..engine.args import on_cpu
    from .bench import mteb_vllm_wrapper

    return mteb_vllm_wrapper(model, dtype or ("float32" if on_cpu() else "auto"), engine)


def _timed_encode(model: Any) -> None:
    """Put each of ``model.encode``'s calls on the timeline as an ``encode`` phase."""
    from ..utils.timeline import current

    inner = model.encode

    def encode(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return inner(*args, **kwargs)
        finally:
            current().encoded(start, time.time())

    model.encode = encode


def _peer_main(argv: list[str] | None = None) -> int:
    """``python -m vllm_eval.measure.suite {st,mteb-vllm} --model M (--tasks ... | --data DIR) --output-dir D``:
    a peer's run of a suite through ``mteb.evaluate``, task by task, each task's data loaded just before
    it (as ``mteb.evaluate`` does); writes ``D/summary.json`` (task, main score, timeline)."""
    from ..utils.timeline import current, phase, process_start

    entered = time.time()
    current().add("interpreter", process_start(), entered)
    with phase("imports"):
        import mteb
        from mteb.cache import ResultCache

    parser = argparse.ArgumentParser(prog="python -m vllm_eval.measure.suite")
    parser.add_argument("backend", choices=[b for b in SUITE_BACKENDS if b != "vllm"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--engine", default="{}")
    args = parser.parse_args(argv)
    with phase("tasks"):
        if args.data:
            from ..tasks.owntasks import own_mteb_tasks

            tasks = own_mteb_tasks(args.data)
        else:
            from ..tasks import get_tasks

            tasks = get_tasks(args.tasks)
    with phase("engine", detail=args.backend):
        model = _peer_model(args.backend, args.model, args.dtype, json.loads(args.engine))
    _timed_encode(model)
    out = Path(args.output_dir)
    cache = ResultCache(out / "mteb")
    scores = []
    for task in tasks:
        name = task.metadata.name
        with phase("load", task=name):
            task.load_data()
        current().task = name
        with phase("task", task=name):
            result = mteb.evaluate(model, [task], cache=cache, overwrite_strategy="always", show_progress_bar=False)
        current().task = None
        task.unload_data()
        scores.append({"task": name, "main_score": float(result.task_results[0].get_score())})
    summary = {"backend": args.backend, "scores": scores, "timeline": current().as_json()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_peer_main())
