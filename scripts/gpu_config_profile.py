"""Where vLLM spends the time of building an engine's configuration for a model (``EngineArgs.create_engine_config``,
which ``LLM(...)`` runs before its engine core starts), under cProfile, twice in one process (the second warm).

    python scripts/gpu_config_profile.py MODEL_DIR [--top 35] [--max-model-len 8192]

On an H200 (vLLM 0.26.0) an 8B pooling model's start spent ~20 s between vLLM's "Found sentence-transformers tokenize
configuration" and "Resolved architecture" log lines, in every start; this says where.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--max-model-len", type=int, default=8192)
    args = ap.parse_args()
    from vllm import EngineArgs

    for attempt in (1, 2):
        engine_args = EngineArgs(
            model=args.model,
            runner="pooling",
            convert="embed",
            dtype="bfloat16",
            max_model_len=args.max_model_len,
            enforce_eager=True,
        )
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        engine_args.create_engine_config()
        profile.disable()
        print(f"== attempt {attempt}: create_engine_config {time.perf_counter() - start:.2f} s", flush=True)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
