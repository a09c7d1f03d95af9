"""PatchCamelyon-shaped images through three vLLM paths on one GPU, one side per call, side by side in one lease:

- ``ours``: ``vllm-eval generate --tasks eva.PatchCamelyon`` as a user runs it (a subprocess, timed to its exit);
- ``eva``: the calls kaiko-eva's multimodal ``VllmModel`` makes (eva's model options and its registered
  Qwen2.5-VL-7B settings, its prompt, ``format_huggingface_message`` and the tokenizer's chat template, one
  ``llm.generate`` per batch of ``--batch-size``, 256 as its docs recommend), on the images eva's own
  ``BalancedSampler`` draws; eva's Lightning loop is not run (it could only add time);
- ``lmms``: lmms-eval's own ``VLLM`` model class (``lmms_eval.models.simple.vllm``), ``generate_until`` on
  lmms-eval ``Instance``s of the same prompts and images, at ``--batch-size`` (its default is 1);
- ``compare``: the answers of two sides' files, equal or not, sample by sample.

Every side reads eva's ``MAX_NEW_TOKENS`` from the environment (a random model never stops by itself) and writes
``{"side", "seconds", "samples", "outputs", ...}`` to ``--out``. The ``eva`` and ``lmms`` sides time from the
script's start (imports included); ``ours`` from the subprocess's start.

Run (on the device, after ``scripts/gpu_eva.sh``'s setup):
    MAX_NEW_TOKENS=16 python3 scripts/eva_vlm_bench.py ours --model M --data-root R --out ours.json [-- FLAGS]
    MAX_NEW_TOKENS=16 python3 scripts/eva_vlm_bench.py eva --model M --data-root R --out eva.json
    MAX_NEW_TOKENS=16 python3 scripts/eva_vlm_bench.py lmms --model M --data-root R --out lmms.json --batch-size 1
    python3 scripts/eva_vlm_bench.py compare --out a.json --other b.json
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def _requests(args: argparse.Namespace) -> list[tuple[str, list]]:
    """eva's PatchCamelyon prompts and images in eva's sampler order (val, then test), via this project's reader of
    eva's own source, so every side gets the same ones (``--num-samples``: per class and split, as ``--limit`` of
    ``vllm-eval generate``; ``--limit``: the first N of those)."""
    from vllm_eval.tasks import eva

    limit = args.limit
    prepared = eva.prepare(
        eva.get_eva_task("eva.PatchCamelyon"), args.data_root, n_runs=1, num_samples=args.num_samples
    )
    requests = prepared.requests()
    return requests[:limit] if limit else requests


def run_ours(args: argparse.Namespace, extra: list[str]) -> dict:
    out = Path(args.work) / "ours"
    cmd = [sys.executable, "-m", "vllm_eval.cli", "generate", "--model", args.model, "--tasks", "eva.PatchCamelyon"]
    cmd += ["--data-root", args.data_root, "--n-runs", "1", "--missing-limit", "1000000", "--output-dir", str(out)]
    cmd += ["--no-cache", "--no-progress", *(["--limit", str(args.num_samples)] if args.num_samples else []), *extra]
    t0, wall0 = time.perf_counter(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    results = sorted(out.rglob("results.json"))
    report = {"side": "ours", "command": " ".join(cmd), "rc": proc.returncode, "seconds": round(seconds, 2)}
    report["log_tail"] = (proc.stdout + proc.stderr)[-3000:]
    if results:
        task = json.loads(results[0].read_text())
        rows = (results[0].parent / "samples.jsonl").read_text().splitlines()
        report["outputs"] = [json.loads(row)["output"] for row in rows]
        report |= {k: task.get(k) for k in ("engine_kwargs", "image_position", "main_score", "error")}
    log = out / "vllm-eval.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    # The log for the timeline, less vLLM's line per loaded weight (hundreds of a 7B's, at debug level).
    kept = [x for x in lines if "Loaded weight " not in x and "Loaded shard " not in x]
    Path(args.out).with_suffix(".log").write_text("\n".join(kept) + "\n")
    report["log_lines"] = [x for x in lines if any(w in x.lower() for w in ("layout", "ready", "enforce_eager"))][:10]
    report |= _log_marks(lines, wall0)
    return report


def _log_marks(lines: list[str], wall0: float) -> dict:
    """Seconds from the command's start to its engine's first log line, to vLLM's "READY" (the engine ready) and to
    the log's last line, read off ``vllm-eval.log``'s timestamps (the ``eva`` side's ``engine_ready_seconds``)."""
    import datetime

    def at(line: str) -> float | None:
        try:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            return None
        return round(stamp.timestamp() - wall0, 2)

    stamped = [(t, x) for x in lines if (t := at(x)) is not None]
    ready = [t for t, x in stamped if "READY from" in x]
    return {
        "first_log_seconds": stamped[0][0] if stamped else None,
        "engine_ready_seconds": ready[0] if ready else None,
        "last_log_seconds": stamped[-1][0] if stamped else None,
    }


def run_eva(args: argparse.Namespace) -> dict:
    """kaiko-eva's multimodal ``VllmModel``: ``LLM(model, **(defaults | registered kwargs))``, ``format_inputs`` and
    ``model_forward`` (eva/multimodal/models/wrappers/vllm.py, 0.4.5), read from eva's installed source."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from vllm_eval.utils.eva_source import class_attribute, module_function, registered_vllm_models

    wrapper = "multimodal/models/wrappers/vllm.py"
    registered = registered_vllm_models("multimodal/models/networks/alibaba.py")["alibaba/qwen2-5-vl-7b-instruct-vllm"]
    options = class_attribute(wrapper, "VllmModel", "_default_model_kwargs") | registered["model_kwargs"]
    from eva.language.models.constants import MAX_NEW_TOKENS

    sampling = {"temperature": 0.0, "max_tokens": MAX_NEW_TOKENS, "top_p": 1.0, "top_k": -1, "n": 1, "seed": 0}
    fmt = module_function("multimodal/utils/text/messages.py", "format_huggingface_message")
    requests = _requests(args)
    t_data = time.perf_counter() - START
    llm = LLM(model=args.model, **options)
    t_engine = time.perf_counter() - START
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    from eva.language.data.messages import UserMessage

    outputs = []
    for lo in range(0, len(requests), args.batch_size):
        batch = []
        for prompt, images in requests[lo : lo + args.batch_size]:
            messages = fmt([UserMessage(content=prompt)], images=images, image_position=registered["image_position"])
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            batch.append({"prompt": text, "multi_modal_data": {"image": list(images)}})
        got = llm.generate(batch, sampling_params=SamplingParams(**sampling))
        outputs += [o.outputs[0].text for o in got]
    seconds = time.perf_counter() - START
    return {
        "side": "eva",
        "seconds": round(seconds, 2),
        "data_seconds": round(t_data, 2),
        "engine_ready_seconds": round(t_engine, 2),
        "engine_kwargs": options,
        "image_position": registered["image_position"],
        "batch_size": args.batch_size,
        "outputs": outputs,
    }


def run_lmms(args: argparse.Namespace) -> dict:
    """lmms-eval 0.7.3's ``VLLM`` model (``--model vllm``) at ``batch_size``: images sent as base64 PNG in
    ``llm.chat`` messages, text first (its ``image_first=False`` default)."""
    from lmms_eval.api.instance import Instance
    from lmms_eval.models.simple.vllm import VLLM

    requests = _requests(args)
    t_data = time.perf_counter() - START
    model = VLLM(model=args.model, batch_size=args.batch_size, max_new_tokens=int(os.environ.get("MAX_NEW_TOKENS", 16)))
    t_engine = time.perf_counter() - START
    docs = [images[0] for _, images in requests]
    model.task_dict = {"pcam": {"test": docs}}
    gen = {"max_new_tokens": int(os.environ.get("MAX_NEW_TOKENS", 16)), "temperature": 0}
    instances = [
        Instance(
            request_type="generate_until",
            arguments=(prompt, gen, lambda doc: [doc], i, "pcam", "test"),
            idx=0,
            metadata={"task": "pcam", "doc_id": i, "repeats": 1},
        )
        for i, (prompt, _) in enumerate(requests)
    ]
    outputs = model.generate_until(instances)
    seconds = time.perf_counter() - START
    return {
        "side": "lmms",
        "seconds": round(seconds, 2),
        "data_seconds": round(t_data, 2),
        "engine_ready_seconds": round(t_engine, 2),
        "batch_size": args.batch_size,
        "outputs": [o if isinstance(o, str) else getattr(o, "text", str(o)) for o in outputs],
    }


def compare(args: argparse.Namespace) -> dict:
    a, b = (json.loads(Path(p).read_text()) for p in (args.out, args.other))
    pairs = list(zip(a.get("outputs", []), b.get("outputs", [])))
    same = sum(x == y for x, y in pairs)
    return {
        "a": a["side"],
        "b": b["side"],
        "samples": len(pairs),
        "equal": same,
        "common_prefix_chars": sum(len(os.path.commonprefix([x, y])) for x, y in pairs),
        "chars": sum(max(len(x), len(y)) for x, y in pairs),
        "first_differing": next(([i, x, y] for i, (x, y) in enumerate(pairs) if x != y), None),
    }


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=["ours", "eva", "lmms", "compare"])
    parser.add_argument("--model")
    parser.add_argument("--data-root")
    parser.add_argument("--out", required=True)
    parser.add_argument("--other")
    parser.add_argument("--work", default="/root/work")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-samples", type=int, default=None, help="per class and split (default eva's 250)")
    parser.add_argument("--limit", type=int, default=None, help="the first N requests (eva and lmms sides)")
    args = parser.parse_args(argv)
    if args.side == "compare":
        print(json.dumps(compare(args), indent=1))
        return
    report = {"ours": lambda: run_ours(args, extra), "eva": lambda: run_eva(args), "lmms": lambda: run_lmms(args)}[
        args.side
    ]()
    report["samples"] = len(report.get("outputs") or [])
    report["max_new_tokens"] = os.environ.get("MAX_NEW_TOKENS")
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("outputs", "log_tail")}, indent=1))
    if report.get("rc"):
        print(report.get("log_tail", ""))


if __name__ == "__main__":
    main()
