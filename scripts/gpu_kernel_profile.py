"""Where one vLLM pooling engine's time goes: GPU kernel time against wall time, by torch.profiler.

One engine with its core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as each of our GPU replicas runs
it), so the profiler sees the model's CUDA kernels. For each configuration (``--configs``, JSON engine options
added to ours) it embeds ``--n-texts`` texts of ``--lengths`` tokens in chunks of ``--chunk`` (token ids, as our
replicas receive them) twice: once timed plainly (tokens/s), once under the profiler. It prints, and writes to
``--out`` as JSON: wall seconds, kernel seconds (the sum of every kernel's duration), GPU busy seconds (the union
of kernel intervals), busy fraction, the tokens/s the GPU would give if it were never idle (tokens / busy) and the
kernels that took the most time, kernel time by class (matrix products, attention, fp8 quantisation, the rest)
and the tokens/s of the matrix products alone (the bound if everything else took no time).
On a machine without CUDA it profiles the CPU side only.

Run on the lent GPU after staging vLLM (scripts/gpu_bench.sh):
    python3 scripts/gpu_kernel_profile.py --model /root/models/bert-base --dtype float16 --out $OUT/kernels.json \\
        --configs '{}' '{"enforce_eager": true}'
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (µs)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


#: Kernel classes by name (first match wins): attention (FlashAttention's kernels are CUTLASS device kernels too, so
#: it comes first), torch.compile's fused Triton kernels (named after every op they fuse, a quantisation feeding a
#: ``cutlass_scaled_mm`` among them: never a matrix product themselves), cuBLAS/CUTLASS matrix products (bf16 and fp8),
#: fp8 activation quantisation, then the rest (norms, activations, rotary embeddings).
KERNEL_CLASSES = (
    ("attention", ("flash", "attn", "fmha")),
    ("fused", ("triton_",)),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "matmul", "scaled_mm", "cublas", "sm90_", "wgmma")),
    ("quantize", ("quant",)),
)


def kernel_class(name: str) -> str:
    """The class of a CUDA kernel by its name (:data:`KERNEL_CLASSES`), "other" when none matches."""
    low = name.lower()
    return next((cls for cls, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


def _encode_all(llm, ids: list[list[int]], chunk: int) -> None:
    from vllm_eval.engine.jobs import embed_job

    for i in range(0, len(ids), chunk):
        embed_job(llm, (ids[i : i + chunk], None, None))


def profile_config(model: str, dtype: str, extra: dict, ids: list[list[int]], chunk: int, top: int) -> dict:
    """Measure one engine configuration (see the module doc); returns the record written to ``--out``."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from vllm_eval.engine.build import acquire_engine, release_engine

    tokens = sum(map(len, ids))
    started = time.perf_counter()
    llm = acquire_engine(model, runner="pooling", convert="embed", dtype=dtype, **extra)
    ready = time.perf_counter() - started
    try:
        _encode_all(llm, ids[: min(len(ids), 2 * chunk)], chunk)  # warm-up: first shapes, allocator
        t0 = time.perf_counter()
        _encode_all(llm, ids, chunk)
        wall = time.perf_counter() - t0
        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            _encode_all(llm, ids, chunk)
            if cuda:
                torch.cuda.synchronize()
            wall_profiled = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
        kernel_us = sum(hi - lo for lo, hi in intervals)
        busy_us = _busy_us(intervals)
        by_name: dict[str, float] = {}
        for e in kernels:
            by_name[e.name] = by_name.get(e.name, 0.0) + (e.time_range.end - e.time_range.start)
        top_kernels = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
        by_class: dict[str, float] = {}
        for name, us in by_name.items():
            by_class[kernel_class(name)] = by_class.get(kernel_class(name), 0.0) + us
        span_us = (max(hi for _, hi in intervals) - min(lo for lo, _ in intervals)) if intervals else 0.0
    finally:
        release_engine(llm)
    return {
        "engine_options": extra,
        "ready_s": round(ready, 2),
        "texts": len(ids),
        "tokens": tokens,
        "chunk": chunk,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall),
        "profiled_wall_s": round(wall_profiled, 3),
        "kernel_s": round(kernel_us / 1e6, 3),
        "gpu_busy_s": round(busy_us / 1e6, 3),
        "kernel_span_s": round(span_us / 1e6, 3),
        "busy_fraction_of_profiled_wall": round(busy_us / 1e6 / wall_profiled, 3) if cuda else None,
        "tokens_per_gpu_busy_s": round(tokens / (busy_us / 1e6)) if busy_us else None,
        "kernels": len(kernels),
        "kernel_s_by_class": {k: round(v / 1e6, 3) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "tokens_per_gemm_s": round(tokens / (by_class.get("gemm", 0.0) / 1e6)) if by_class.get("gemm") else None,
        "top_kernels_s": [(name[:120], round(us / 1e6, 3)) for name, us in top_kernels],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--n-texts", type=int, default=20000)
    parser.add_argument("--lengths", default="mixed:16-500")
    parser.add_argument("--chunk", type=int, default=1024, help="texts per LLM.embed call (one replica's job)")
    parser.add_argument("--configs", nargs="+", default=["{}"], help="JSON engine options, one engine each")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from vllm_eval.measure.bench import make_texts

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    texts, _ = make_texts(tokenizer, args.n_texts, args.lengths)
    ids = tokenizer(texts)["input_ids"]
    records = []
    for spec in args.configs:
        record = profile_config(args.model, args.dtype, json.loads(spec), ids, args.chunk, args.top)
        records.append(record)
        print(json.dumps(record, indent=1), flush=True)
        with open(args.out, "w") as fh:  # after each configuration: a call cut short keeps what was measured
            json.dump(records, fh, indent=1)


if __name__ == "__main__":
    main()
