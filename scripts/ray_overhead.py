"""Ray actors against local replicas on the same work, side by side in one run: the same encoder, the same
texts, ``--data-parallel-size N`` local processes, then N Ray actors (``--per-gpu``: N replicas sharing one GPU,
``--replicas-per-gpu N``, both ways).

    python scripts/ray_overhead.py [--address auto] [--replicas 2] [--per-gpu] [--n-texts 20000] [--model PATH]
                                   [--dtype D]

Without ``--address`` a loopback CPU cluster is started (vllm_eval.testing.ray_cluster) and stopped again.
Prints, per layout and round, seconds until the replicas were ready, encode seconds, texts/s and tokens/s, and the
ratio of Ray to local; the outputs of both are compared (minimum per-text cosine).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np


def _measure(label: str, texts: list[str], tokens: int, **kwargs) -> tuple[np.ndarray, dict]:
    from vllm_eval import VllmEncoder

    started = time.perf_counter()
    enc = VllmEncoder(show_progress_bar=False, **kwargs)
    ready = time.perf_counter() - started
    try:
        enc.encode_texts(texts[:64])  # first-call costs (graph capture on a GPU) out of the timing
        t = time.perf_counter()
        out = enc.encode_texts(texts)
        seconds = time.perf_counter() - t
    finally:
        enc.close()
    row = {"layout": label, "ready_s": ready, "encode_s": seconds, "texts_s": len(texts) / seconds}
    row["tokens_s"] = tokens / seconds
    print(
        f"{label:28s} ready {ready:6.1f} s  encode {seconds:7.2f} s  {row['texts_s']:10,.0f} texts/s  "
        f"{row['tokens_s']:12,.0f} tok/s",
        flush=True,
    )
    return out, row


def main() -> None:
    from vllm_eval.measure.bench import make_texts
    from vllm_eval.testing import ray_cluster, row_cosines
    from vllm_eval.utils.modelinfo import packaged_model_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=None, help="a running cluster (default: start a loopback one)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--n-texts", type=int, default=20000)
    parser.add_argument("--model", default=None, help="default: the packaged all-MiniLM-L6-v2")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--lengths", default="mixed:16-250", help="token counts, as bench --lengths")
    parser.add_argument("--per-gpu", action="store_true", help="the replicas share one GPU (replicas_per_gpu)")
    parser.add_argument("--rounds", type=int, default=1, help="local then Ray, this many times (order effects)")
    args = parser.parse_args()
    model = args.model or str(packaged_model_path())
    engine = {"dtype": args.dtype} if args.dtype else {}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts, counts = make_texts(tokenizer, args.n_texts, args.lengths, seed=0)
    tokens = sum(min(c, tokenizer.model_max_length) for c in counts)  # as the engine sees them (truncated)
    cluster = contextlib.nullcontext(args.address) if args.address else ray_cluster(num_cpus=args.replicas)
    split = {"replicas_per_gpu": args.replicas} if args.per_gpu else {"data_parallel_size": args.replicas}
    layout = {"model": model, **split, **engine}
    with cluster as address:
        for _ in range(args.rounds):
            local, row_local = _measure(f"local, {args.replicas} replicas", texts, tokens, **layout)
            remote, row_ray = _measure(f"Ray, {args.replicas} actors", texts, tokens, ray_address=address, **layout)
            print(
                f"Ray / local: ready {row_ray['ready_s'] / row_local['ready_s']:.2f}x, "
                f"encode throughput {row_ray['tokens_s'] / row_local['tokens_s']:.3f}x; "
                f"min cosine {row_cosines(remote, local).min():.8f} over {len(texts)} texts",
                flush=True,
            )


if __name__ == "__main__":
    main()
