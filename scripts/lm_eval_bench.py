"""lm-eval's tasks end to end, side by side on this machine: ``vllm-eval generate`` against ``lm_eval run --model vllm``
(lm-eval's own vLLM backend, the same vLLM build and engine settings) and ``--model hf`` (HFLM), each a fresh process
timed from command to exit, with the metrics compared, each run's evaluation seconds (ours' ``evaluate_seconds``;
lm-eval's from its log) and, for generation, the tokens generated and their rate over the evaluation.

Runs the real SmolLM2-135M-Instruct (float32) on lm-eval's task configs pointed at the packaged real data
(``make lm-data``). On the CPU build lm-eval's ``vllm`` model needs metadata for the name ``vllm``
(:mod:`vllm_eval.testing.lm_eval_peer`: a throwaway folder on its PYTHONPATH; lm-eval's files are not changed), and
gets the engine options ours runs with there (float32, eager, the 2 GiB KV reserve), without which it does not start.
Run from the project root:

    .venv/bin/python scripts/lm_eval_bench.py [--work DIR] [--runs ours,vllm,hf] [--set mmlu,hellaswag,gsm8k]

``mmlu``: the 57 subjects, 5-shot, ``--limit 0.05``; ``hellaswag``: ``--limit 500``; ``gsm8k``: 5-shot, ``--limit
100`` (``--limit`` and ``--num-fewshot`` for others, or per set: ``--set gsm8k:all:5,hellaswag:500:10``).
``--model`` and ``--engine KEY=VALUE`` (repeatable) point it at another model and engine; ``--ours KEY=VALUE`` gives
ours alone an option (``--ours replicas_per_gpu=4``: four engines on each GPU). Each run's seconds,
metrics and the ratios go to ``<work>/lm_eval_bench.json`` and stdout; its files to ``<work>/<set>-<run>/``.

On a GPU (``--gpu``: bfloat16, no CPU engine options, lm-eval's ``--batch_size auto``), after staging vLLM (the
device's ``on-device.sh``), with a random-weight model of a real shape and SmolLM2's tokenizer
(``vllm_eval.testing.build_random_causal_lm``):

    python3 scripts/lm_eval_bench.py --gpu --model DIR --runs ours,vllm --set mmlu --warm --timeout 400

``--warm``: each runner once at ``--limit 1`` first, untimed, so that both timed runs find vLLM's compile cache warm.

``--resume``: instead of the runners, ours three times on each set: a fresh run with a fresh output cache (its
requests counted in the cache), one with another fresh cache killed with SIGKILL once the cache holds half of them,
and that run again; the rerun's seconds against the fresh run's, and the metrics of the two compared.
``--timeout``: a run past it is stopped and its time recorded as "over" (the ratio a lower bound).
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

SETS = {
    "mmlu": (["mmlu"], {"num_fewshot": 5, "limit": 0.05}),
    "hellaswag": (["hellaswag"], {"limit": 500}),
    "gsm8k": (["gsm8k"], {"num_fewshot": 5, "limit": 100}),
}


def _tasks(label: str) -> list[str]:
    return SETS[label.split("-")[0]][0]


def _spec(spec: str, args) -> tuple[str, dict]:
    """``SET[:LIMIT[:FEWSHOT]]`` (LIMIT ``all``: every item) to its label (``SET-LIMIT-FEWSHOT``) and options;
    without them, ``--limit`` / ``--num-fewshot`` or the set's own."""
    name, *rest = spec.split(":")
    options = dict(SETS[name][1])
    limit = rest[0] if rest else args.limit
    fewshot = rest[1] if len(rest) > 1 else args.num_fewshot
    if limit == "all":
        options.pop("limit", None)
    elif limit is not None:
        options["limit"] = float(limit) if float(limit) < 1 else int(float(limit))
    if fewshot is not None:
        options["num_fewshot"] = int(fewshot)
    return "-".join([name, *rest]), options


def _ours(model: str, tasks: list[str], options: dict, engine: dict, include: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "vllm_eval", "generate", "--model", model, "--tasks", ",".join(tasks)]
    # --verbose: vLLM's INFO lines (engine start, compile, KV cache) with their times in the run's log
    # --log-samples: as lm-eval's runs write theirs (lm_eval_command), and for the output tokens counted below
    cmd += ["--include-path", include, "--output-dir", str(out), "--no-cache", "--no-progress", "--verbose"]
    cmd += ["--log-samples"]
    for key, value in {**options, **engine}.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def _metrics(folder: Path) -> dict:
    (path,) = list(folder.glob("*/results_*.json"))
    results = json.loads(path.read_text())
    return {**results.get("results", {}), **results.get("groups", {})}


def _evaluation(folder: Path, log: Path) -> float | None:
    """Seconds of the evaluation alone: ours' ``evaluate_seconds``; lm-eval's from its log, its first "Running ...
    requests" line to "Saving results aggregated" (lm-eval's log times have whole seconds)."""
    import datetime
    import re

    summary = folder / "summary.json"
    if summary.exists():
        return json.loads(summary.read_text()).get("evaluate_seconds")
    stamps = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"(\d{4}-\d\d-\d\d:\d\d:\d\d:\d\d) INFO .*(Running \w+ requests|Saving results aggregated)", line)
        if m:
            stamps.setdefault(m.group(2).split()[0], datetime.datetime.strptime(m.group(1), "%Y-%m-%d:%H:%M:%S"))
    if "Running" in stamps and "Saving" in stamps:
        return (stamps["Saving"] - stamps["Running"]).total_seconds()
    return None


def _output_tokens(folder: Path, model: str) -> int | None:
    """Tokens generated for the run's ``generate_until`` requests (their first response, with the model's
    tokenizer), from its samples files; None without generations."""
    from transformers import AutoTokenizer

    texts = []
    for path in folder.glob("*/samples_*.jsonl"):
        for line in path.read_text().splitlines():
            resps = json.loads(line).get("resps") or []
            texts += [r[0] for r in resps if r and isinstance(r[0], str)]
    if not texts:
        return None
    tokenizer = AutoTokenizer.from_pretrained(model)
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def _equal(a: dict, b: dict) -> bool:
    for task, metrics in a.items():
        for key, value in metrics.items():
            if "stderr" in key or not isinstance(value, float):
                continue
            if not math.isclose(value, b[task][key], rel_tol=1e-6, abs_tol=1e-9):
                print(f"  differs: {task} {key} {value} against {b[task][key]}")
                return False
    return True


def _run(name: str, run: str, args, model: str, options: dict, engines: dict, include: str, env: dict) -> dict:
    """One timed command of ``run`` (ours, vllm, hf) into ``<work>/<name>-<run>``: ``{"exit": s, "results": s}``,
    the wall seconds to the command's exit and to its results file's appearing (``math.inf`` past ``--timeout``).
    lm-eval's ``vllm`` process was once seen alive long after writing its results: a run whose results are written
    is stopped at the timeout, its exit time "over"."""
    from vllm_eval.testing.lm_eval_peer import lm_eval_command, vllm_metadata_dir

    out = Path(args.work) / f"{name}-{run}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    environ = dict(env)
    if run == "ours":
        cmd = _ours(model, _tasks(name), options, engines["ours"], include, out)
    else:
        margs = {"pretrained": model, **engines[run]}
        extra = {"batch_size": "auto" if run == "vllm" else 8}
        cmd = lm_eval_command(run, margs, _tasks(name), out, include_path=include, **options, **extra)
        shim = vllm_metadata_dir(Path(args.work) / "vllm-metadata")
        if shim is not None:
            environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), environ.get("PYTHONPATH")]))
    log = open(Path(args.work) / f"{name}-{run}.log", "w")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    times = {"exit": math.inf, "results": math.inf}
    while time.perf_counter() - started < args.timeout:
        if math.isinf(times["results"]) and list(out.glob("*/results_*.json")):
            times["results"] = time.perf_counter() - started
        if proc.poll() is not None:
            times["exit"] = time.perf_counter() - started
            break
        time.sleep(0.25)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait()
        subprocess.run(["pkill", "-9", "-f", "VLLM::"], check=False)  # an engine outlives its killed parent
    elif proc.returncode != 0:
        raise SystemExit(f"{name} {run} failed with exit code {proc.returncode}: see {log.name}")
    if math.isinf(times["results"]) and list(out.glob("*/results_*.json")):
        times["results"] = times["exit"]
    if math.isfinite(times["results"]):
        times["evaluation"] = _evaluation(out, Path(log.name))
        tokens = _output_tokens(out, model)
        if tokens is not None and times["evaluation"]:
            times["output_tokens"], times["output_tok/s"] = tokens, round(tokens / times["evaluation"], 1)
    return times


def _cached_rows(cache: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(cache / "outputs.sqlite", timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM outputs").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0


def _resume(name: str, args, model: str, options: dict, engines: dict, include: str, env: dict) -> dict:
    """Fresh run, a run SIGKILLed at half of the fresh run's requests, and its rerun: seconds and metrics."""
    import signal

    work = Path(args.work)
    times, metrics, total = {}, {}, 0
    for step in ("fresh", "killed", "rerun"):
        out, cache = work / f"{name}-resume-{step}", work / f"{name}-cache-{'fresh' if step == 'fresh' else 'kill'}"
        subprocess.run(["rm", "-rf", str(out)] + ([str(cache)] if step != "rerun" else []), check=True)
        cmd = _ours(model, _tasks(name), options, engines["ours"], include, out)
        cmd = [c for c in cmd if c != "--no-cache"] + ["--cache-dir", str(cache)]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        if step == "killed":
            while proc.poll() is None and _cached_rows(cache) < total / 2:
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            subprocess.run(["pkill", "-9", "-f", "VLLM::"], check=False)  # an engine process left behind
            print(f"{name} killed at {time.perf_counter() - started:.1f} s with {_cached_rows(cache)} of {total}")
            continue
        if proc.wait(timeout=args.timeout) != 0:
            raise SystemExit(f"{step} run failed with exit code {proc.returncode}")
        times[step], metrics[step] = time.perf_counter() - started, _metrics(out)
        if step == "fresh":
            total = _cached_rows(cache)
        print(f"{name} {step}: {times[step]:.1f} s", flush=True)
    return {
        "requests": total,
        "seconds": times,
        "rerun/fresh": round(times["rerun"] / times["fresh"], 3),
        "equal": _equal(metrics["fresh"], metrics["rerun"]),
    }


def _engines(args) -> dict:
    from vllm_eval.engine.args import CPU_KV_CACHE_BYTES

    if args.gpu:
        engine = {"dtype": "bfloat16", "max_model_len": 4096}
        peer = dict(engine)
        hf = {"dtype": "bfloat16", "max_length": engine["max_model_len"]}
    else:
        engine = {"dtype": "float32", "max_model_len": 2048}
        # lm-eval's vllm backend does not start on the CPU build without these
        peer = {**engine, "enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
        hf = {"dtype": "float32", "max_length": engine["max_model_len"]}
    extra = dict(kv.split("=", 1) for kv in args.engine)
    ours = dict(kv.split("=", 1) for kv in args.ours)
    return {"ours": {**engine, **extra, **ours}, "vllm": {**peer, **extra}, "hf": hf}


def _row(name: str, options: dict, seconds: dict, metrics: dict, timeout: float) -> dict:
    """A set's report: each run's seconds to exit and to results, their ratios to ours, equal metrics."""
    shown = {
        run: {k: v if v is None or math.isfinite(v) else f"over {timeout:.0f}" for k, v in t.items()}
        for run, t in seconds.items()
    }
    ratios = {}
    for run, t in seconds.items():
        if run == "ours" or "ours" not in seconds:
            continue
        for key in ("exit", "results"):
            ratio = t[key] / seconds["ours"][key]
            ratios[f"{run}/ours ({key})"] = round(ratio, 2) if math.isfinite(ratio) else "over"
    equal = {run: _equal(metrics["ours"], metrics[run]) for run in metrics if run != "ours" and "ours" in metrics}
    return {"tasks": _tasks(name), "options": options, "seconds": shown, "ratios": ratios, "equal": equal}


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/vllm-eval-lm-bench")
    parser.add_argument("--runs", default="ours,vllm,hf")
    parser.add_argument(
        "--set", default="mmlu,hellaswag", help=f"comma-separated SET[:LIMIT[:FEWSHOT]], SET of {sorted(SETS)}"
    )
    parser.add_argument("--model", default=None, help="default: the packaged SmolLM2-135M-Instruct, converted")
    parser.add_argument("--limit", default=None, help="another --limit than the set's (a fraction < 1, or all)")
    parser.add_argument("--num-fewshot", type=int, default=None, help="another --num-fewshot than the set's")
    parser.add_argument("--engine", action="append", default=[], help="KEY=VALUE engine option for both vLLM runs")
    parser.add_argument("--ours", action="append", default=[], help="KEY=VALUE of ours alone (replicas_per_gpu=4)")
    parser.add_argument("--gpu", action="store_true", help="GPU engine options (bfloat16, lm-eval's defaults)")
    parser.add_argument("--warm", action="store_true", help="each runner once at --limit 1 first, untimed")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds a run may take")
    parser.add_argument("--resume", action="store_true", help="fresh, SIGKILLed half way and rerun (ours)")
    return parser.parse_args()


def main() -> int:
    args = _args()
    from vllm_eval.testing.lm_data import write_local_tasks

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from vllm_eval.testing.packaged import build_smollm2

        model = str(work / "smollm2")
        if not (work / "smollm2" / "config.json").exists():
            build_smollm2(model)
    include = str(write_local_tasks(work / "tasks"))
    engines = _engines(args)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = args.runs.split(",")
    report = {"model": model, "engines": engines, "gpu": args.gpu, "sets": {}}
    specs = [_spec(spec, args) for spec in args.set.split(",")]
    if args.warm:
        name, options = specs[0]
        for run in runs:
            times = _run(name, run, args, model, {**options, "limit": 1}, engines, include, env)
            print(f"warm-up {run}: {times}", flush=True)
    for name, options in specs:
        if args.resume:
            report["sets"][name] = {"options": options, **_resume(name, args, model, options, engines, include, env)}
            print(f"{name}: {report['sets'][name]}", flush=True)
            (work / "lm_eval_bench.json").write_text(json.dumps(report, indent=2))
            continue
        seconds, metrics = {}, {}
        for run in runs:
            seconds[run] = _run(name, run, args, model, options, engines, include, env)
            if math.isfinite(seconds[run]["results"]):
                metrics[run] = _metrics(work / f"{name}-{run}")
            print(f"{name} {run}: {seconds[run]}", flush=True)
            report["sets"][name] = _row(name, options, seconds, metrics, args.timeout)
            (work / "lm_eval_bench.json").write_text(json.dumps(report, indent=2))
        print(f"{name}: {report['sets'][name]['ratios']}, equal to ours: {report['sets'][name]['equal']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
