"""Time the pieces of a full-corpus retrieval search after the corpus is encoded (vllm_eval.models.encoder.search), on
this machine: the corpus's ids and texts read from a ``datasets.Dataset``, CUDA's start in this process, and
``best_documents`` (scores and top k) on the GPU and on the CPU, then mteb's result dicts.

    python3 scripts/search_bench.py [--docs 200000] [--queries 1000] [--dim 768] [--k 1000] [--warm]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--warm", action="store_true", help="warm_scoring first (as the search does), waited for")
    args = parser.parse_args()

    import datasets
    import numpy as np
    import torch
    from mteb.similarity_functions import cos_sim

    from vllm_eval.models.encoder import search

    n = args.docs
    corpus = datasets.Dataset.from_dict(
        {"id": [f"d{i}" for i in range(n)], "title": [""] * n, "text": [f"document {i} " * 8 for i in range(n)]}
    )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    d = rng.standard_normal((n, args.dim), dtype=np.float32)

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        print(f"{name:40s} {time.perf_counter() - t0:8.3f} s", flush=True)
        return out

    timed("list(corpus['id']) (row by row)", lambda: list(corpus["id"]))
    ids = timed("column(corpus, 'id')", lambda: search.column(corpus, "id"))
    timed("document_texts(corpus)", lambda: search.document_texts(corpus))
    if torch.cuda.is_available():
        if args.warm:
            timed("warm_scoring (on its thread, waited for)", lambda: search.warm_scoring(cos_sim, q, args.k).join())
        timed("CUDA start in this process", lambda: torch.zeros(1, device="cuda"))
        timed("best_documents, GPU", lambda: search.best_documents(cos_sim, q, [d], args.k))
        scores, index = timed("best_documents, GPU, again", lambda: search.best_documents(cos_sim, q, [d], args.k))
    cpu = search.DEVICE_BYTES
    search.DEVICE_BYTES = 0  # as when the engines leave no room: scored on the CPU
    try:
        scores, index = timed("best_documents, CPU", lambda: search.best_documents(cos_sim, q, [d], args.k))
    finally:
        search.DEVICE_BYTES = cpu

    def dicts():
        values, rows = scores.tolist(), index.tolist()
        return {f"q{i}": {ids[j]: s for s, j in zip(values[i], rows[i], strict=True)} for i in range(len(q))}

    timed("result dicts", dicts)


if __name__ == "__main__":
    main()
