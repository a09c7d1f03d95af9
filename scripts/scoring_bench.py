"""Time mteb's evaluation of every task of a benchmark replica with an encoder that answers at once
(vllm_eval.testing.instant): what is left is loading, searching and scoring. Runs each task through
``mteb.evaluate`` once per path — ``mteb`` (mteb's search wrapper and scoring), ``search`` (this package's
search, mteb's scoring: ``--scoring mteb``), ``fast`` (this package's search and scoring: the default) — and
checks that ``search`` and ``fast``, which score the same search results, report the same metrics.

    python3 scripts/scoring_bench.py --fraction 0.05 [--dim 384] [--tasks A B] [--paths mteb search fast]
        [--replica DIR] [--tokenizer DIR] [--workers N] [--profile OUT.prof] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time


def _same(a, b, tol: float) -> list[str]:
    """Metric names whose values differ (beyond ``tol``) between two score dicts (nested dicts and lists walked)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{k}: missing" for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            out += [f"{k}.{x}" for x in _same(a[k], b[k], tol)]
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return ["length"]
        return [x for i, (p, q) in enumerate(zip(a, b)) for x in _same(p, q, tol)]
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return []
        return [] if abs(a - b) <= tol else [f"{a!r} != {b!r}"]
    return [] if a == b else [f"{a!r} != {b!r}"]


def _task_row(args, where: str, meta) -> dict:
    """One task through every path: seconds per path, and whether ``search`` and ``fast`` agree."""
    import mteb

    from vllm_eval.evaluation.scoring import fast_scoring
    from vllm_eval.tasks.shaped import replica_tasks
    from vllm_eval.testing.instant import InstantEncoder, InstantSearchEncoder

    name = meta.name
    row, scores = {"task": name, "type": meta.type}, {}
    for path in args.paths:
        model = InstantEncoder(args.dim) if path == "mteb" else InstantSearchEncoder(args.dim)
        one = next(t for t in replica_tasks(where) if t.metadata.name == name)
        profiler = None
        if args.profile and path == args.paths[-1]:
            import cProfile

            profiler = cProfile.Profile()
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        with fast_scoring(path == "fast"):
            result = mteb.evaluate(model, [one], cache=None, co2_tracker=False, show_progress_bar=False,
                                   encode_kwargs={"show_progress_bar": False})  # fmt: skip
        if profiler:
            profiler.disable()
            profiler.dump_stats(f"{args.profile}.{name}")
        row[path] = round(time.perf_counter() - start, 3)
        scores[path] = result.task_results[0].scores
    if "fast" in scores and len(scores) > 1:
        diff = _same(scores.get("search", scores.get("mteb")), scores["fast"], args.tol)
        row["same"] = not diff
        if diff:
            row["differs"] = diff[:5]
    print(json.dumps(row), flush=True)
    return row


def _size(where: str, name: str) -> int:
    from pathlib import Path

    return sum(f.stat().st_size for f in Path(where, name).rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", default="MTEB(eng, v2)")
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--replica", default=None, help="replica directory (default /tmp/replica-<fraction>)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--tokenizer", default=None, help="whose words make the replica (default: all-MiniLM-L6-v2)")
    parser.add_argument("--tasks", nargs="*", default=None)
    parser.add_argument("--paths", nargs="+", default=["mteb", "search", "fast"], choices=["mteb", "search", "fast"])
    parser.add_argument("--profile", default=None, help="write a cProfile of the last path here")
    parser.add_argument("--json", default=None)
    parser.add_argument("--tol", type=float, default=1e-9)
    parser.add_argument("--workers", type=int, default=1, help="tasks evaluated at once, each in a process")
    args = parser.parse_args()

    from vllm_eval.tasks.shaped import build_replica, replica_tasks
    from vllm_eval.utils.modelinfo import packaged_model_path

    t0 = time.perf_counter()
    where = args.replica or f"/tmp/replica-{args.fraction:g}"
    build_replica(where, args.benchmark, args.tokenizer or packaged_model_path(), args.fraction)
    print(f"replica {where}: {time.perf_counter() - t0:.1f} s", flush=True)
    metas = [t.metadata for t in replica_tasks(where) if not args.tasks or t.metadata.name in args.tasks]
    start = time.perf_counter()
    if args.workers > 1:  # the largest first, as a run orders its task processes
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        from functools import partial

        threads = str(
            max(1, len(os.sched_getaffinity(0)) // args.workers)
        )  # as a run's task processes: no oversubscription
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = threads  # read by the spawned workers' numpy and torch when they start
        sizes = {m.name: _size(where, m.name) for m in metas}
        metas.sort(key=lambda m: -sizes[m.name])
        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            rows = list(pool.map(partial(_task_row, args, where), metas))
    else:
        rows = [_task_row(args, where, m) for m in metas]
    print(f"wall: {time.perf_counter() - start:.1f} s with {args.workers} worker(s)")
    failures = sum(1 for r in rows if r.get("same") is False)
    for path in args.paths:
        print(f"{path}: {sum(r[path] for r in rows):.1f} s over {len(rows)} tasks")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
