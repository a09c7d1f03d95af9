"""lm-eval's tasks end to end, side by side on this machine: ``vllm-eval generate`` against ``lm_eval run --model vllm``
(lm-eval's own vLLM backend, the same vLLM build and engine settings) and ``--model hf`` (HFLM), each a fresh process
timed from command to exit, with the metrics compared.

Runs the real SmolLM2-135M-Instruct (float32) on lm-eval's task configs pointed at the packaged real data
(``make lm-data``). On the CPU build lm-eval's ``vllm`` model needs metadata for the name ``vllm``
(:mod:`vllm_eval.testing.lm_eval_peer`: a throwaway folder on its PYTHONPATH; lm-eval's files are not changed), and
gets the engine options ours runs with there (float32, eager, the 2 GiB KV reserve), without which it does not start.
Run from the project root:

    .venv/bin/python scripts/lm_eval_bench.py [--work DIR] [--runs ours,vllm,hf] [--set mmlu|hellaswag|both]

``mmlu``: the 57 subjects, 5-shot, ``--limit 0.05``; ``hellaswag``: ``--limit 500`` (``--limit`` for another
size). ``--model`` and ``--engine KEY=VALUE`` (repeatable) point it at another model and engine. Each run's
seconds, metrics and the ratios go to ``<work>/lm_eval_bench.json`` and stdout; its files to ``<work>/<set>-<run>/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

SETS = {"mmlu": (["mmlu"], {"num_fewshot": 5, "limit": 0.05}), "hellaswag": (["hellaswag"], {"limit": 500})}


def _ours(model: str, tasks: list[str], options: dict, engine: dict, include: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "vllm_eval", "generate", "--model", model, "--tasks", ",".join(tasks)]
    cmd += ["--include-path", include, "--output-dir", str(out), "--no-cache", "--no-progress"]
    for key, value in {**options, **engine}.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def _metrics(folder: Path) -> dict:
    (path,) = list(folder.glob("*/results_*.json"))
    results = json.loads(path.read_text())
    return {**results.get("results", {}), **results.get("groups", {})}


def _equal(a: dict, b: dict) -> bool:
    for task, metrics in a.items():
        for key, value in metrics.items():
            if "stderr" in key or not isinstance(value, float):
                continue
            if not math.isclose(value, b[task][key], rel_tol=1e-6, abs_tol=1e-9):
                print(f"  differs: {task} {key} {value} against {b[task][key]}")
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/vllm-eval-lm-bench")
    parser.add_argument("--runs", default="ours,vllm,hf")
    parser.add_argument("--set", default="both", choices=["mmlu", "hellaswag", "both"])
    parser.add_argument("--model", default=None, help="default: the packaged SmolLM2-135M-Instruct, converted")
    parser.add_argument("--limit", type=float, default=None, help="another --limit than the set's (a fraction < 1)")
    parser.add_argument("--engine", action="append", default=[], help="KEY=VALUE engine option for both vLLM runs")
    args = parser.parse_args()
    from vllm_eval.engine.args import CPU_KV_CACHE_BYTES
    from vllm_eval.testing.lm_data import write_local_tasks
    from vllm_eval.testing.lm_eval_peer import lm_eval_command, run_lm_eval_cli

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from vllm_eval.testing.packaged import build_smollm2

        model = str(work / "smollm2")
        if not (work / "smollm2" / "config.json").exists():
            build_smollm2(model)
    include = str(write_local_tasks(work / "tasks"))
    engine = {"dtype": "float32", "max_model_len": 2048}
    engine.update(dict(kv.split("=", 1) for kv in args.engine))
    peer_engine = {**engine, "enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    report = {"model": model, "engine": engine, "sets": {}}
    for name in ["mmlu", "hellaswag"] if args.set == "both" else [args.set]:
        tasks, options = SETS[name]
        if args.limit is not None:
            options = {**options, "limit": args.limit if args.limit < 1 else int(args.limit)}
        seconds, metrics = {}, {}
        for run in args.runs.split(","):
            out = work / f"{name}-{run}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            if run == "ours":
                started = time.perf_counter()
                subprocess.run(_ours(model, tasks, options, engine, include, out), env=env, check=True)
                seconds[run] = time.perf_counter() - started
            else:
                margs = {"pretrained": model, **(peer_engine if run == "vllm" else {"dtype": "float32"})}
                if run == "hf":
                    margs["max_length"] = engine["max_model_len"]
                extra = {"batch_size": "auto" if run == "vllm" else 8}
                cmd = lm_eval_command(run, margs, tasks, out, include_path=include, **options, **extra)
                seconds[run] = run_lm_eval_cli(cmd, work, timeout=7200, env=env)
            metrics[run] = _metrics(out)
            print(f"{name} {run}: {seconds[run]:.1f} s", flush=True)
        ratios = {f"{run}/ours": round(seconds[run] / seconds["ours"], 2) for run in seconds if run != "ours"}
        equal = {run: _equal(metrics["ours"], metrics[run]) for run in metrics if run != "ours"}
        report["sets"][name] = {
            "tasks": tasks,
            "options": options,
            "seconds": seconds,
            "ratios": ratios,
            "equal": equal,
        }
        print(f"{name}: {ratios}, metrics equal to ours: {equal}", flush=True)
        (work / "lm_eval_bench.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
