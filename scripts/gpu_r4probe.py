"""Four engine replicas on one GPU, started together: seconds until each is ready, then one encode.

On the lent machine after vLLM is staged (see scripts/gpu_bench.sh):
    source .devstage/bin/on-device.sh && python3 scripts/gpu_r4probe.py <model dir>
Prints ``READY <seconds to a usable encoder> {replica: seconds from the pool's start}`` and the shape encoded.
"""

import sys
import time
import traceback


def main():
    from vllm_eval import VllmEncoder

    t = time.perf_counter()
    enc = VllmEncoder(sys.argv[1], replicas_per_gpu=4, dtype="float16", show_progress_bar=False)
    print("READY", round(time.perf_counter() - t, 1), enc.pool.ready_seconds, flush=True)
    try:
        out = enc.encode_texts(["hello world"] * 3 + [f"text number {i}" for i in range(5000)])
        print("ENCODED", out.shape, flush=True)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
    import os

    os._exit(0)


if __name__ == "__main__":
    main()
