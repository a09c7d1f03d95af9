"""Sparse retrieval scoring on a Touche2020-sized corpus: synthetic sparse rows, measured on this machine.

Touche2020 (BEIR) has 382,545 documents and 49 queries. SPLADE-style rows are drawn at random: documents with
100-200 non-zeros, queries with about 20, over a 30,522-id vocabulary (BERT's WordPiece), ids drawn from a Zipf-like
distribution (frequent terms are in many documents, as in text), weights uniform in (0, 3). The corpus is scored
as :func:`vllm_eval.models.sparse_encoder.search.top_k_sparse` scores it (CSR queries x the corpus as CSC, top 1000
per query), in one chunk and in :data:`~vllm_eval.models.encoder.search.ENCODE_CHUNK`-document chunks, and checked
against a dense float64 computation for a few queries.

``--device cuda`` (or ``cpu``) also runs the same search with torch sparse tensors there (a measurement only: the
library's search stays on scipy): each chunk's ``D.T`` uploaded once as a ``torch.sparse_csr_tensor`` (int32
indices), then per block of queries the sparse-sparse product ``Q_block @ D.T``, made dense, ``torch.topk``, merged
over chunks; timed with the corpus already on the device (the upload is printed apart), its top-k scores compared
with scipy's.

    python scripts/sparse_bench.py [--docs 382545] [--queries 49] [--repeat 3] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

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


def torch_device(name: str | None) -> Any:
    """The torch device of ``--device`` (None without it).

    Raises:
        SystemExit: ``cuda`` without a CUDA device (status 2, one line on standard error).
    """
    if name is None:
        return None
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        print("sparse_bench.py: error: --device cuda: torch sees no CUDA device here; --device cpu times the torch "
              "path on the CPU", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    # torch warns that sparse CSR is in beta, once per process: not news for a measurement.
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    return torch.device(name)


def torch_csr(m: Any, device: Any) -> Any:
    """A scipy CSR matrix as a ``torch.sparse_csr_tensor`` on ``device``: int32 indices (half int64's memory; the
    corpus's 53 million non-zeros fit), invariants not checked (scipy's CSR already keeps them)."""
    import torch

    return torch.sparse_csr_tensor(
        torch.from_numpy(m.indptr.astype(np.int32)),
        torch.from_numpy(m.indices.astype(np.int32)),
        torch.from_numpy(m.data),
        size=m.shape,
        device=device,
        check_invariants=False,
    )


def synchronize(device: Any) -> None:
    """Wait for ``device``'s queued work, so a timer stops when the work is done (CUDA runs asynchronously)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def upload(chunks: Any, device: Any) -> list[Any]:
    """Each corpus chunk's ``D.T`` (vocab, n_docs) on ``device``: a CSC of D is a CSR of D.T, as
    :func:`~vllm_eval.models.sparse_encoder.search.top_k_sparse` turns it."""
    import scipy.sparse as sp

    out = [torch_csr(sp.csc_matrix(c, dtype=np.float32).T, device) for c in chunks]
    synchronize(device)
    return out


def top_k_torch(queries: Any, corpus_t: list[Any], k: int, device: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~vllm_eval.models.sparse_encoder.search.top_k_sparse` with torch on ``device``: ``corpus_t`` from
    :func:`upload`; per chunk and block of queries ``Q_block @ D.T`` (sparse x sparse), dense, ``torch.topk``, merged
    over chunks. Returns (scores float32, corpus indices int64), (n_queries, k'), best first (ties in any order)."""
    import torch

    from vllm_eval.models.sparse_encoder.search import BLOCK_ENTRIES

    n = queries.shape[0]
    best = torch.empty((n, 0), device=device), torch.empty((n, 0), dtype=torch.int64, device=device)
    offset = 0
    for dt in corpus_t:
        n_docs = dt.shape[1]
        rows = max(BLOCK_ENTRIES // max(n_docs, 1), 1)
        keep = min(k, n_docs)
        parts = [
            torch.topk((torch_csr(queries[lo : lo + rows], device) @ dt).to_dense(), keep, dim=1)
            for lo in range(0, n, rows)
        ]
        scores = torch.cat([best[0], torch.cat([p.values for p in parts])], dim=1)
        index = torch.cat([best[1], torch.cat([p.indices for p in parts]) + offset], dim=1)
        if scores.shape[1] > k:
            scores, order = torch.topk(scores, k, dim=1)
            index = torch.gather(index, 1, order)
        best = scores, index
        offset += n_docs
    synchronize(device)
    return best[0].cpu().numpy(), best[1].cpu().numpy()


def timed_runs(run: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """``repeat`` wall times of ``run()`` and its last result."""
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return times, out


def rate(times: list[float], args: argparse.Namespace) -> str:
    """``best ... s, median ... s over N runs (... M query-document scores/s)``."""
    return (
        f"best {min(times):.3f} s, median {np.median(times):.3f} s over {len(times)} runs "
        f"({args.queries * args.docs / min(times) / 1e6:.0f} M query-document scores/s)"
    )


def main() -> None:
    from vllm_eval.models.encoder.search import ENCODE_CHUNK
    from vllm_eval.models.sparse_encoder.search import top_k_sparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=382_545)
    parser.add_argument("--queries", type=int, default=49)
    parser.add_argument("--vocab", type=int, default=30_522)
    parser.add_argument("--top-k", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], default=None, help="also time the search with torch sparse tensors there"
    )
    args = parser.parse_args()
    device = torch_device(args.device)  # before the corpus is built: a missing GPU is said at once
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
        times, (scores, _) = timed_runs(lambda make=chunks: top_k_sparse(queries, make(), args.top_k), args.repeat)
        print(f"top_k_sparse, {label}: {rate(times, args)}")
        if device is not None:
            torch_search(queries, list(chunks()), scores, device, label, args)
    dense_check(queries, docs, top_k_sparse)


def torch_search(queries: Any, chunks: list[Any], expected: np.ndarray, device: Any, label: str, args: Any) -> None:
    """Time :func:`top_k_torch` on ``device`` (after one untimed run: CUDA's context and cuSPARSE's handles start on
    the first call) and print it with the upload's time and the largest |Δ| of its top-k scores against scipy's
    ``expected`` (indices may differ where scores tie)."""
    start = time.perf_counter()
    corpus_t = upload(chunks, device)
    uploaded = time.perf_counter() - start
    top_k_torch(queries, corpus_t, args.top_k, device)
    times, (scores, _) = timed_runs(lambda: top_k_torch(queries, corpus_t, args.top_k, device), args.repeat)
    delta = float(np.abs(scores.astype(np.float64) - expected).max())
    print(
        f"torch sparse ({device.type}), {label}: {rate(times, args)}; corpus to the device {uploaded:.3f} s; "
        f"top-{scores.shape[1]} scores vs scipy: max |delta| {delta:.2e}"
    )


def dense_check(queries: Any, docs: Any, top_k_sparse: Callable[..., Any]) -> None:
    """scipy's top 10 of 3 queries against a dense float64 product (over the first 50,000 documents at most)."""
    sub = docs[:50_000]
    check = queries[:3].toarray().astype(np.float64) @ sub.toarray().astype(np.float64).T
    s, _ = top_k_sparse(queries[:3], [sub], 10)
    expect = -np.sort(-check, axis=1)[:, :10]
    print(
        f"check vs dense float64 (3 queries x {check.shape[1]:,} documents, top 10): max |delta| "
        f"{np.abs(s - expect).max():.2e}"
    )


if __name__ == "__main__":
    main()
