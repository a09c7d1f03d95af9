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

Run again with the same output folder and settings, a suite resumes where it stopped: finished backends are read
back, a stopped one runs again reading its finished tasks back, and its seconds are summed over its attempts
(:mod:`vllm_eval.measure.resume`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError

SUITES = ("offline", "synthetic")
SUITE_BACKENDS = ("vllm", "st", "mteb-vllm")
#: Attempts run again at once after one that stopped because its engine stalled (exit 3, engine.watchdog).
STALL_RETRIES = 2


@dataclass
class SuiteRecord:
    """One backend's run of a suite. ``seconds``: process start to exit, wall clock, summed over its attempts."""

    backend: str
    seconds: float
    scores: dict[str, float]
    #: The last attempt's exit status (-1: unknown, the suite did not see it exit).
    returncode: int
    #: Largest |main score - ours| over the suite's tasks (0 for ours; None when a side has no scores).
    max_delta: float | None = None
    #: Seconds ours waited for its engine (from the run's results); None for the peers.
    engine_start_s: float | None = None
    #: The run's combined stdout and stderr.
    log: str = ""
    #: Seconds per timeline phase (:func:`vllm_eval.utils.timeline.phase_totals`), ``wall`` included; summed over
    #: the attempts.
    phases: dict[str, float] | None = None
    #: Starts of the backend's process this result took (more than 1: the suite was resumed); ``seconds`` and
    #: ``engine_start_s`` are sums over them, the gaps between them not counted.
    attempts: int = 1
    #: Each attempt's seconds, process start to exit.
    attempt_seconds: list[float] | None = None
    #: Why the last attempt stopped before its end: ``"time-limit"``, ``"interrupted"``, ``"lost"``; None when it ran
    #: to its end.
    stopped: str | None = None
    #: Task -> ``computed`` or ``reused`` (read back from an earlier attempt) in the last attempt (or ``failed: ...``).
    task_status: dict[str, str] | None = None
    #: Where ours ran, from its ``summary.json``: ``gpus``, ``replicas_per_gpu``, ``tensor_parallel_size`` ... (None
    #: for the peers, or a run without one).
    layout: dict[str, Any] | None = None


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
        # --no-cache: no output cache (every embedding computed); finished tasks' results are read back on a resume.
        cmd += ["--no-cache", "--overwrite-strategy", "only-missing", "--no-progress"]
        cmd += [*(["--dtype", dtype] if dtype else []), *_engine_flags(engine)]
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


def _record(backend: str, run_dir: Path, attempts: list[Any]) -> SuiteRecord:
    """A backend's record from its attempts: the last one's scores and task statuses, times summed over all."""
    from .compare import read_run_dir
    from .resume import totals
    from .runfiles import read_summary

    scores: dict[str, float] = {}
    status: dict[str, str] | None = None
    layout = None
    if (run_dir / "summary.json").is_file():
        scores = read_run_dir(run_dir).scores
        summary = read_summary(run_dir / "summary.json")
        rows = summary.get("scores") or []
        status = {r["task"]: str(r.get("status") or "computed") for r in rows}
        layout = summary.get("layout") if isinstance(summary.get("layout"), dict) else None
    times = totals(run_dir, attempts)
    last = attempts[-1]
    return SuiteRecord(
        backend,
        times["seconds"],
        scores,
        -1 if last.returncode is None else last.returncode,
        None,
        times["engine_start_s"],
        str(run_dir / "log.txt"),
        times["phases"],
        len(attempts),
        times["attempt_seconds"],
        last.stopped,
        status,
        layout,
    )


def _task_args(suite: str, out: Path) -> list[str]:
    """The suite's tasks as ``vllm-eval run`` flags (a data suite's folder is built later, :func:`_build_data`)."""
    if suite == "offline":
        from ..tasks import offline_tasks

        return ["--tasks", *offline_tasks()]
    return ["--data", str(out / ("synthetic-data" if suite == "synthetic" else "replica-data"))]


def _build_data(suite: str, out: Path, model: str, n_docs: int, n_queries: int, fraction: float) -> None:
    if suite == "synthetic":
        build_synthetic_retrieval(out / "synthetic-data", model, n_docs, n_queries)
    elif suite != "offline":
        from ..tasks.shaped import build_replica

        build_replica(out / "replica-data", suite, model, fraction)


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
    restart: bool = False,
    time_limit: float | None = None,
) -> list[SuiteRecord]:
    """Run ``suite`` once per backend, each in a fresh process; time each; compare scores with ours.

    Writes ``<output_dir>/<backend>/`` (each run's results and ``log.txt``, its attempts under ``attempts/``) and
    ``<output_dir>/suite.json``. ``engine_kwargs`` (vLLM ``EngineArgs``) go to ``vllm`` and ``mteb-vllm``,
    ``replicas`` (``data_parallel_size``, ``replicas_per_gpu``) to ``vllm``.

    ``suite``: ``offline``, ``synthetic``, or an mteb benchmark name, run as its offline replica
    (:func:`vllm_eval.tasks.shaped.build_replica`, counts scaled by ``fraction``).

    Resumes (:mod:`vllm_eval.measure.resume`): run again with the same ``output_dir`` and settings, a backend that
    finished is read back, not run; one that was stopped runs again, reading its finished tasks back; each record's
    ``seconds`` is the sum over its attempts. The list of backends may change between runs. ``restart``: remove the
    earlier runs in ``output_dir`` first. ``time_limit``: seconds each backend's attempt may take; one that reaches it
    is stopped (SIGTERM, then SIGKILL), recorded (``stopped="time-limit"``) and the suite stops there (the backends
    after it are not started): running it again resumes. An attempt whose engine stalled (:mod:`vllm_eval.engine.
    watchdog`, exit 3) is resumed at once, up to :data:`STALL_RETRIES` times.

    Returns:
        One record per backend asked for that has run (all of them, unless one was stopped at ``time_limit``).

    Raises:
        UsageError: an unknown suite (benchmark) or backend, a time limit not above 0, settings that differ from the
            run already in ``output_dir`` (the setting named), a backend's attempt that still runs.
    """
    from ..utils.modelinfo import ModelRef
    from .resume import prepare_folder

    bad = [b for b in backends if b not in SUITE_BACKENDS]
    if bad:
        raise UsageError(f"--suite runs {', '.join(SUITE_BACKENDS)}; not {', '.join(bad)}")
    if time_limit is not None and not time_limit > 0:
        raise UsageError(f"--time-limit must be above 0 seconds, got {time_limit}")
    model = ModelRef.resolve(model).path
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    task_args = _task_args(suite, out)
    engine = dict(engine_kwargs or {})
    settings = {
        "model": model,
        "suite": suite,
        "tasks": task_args,
        "dtype": dtype,
        "engine_kwargs": engine,
        "replicas": replicas,
        "n_docs": n_docs if suite == "synthetic" else None,
        "n_queries": n_queries if suite == "synthetic" else None,
        "fraction": fraction if suite not in SUITES else None,
    }
    prepare_folder(out, settings, backends, restart=restart, every=SUITE_BACKENDS)
    _build_data(suite, out, model, n_docs, n_queries, fraction)
    records: list[SuiteRecord] = []
    stop = False
    for backend in backends:
        layout = {k: v for k, v in (replicas or {}).items() if v is not None} if backend == "vllm" else {}
        cmd = _command(backend, model, task_args, out / backend, dtype, {**engine, **layout})
        try:
            record = _run_backend(backend, out / backend, cmd, time_limit, run=not stop)
        finally:
            _write(out, settings, records)
        if record is not None:
            records.append(record)
            stop = stop or record.stopped == "time-limit"
    ours = next((r for r in records if r.backend == "vllm"), None)
    for r in records if ours is not None else ():
        common = set(r.scores) & set(ours.scores)
        r.max_delta = max((abs(r.scores[t] - ours.scores[t]) for t in common), default=None)
    _write(out, settings, records)
    return records


def _run_backend(backend: str, run_dir: Path, cmd: list[str], time_limit: float | None, run: bool) -> Any:
    """The backend's record: read back when it finished before, else after one more attempt (when ``run``; None
    when not and it never ran)."""
    from ..engine.procenv import user_environment
    from ..engine.watchdog import EngineStalled
    from .resume import finished, read_attempts, run_attempt

    attempts = read_attempts(run_dir)
    if finished(run_dir, attempts) or not run:
        if not attempts:
            return None
        record = _record(backend, run_dir, attempts)
        many = f" over {len(attempts)} attempts" if len(attempts) > 1 else ""
        state = "finished before" if finished(run_dir, attempts) else "not started (the suite stopped)"
        print(f"[suite] {backend}: {state}, {record.seconds:.1f} s{many}; not run again", flush=True)
        return record
    run_dir.mkdir(parents=True, exist_ok=True)
    env = user_environment()  # each process makes its own settings (or, the peers, none)
    for stalls in range(STALL_RETRIES + 1):
        again = f" (attempt {attempts[-1].attempt + 1}, resuming)" if attempts else ""
        print(f"[suite] {backend}{again}: {' '.join(cmd)}", flush=True)
        attempt = run_attempt(cmd, run_dir, env, attempts, time_limit)
        attempts = read_attempts(run_dir)
        if attempt.returncode != EngineStalled.exit_code or stalls == STALL_RETRIES:
            break
        print(f"[suite] {backend}: its engine stalled after {attempt.seconds:.1f} s (exit 3); resuming", flush=True)
    record = _record(backend, run_dir, attempts)
    stopped = f", stopped at --time-limit {time_limit:g} s" if attempt.stopped == "time-limit" else ""
    many = f" ({record.seconds:.1f} s over {len(attempts)} attempts)" if len(attempts) > 1 else ""
    print(
        f"[suite] {backend}: {attempt.seconds:.1f} s{many}, exit {attempt.returncode}{stopped}, "
        f"{len(record.scores)} task score(s)",
        flush=True,
    )
    return record


def _write(out: Path, settings: dict[str, Any], records: list[SuiteRecord]) -> None:
    from .resume import write_json

    write_json(out / "suite.json", {**settings, "records": [asdict(r) for r in records]})


def suite_problem(
    records: Sequence[SuiteRecord], output_dir: str | Path, time_limit: float | None = None
) -> str | None:
    """What keeps the suite from being complete, in one line for the user (None when every backend finished):
    a backend stopped at the time limit (run the same command again to resume), or backends that failed."""
    stopped = next((r for r in records if r.stopped == "time-limit"), None)
    if stopped is not None:
        limit = f" {time_limit:g} s" if time_limit else ""
        return (
            f"--suite: {stopped.backend} stopped at --time-limit{limit} (attempt {stopped.attempts}, "
            f"{len(stopped.scores)} task(s) done); run the same command again to resume"
        )
    failed = [r.backend for r in records if r.returncode != 0]
    if failed:
        return f"--suite: {', '.join(failed)} failed; see {output_dir}/<backend>/log.txt"
    return None


def print_suite(records: Sequence[SuiteRecord], suite: str) -> None:
    """The suite's table: each backend's seconds, engine start, ratio to ours, tasks, max |Δ main score|, exit; when
    a backend took more than one attempt, its attempts and their seconds (the seconds are their sum)."""
    from rich.console import Console
    from rich.table import Table

    from ..models.backends import DEFAULT_BACKEND

    resumed = any(r.attempts > 1 for r in records)
    title = f"suite {suite}: process start to results written"
    table = Table(title=title + ("; seconds summed over a backend's attempts" if resumed else ""))
    for col in (
        "backend",
        "seconds",
        "engine start s",
        f"seconds / {DEFAULT_BACKEND}'s",
        "tasks",
        "max |Δ main score|",
        "exit",
        *(["attempts"] if resumed else []),
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    ours = next((r.seconds for r in records if r.backend == DEFAULT_BACKEND), None)
    for r in records:
        each = " + ".join(f"{s:.1f}" for s in r.attempt_seconds or [])
        table.add_row(
            r.backend,
            f"{r.seconds:.1f}",
            "-" if r.engine_start_s is None else f"{r.engine_start_s:.1f}",
            "-" if not ours else f"{r.seconds / ours:.2f}x",
            str(len(r.scores)),
            "-" if r.max_delta is None else f"{r.max_delta:.2e}",
            str(r.returncode) + (f" ({r.stopped})" if r.stopped else ""),
            *([f"{r.attempts}: {each} s" if r.attempts > 1 else "1"] if resumed else []),
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
        st = SentenceTransformer(model, model_kwargs={"torch_dtype": dtypes[dtype]} if dtype in dtypes else None)
        from mteb import SentenceTransformerEncoderWrapper

        # What mteb.evaluate wraps it in on every call; done once, its metadata names the results to read back.
        return SentenceTransformerEncoderWrapper(st)
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


def _peer_reused(cache: Any, task: Any, model: Any) -> bool:
    """Whether ``task``'s result is in ``cache`` already, complete (mteb's ``only-missing`` reads it back). One that
    mteb cannot read back into a finite score is moved aside to ``<Task>.json.damaged`` and the task runs again."""
    from ..evaluation.results import result_damage

    path = cache.get_task_result_path(task.metadata.name, model.mteb_model_meta)
    if not path.is_file():
        return False
    reason = result_damage(path)
    if reason is not None:
        path.replace(path.with_name(path.name + ".damaged"))
        print(f"{task.metadata.name}: {path} cannot be read back ({reason}); moved aside, the task runs again")
        return False
    from mteb.results import TaskResult

    return not TaskResult.from_disk(path).get_missing_evaluations(task)


def _peer_main(argv: list[str] | None = None) -> int:
    """``python -m vllm_eval.measure.suite {st,mteb-vllm} --model M (--tasks ... | --data DIR) --output-dir D``:
    a peer's run of a suite through ``mteb.evaluate``, task by task, each task's data loaded just before
    it (as ``mteb.evaluate`` does); writes ``D/summary.json`` after every task (task, main score, ``computed`` or
    ``reused``, timeline). A task whose result is under ``D/mteb`` already is read back, not run (a resumed suite).
    SIGTERM exits 143 (a suite's ``--time-limit``)."""
    import signal

    from ..utils.timeline import current, phase, process_start
    from .resume import write_json

    entered = time.time()
    current().add("interpreter", process_start(), entered)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
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
    _timed_encode(model.model if args.backend == "st" else model)  # the SentenceTransformer's own calls
    out = Path(args.output_dir)
    cache = ResultCache(out / "mteb")
    scores: list[dict[str, Any]] = []
    for task in tasks:
        name = task.metadata.name
        reused = _peer_reused(cache, task, model)
        if not reused:
            with phase("load", task=name):
                task.load_data()
        current().task = name
        with phase("task", task=name):
            result = mteb.evaluate(
                model, [task], cache=cache, overwrite_strategy="only-missing", show_progress_bar=False
            )
        current().task = None
        if not reused:
            task.unload_data()
        score = float(result.task_results[0].get_score())
        scores.append({"task": name, "main_score": score, "status": "reused" if reused else "computed"})
        with phase("write", task=name):  # after every task: an attempt stopped later keeps its timeline
            write_json(out / "summary.json", dict(backend=args.backend, scores=scores, timeline=current().as_json()))
    write_json(out / "summary.json", dict(backend=args.backend, scores=scores, timeline=current().as_json()))
    return 0


if __name__ == "__main__":
    sys.exit(_peer_main())
