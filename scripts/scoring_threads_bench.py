"""Seconds that mteb's CPU scoring takes in P processes at once with T BLAS/OpenMP threads each: the choice behind
``vllm_eval.evaluation.task_processes.SCORING_THREADS``. Each process runs what mteb 2.26 runs for one task of each
kind, with mteb's own estimator settings (``mteb/abstasks/clustering.py``, ``mteb/abstasks/classification.py``):
10 ``MiniBatchKMeans(batch_size=512, init="k-means++", n_init=1)`` fits of 16,384 sampled points (clustering's
bootstrap) and 10 ``LogisticRegression(max_iter=100)`` fits of 8 samples per label (classification's experiments),
on seeded float32 vectors of ``--dim`` values. Needs only numpy, scikit-learn and threadpoolctl (no mteb, no vLLM), so
it runs as is on a GPU host's CPU. Prints one JSON line per setting: the wall seconds of all P processes (their
seeded data's making included), each process's seconds of fitting, and whether its v-measures and predictions
equal those of the one-thread setting.

    python3 scripts/scoring_threads_bench.py [--processes 1 4 8] [--threads 1 0] [--dim 768] [--json OUT.json]

``--threads 0`` means cores // processes (the rule before one thread). The process pool is made once per setting
(``spawn``), and each process warms its BLAS up before the clock starts.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time


def _data(seed: int, dim: int, n: int, labels: int):
    """``n`` float32 vectors of ``dim`` values around ``labels`` seeded centres, and their labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(labels, dim)).astype(np.float32)
    y = rng.integers(0, labels, size=n)
    x = centres[y] + rng.normal(scale=2.0, size=(n, dim)).astype(np.float32)
    return x, y


def _work(args: tuple[int, int, int]) -> dict:
    """One process's scoring of one clustering and one classification task with ``threads`` threads: seconds
    of each part, the v-measures and a digest of the predictions (to compare settings)."""
    seed, threads, dim = args
    import hashlib

    import numpy as np
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import v_measure_score
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        np.ones((256, 256)) @ np.ones((256, 256))  # BLAS warmed up outside the clock
        x, y = _data(seed, dim, 20_000, 20)
        rng = np.random.default_rng(seed + 1)
        began = time.perf_counter()
        v = []
        for _ in range(10):
            idx = rng.choice(len(x), size=16_384, replace=True)
            model = MiniBatchKMeans(n_clusters=20, batch_size=512, init="k-means++", n_init=1, random_state=seed)
            v.append(float(v_measure_score(y[idx], model.fit_predict(x[idx]))))
        clustering = time.perf_counter() - began
        x2, y2 = _data(seed + 2, dim, 3_000, 77)
        train = np.concatenate([np.flatnonzero(y2 == k)[:8] for k in range(77)])
        began = time.perf_counter()
        digest = hashlib.sha256()
        for _ in range(10):
            clf = LogisticRegression(max_iter=100).fit(x2[train], y2[train])
            digest.update(clf.predict(x2).tobytes())
        classification = time.perf_counter() - began
    return {"clustering_s": clustering, "classification_s": classification, "v": v, "pred": digest.hexdigest()}


def _setting(processes: int, threads: int, dim: int) -> dict:
    """All ``processes`` processes at once (one task each), ``threads`` threads each; env set before the spawn
    too, as our task processes set it."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    with mp.get_context("spawn").Pool(processes) as pool:
        pool.map(_noop, range(processes))  # the processes started and imported before the clock
        began = time.perf_counter()
        rows = pool.map(_work, [(seed, threads, dim) for seed in range(processes)])
        wall = time.perf_counter() - began
    return {"processes": processes, "threads": threads, "wall_s": round(wall, 2), "rows": rows}


def _noop(_: int) -> None:
    import sklearn.cluster  # noqa: F401
    import sklearn.linear_model  # noqa: F401


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--json")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    out = []
    for processes in args.processes:
        base = None
        for threads in dict.fromkeys(t or max(1, cores // processes) for t in args.threads):
            row = _setting(processes, threads, args.dim)
            base = base or row["rows"]
            same = all(a["v"] == b["v"] and a["pred"] == b["pred"] for a, b in zip(base, row["rows"], strict=True))
            line = {
                "cores": cores,
                "processes": processes,
                "threads": threads,
                "wall_s": row["wall_s"],
                "clustering_s": [round(r["clustering_s"], 2) for r in row["rows"]],
                "classification_s": [round(r["classification_s"], 2) for r in row["rows"]],
                "same_as_first": same,
            }
            print(json.dumps(line), flush=True)
            out.append(line)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
