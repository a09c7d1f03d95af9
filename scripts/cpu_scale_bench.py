"""Issue #6 on CPU: one engine vs two replicas in-process, one `vllm serve` vs two behind the remote backend.

Run from the repository root:  .venv/bin/python scripts/cpu_scale_bench.py [OUTPUT_DIR] [N_TEXTS]
Every figure comes from `vllm_eval.measure.bench.run_bench` (the `vllm-eval bench` harness) on the same
texts (packaged all-MiniLM-L6-v2, fp32, mixed 16-500 tokens). Servers are started with
`vllm_eval.testing.serve_model`; a two-server run binds each to its own half of the cores, as the
in-process replicas are.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

if __name__ == "__main__":
    from vllm_eval.evaluation.results import package_versions
    from vllm_eval.measure.bench import plot, run_bench
    from vllm_eval.replicas.pool import _cpu_cores
    from vllm_eval.testing import serve_model
    from vllm_eval.utils.modelinfo import packaged_model_path

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "results/cpu-scale")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    model = packaged_model_path()
    common = {"lengths": ["mixed:16-500"], "batch_sizes": [n], "n_texts": n, "dtypes": ["float32"]}
    cores = _cpu_cores()
    halves = [cores[: len(cores) // 2], cores[len(cores) // 2 :]]
    records = run_bench(
        model, backends=["vllm"], replicas=[{"data_parallel_size": 1}, {"data_parallel_size": 2}], **common
    )
    remote = {"batch_size": 64, "max_concurrency": 8}
    with serve_model(model, env={"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores))}) as url:
        records += run_bench(model, backends=["remote"], remote={**remote, "endpoints": [url]}, **common)
    with (
        serve_model(model, env={"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, halves[0]))}) as u1,
        serve_model(model, env={"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, halves[1]))}) as u2,
    ):
        records += run_bench(model, backends=["remote"], remote={**remote, "endpoints": [u1, u2]}, **common)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model,
        "versions": package_versions(),
        "cpu_cores": len(cores),
        "n_texts": n,
        "remote": remote,
        "records": [asdict(r) for r in records],
    }
    (out / "bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(records, out)
    print("\nlayout        tok/s      texts/s")
    for r in records:
        print(f"{r.backend:12s} {r.tokens_per_s:>9.0f} {r.texts_per_s:>9.1f}")
    print(f"results: {out}/bench.json ({os.cpu_count()} cores)")
