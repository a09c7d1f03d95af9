"""One in-process engine, synchronous chunks (one ``LLM.embed`` each) against pipelined ones
(vllm_eval.engine.pipeline).

    python scripts/pipeline_bench.py [N_TEXTS] [CHUNK_SIZE] [MODEL]

Encodes N_TEXTS distinct synthetic texts (default 4000; the packaged all-MiniLM-L6-v2) in chunks of CHUNK_SIZE
(default 256), alternating the two paths (``VLLMEVAL_PIPELINE=0`` is the synchronous one) after a warm-up, and
prints texts/s of each run and the largest difference between their rows.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main() -> None:
    from vllm_eval import VllmEncoder

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    model = sys.argv[3] if len(sys.argv) > 3 else None
    words = "the a cat dog market rain music ship city river data model light stone paper green fast slow".split()
    rng = np.random.default_rng(0)
    texts = [f"{i} " + " ".join(rng.choice(words, size=int(rng.integers(8, 48)))) for i in range(n)]
    with VllmEncoder(model, chunk_size=chunk, show_progress_bar=False) as enc:
        enc.encode_texts(texts[: 2 * chunk])  # warm-up
        rows = {}
        for mode in ("sync", "pipelined", "sync", "pipelined"):
            os.environ["VLLMEVAL_PIPELINE"] = "0" if mode == "sync" else "1"
            start = time.perf_counter()
            rows[mode] = enc.encode_texts(texts)
            seconds = time.perf_counter() - start
            print(f"{mode:9s} {n / seconds:8.1f} texts/s ({seconds:.2f} s, {n} texts, chunk_size {chunk})", flush=True)
        print(f"max |pipelined - sync| = {np.abs(rows['pipelined'] - rows['sync']).max():.3g}")


if __name__ == "__main__":
    main()
