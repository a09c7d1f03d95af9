"""Sparse retrieval scoring on a Touche2020-sized corpus: synthetic sparse rows, measured on this machine.

Touche2020 (BEIR) has 382,545 documents and 49 queries. SPLADE-style rows are drawn at random: documents with
100-200 non-zeros, queries with about 20, over a 30,522-id vocabulary (BERT's WordPiece), ids drawn from a Zipf-like
distribution (frequent terms are in many documents, as in text), weights uniform in (0, 3). The corpus is scored
as :func:`vllm_eval.models.sparse_encoder.search.top_k_sparse` scores it (CSR queries x the corpus as CSC, top 1000
per query), in one chunk and in :data:`~vllm_eval.models.encoder.search.ENCODE_CHUNK`-document chunks, and checked
against a dense float64 computation for a few queries.

    python scripts/sparse_bench.py [--docs 382545] [--queries 49] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def random_rows(n: int, low: int, high: int, vocab: int, rng: np.random.Generator):
    """A CSR (n, vocab) float32 of rows with ``low``..``high`` non-zeros each (ids Zipf-like, distinct per row)."""
    import scipy.sparse as sp

    counts = rng.integers(low, high + 1, n)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = 1.0 / ranks**0.8
    p /= p.sum()
    ids = rng.choice(vocab, size=int(counts.sum()), p=p).astype(np.int32)
    rows = np.repeat(np.arange(n), counts)
    weights = rng.uniform(0.01, 3.0, len(ids)).astype(np.float32)
    m = sp.csr_matrix((weights, (rows, ids)), shape=(n, vocab), dtype=np.float32)  # repeated ids summed
    m.sum_duplicates()
    return m


def main() -> None:
    from vllm_eval.models.encoder.search import ENCODE_CHUNK
    from vllm_eval.models.sparse_encoder.search import top_k_sparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=382_545)
    parser.add_argument("--queries", type=int, default=49)
    parser.add_argument("--vocab", type=int, default=30_522)
    parser.add_argument("--top-k", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    docs = random_rows(args.docs, 100, 200, args.vocab, rng)
    queries = random_rows(args.queries, 15, 25, args.vocab, rng)
    built = time.perf_counter() - start
    print(
        f"cores: {len(os.sched_getaffinity(0))}; corpus {docs.shape[0]:,} x {docs.shape[1]:,}, {docs.nnz:,} non-zeros "
        f"({docs.nnz / docs.shape[0]:.0f}/doc, {docs.data.nbytes + docs.indices.nbytes + docs.indptr.nbytes >> 20} MiB "
        f"as CSR); {queries.shape[0]} queries, {queries.nnz / queries.shape[0]:.0f} non-zeros each; "
        f"built in {built:.1f} s"
    )
    for label, chunks in (
        ("one chunk", lambda: [docs]),
        (
            f"{ENCODE_CHUNK:,}-document chunks",
            lambda: (docs[lo : lo + ENCODE_CHUNK] for lo in range(0, docs.shape[0], ENCODE_CHUNK)),
        ),
    ):
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            scores, index = top_k_sparse(queries, chunks(), args.top_k)
            times.append(time.perf_counter() - start)
        print(
            f"top_k_sparse, {label}: best {min(times):.3f} s, median {np.median(times):.3f} s over {args.repeat} "
            f"runs ({args.queries * args.docs / min(times) / 1e6:.0f} M query-document scores/s)"
        )
    check = (
        queries[:3].toarray().astype(np.float64) @ docs.T.toarray().astype(np.float64).T
        if args.docs <= 50_000
        else None
    )
    if check is None:
        sub = docs[:50_000]
        check = queries[:3].toarray().astype(np.float64) @ sub.toarray().astype(np.float64).T
        s, i = top_k_sparse(queries[:3], [sub], 10)
    else:
        s, i = top_k_sparse(queries[:3], [docs], 10)
    expect = -np.sort(-check, axis=1)[:, :10]
    print(
        f"check vs dense float64 (3 queries x {check.shape[1]:,} documents, top 10): max |delta| "
        f"{np.abs(s - expect).max():.2e}"
    )


if __name__ == "__main__":
    main()
