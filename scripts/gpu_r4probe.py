"""Four engine replicas on one GPU, started together: seconds until each is ready, then one encode; with ``--tasks``,
each named task folder's texts of a replica encoded alone, one call each, at each ``--chunk-sizes``.

On the lent machine after vLLM is staged (see scripts/gpu_bench.sh):
    source .devstage/bin/on-device.sh && export PYTHONPATH=$PWD/src:$PYTHONPATH   (the sourced file sets only vLLM's)
    python3 scripts/gpu_r4probe.py <model dir>
    python3 scripts/gpu_r4probe.py /root/models/bert-seed-0 --replica /root/work/replica-0.05 \
        --tasks Touche2020Retrieval.v3 MindSmallReranking TRECCOVID --chunk-sizes 1024 4096
Prints ``READY <seconds to a usable encoder> {replica: seconds from the pool's start}`` and the shape encoded; with
``--tasks``, a JSON line per task and chunk size: texts, tokens (the model's tokenizer, truncated as embedded),
seconds of the call (after one untimed call of the same texts) and tokens/s. A run's ``summary.json`` holds the same
tasks' ``encode_seconds`` and ``tokens`` with everything else of the run around them: the two say whether a task's
encoding is slower inside a run than alone. The texts are every string field but ids of the task folder's JSONL
files, each once (a task's queries and documents, as its encode calls see them, bar instructions).
"""

import argparse
import json
import sys
import time
import traceback
from pathlib import Path


def _tasks(enc, replica: Path, tasks: list[str], chunk_sizes: list[int]) -> None:
    from reload_parity_check import texts_of  # this folder's: the same texts as that check reads
    from transformers import AutoTokenizer

    from vllm_eval.engine.tokenizing import BatchTokenizer

    # The command's own tokenizer is None where replicas tokenize their shares: count with one made the same way.
    counter = BatchTokenizer(AutoTokenizer.from_pretrained(enc.model), enc.max_length)
    for name in tasks:
        texts = texts_of([replica / name])
        ids, _ = counter.with_truncated(texts)
        tokens = sum(map(len, ids))
        for size in chunk_sizes:
            enc.chunk_size = size
            enc.encode_texts(texts, show_progress_bar=False)
            start = time.perf_counter()
            enc.encode_texts(texts, show_progress_bar=False)
            seconds = time.perf_counter() - start
            row = {
                "task": name,
                "chunk_size": size,
                "texts": len(texts),
                "tokens": tokens,
                "seconds": round(seconds, 3),
            }
            print(json.dumps({**row, "tokens_per_s": round(tokens / seconds)}), flush=True)


def main():
    from vllm_eval import VllmEncoder

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--replicas-per-gpu", type=int, default=4)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--replica", type=Path, help="a replica's folder (vllm_eval.tasks.shaped.build_replica)")
    parser.add_argument("--tasks", nargs="*", default=[])
    parser.add_argument("--chunk-sizes", nargs="*", type=int, default=[1024])
    args = parser.parse_args()
    t = time.perf_counter()
    enc = VllmEncoder(args.model, replicas_per_gpu=args.replicas_per_gpu, dtype=args.dtype, show_progress_bar=False)
    print("READY", round(time.perf_counter() - t, 1), enc.pool.ready_seconds if enc.pool else {}, flush=True)
    try:
        out = enc.encode_texts(["hello world"] * 3 + [f"text number {i}" for i in range(5000)])
        print("ENCODED", out.shape, flush=True)
        if args.tasks:
            _tasks(enc, args.replica, args.tasks, args.chunk_sizes)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
    import os

    os._exit(0)


if __name__ == "__main__":
    main()
