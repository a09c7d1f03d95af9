"""Retrieval over sparse vectors: sparse matrix products, top k per query, as mteb's ``SearchProtocol``.

The queries are one ``scipy.sparse.csr_matrix`` Q (n_queries, vocab), the corpus is encoded in chunks of
:data:`~vllm_eval.models.encoder.search.ENCODE_CHUNK` documents, each chunk's matrix D turned to CSC once
(``D.T`` is then a CSR without a copy of its data) and scored in blocks of queries: ``Q_block @ D.T`` is a
sparse-sparse product whose cost is the number of (query term, document with that term) pairs (an inverted
index's work) and whose result is made dense per block (at most :data:`BLOCK_ENTRIES` values) for the top
``k`` (``np.argpartition``), merged over chunks. Scores are mteb's (``SparseEncoderWrapper.similarity``:
sentence-transformers' dot product over the vectors), in float32 with the sum in another order: equal up to
rounding, and documents with equal scores may swap. Tasks with candidates per query (``top_ranked``) score each
(query, candidate) pair by a row-wise product (:func:`pair_scores`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..encoder.search import ENCODE_CHUNK, IndexedCorpus, column, document_texts, flat_query_texts
from ..ranked import RankedLists, as_results, best_first

#: Dense score entries per block of queries (queries x documents of one chunk): 2^25 float32 = 128 MiB.
BLOCK_ENTRIES = 1 << 25


def top_k_sparse(queries: Any, docs_chunks: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best documents per query over the corpus, by dot product.

    Args:
        queries: ``scipy.sparse`` (n_queries, vocab) float32.
        docs_chunks: iterable of ``scipy.sparse`` (n_i, vocab) float32 matrices, the corpus in order.
        k: documents kept per query.

    Returns:
        (scores float32 (n_queries, k'), corpus indices int64 (n_queries, k')), best first (equal scores: the
        lower index first), with k' = min(k, corpus size).
    """
    import scipy.sparse as sp

    q = sp.csr_matrix(queries, dtype=np.float32)
    n = q.shape[0]
    best_scores = np.empty((n, 0), dtype=np.float32)
    best_index = np.empty((n, 0), dtype=np.int64)
    offset = 0
    for chunk in docs_chunks:
        dt = sp.csc_matrix(chunk, dtype=np.float32).T  # CSR (vocab, n_docs) without copying the data
        n_docs = dt.shape[1]
        rows = max(BLOCK_ENTRIES // max(n_docs, 1), 1)
        keep = min(k, n_docs)
        values = np.empty((n, keep), dtype=np.float32)
        index = np.empty((n, keep), dtype=np.int64)
        for lo in range(0, n, rows):
            scores = (q[lo : lo + rows] @ dt).toarray()
            values[lo : lo + rows], index[lo : lo + rows] = _top(scores, keep)
        best_scores = np.concatenate([best_scores, values], axis=1)
        best_index = np.concatenate([best_index, index + offset], axis=1)
        if best_scores.shape[1] > k:
            best_scores, order = _top(best_scores, k, index_order=best_index)
            best_index = np.take_along_axis(best_index, order, axis=1)
        offset += n_docs
    return best_scores, best_index


def _top(scores: np.ndarray, k: int, index_order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` largest values, descending, and their columns; equal values by ascending column (or by
    ascending ``index_order`` value): the order ``torch.topk`` gives on the CPU is not specified for ties."""
    if k < scores.shape[1]:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape).copy()
    values = np.take_along_axis(scores, part, axis=1)
    ties = part if index_order is None else np.take_along_axis(index_order, part, axis=1)
    order = np.lexsort((ties, -values), axis=1)
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(part, order, axis=1)


def pair_scores(queries: Any, docs: Any, pair_query: np.ndarray, pair_doc: np.ndarray) -> np.ndarray:
    """The dot product of each (query row, document row) pair: float32 (n_pairs,)."""
    import scipy.sparse as sp

    q, d = sp.csr_matrix(queries, dtype=np.float32), sp.csr_matrix(docs, dtype=np.float32)
    out = np.empty(len(pair_query), dtype=np.float32)
    step = 1 << 16
    for lo in range(0, len(pair_query), step):
        a, b = q[pair_query[lo : lo + step]], d[pair_doc[lo : lo + step]]
        out[lo : lo + step] = np.asarray(a.multiply(b).sum(axis=1), dtype=np.float32).ravel()
    return out


class SparseSearch(IndexedCorpus):
    """mteb's ``SearchProtocol`` for a sparse encoder: mixed into a
    :class:`~vllm_eval.models.sparse_encoder.base.SparseEncoderBase` (its ``encode_csr``)."""

    def search(self, queries: Any, *, task_metadata: Any, hf_split: str, hf_subset: str, top_k: int,
               encode_kwargs: dict[str, Any], top_ranked: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """Each query's ``top_k`` documents with their dot-product scores (mteb's ``RetrievalOutputType``; a
        :class:`~vllm_eval.models.ranked.RankedLists` where this thread's scoring reads one).

        Raises:
            ValueError: :meth:`index` was not called first (as mteb's wrapper).
        """
        from mteb.types import PromptType

        corpus = self._indexed_corpus()
        where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
        batch = encode_kwargs.get("batch_size", 32)
        q = self._encode_column(flat_query_texts(queries), PromptType.query, where, batch)
        query_ids, doc_ids = column(queries, "id"), column(corpus, "id")
        texts = document_texts(corpus)
        if top_ranked is not None:
            d = self._encode_column(texts, PromptType.document, where, batch)
            return _rank_candidates(q, d, query_ids, doc_ids, top_ranked, top_k)
        chunks = (self._encode_column(texts[lo : lo + ENCODE_CHUNK], PromptType.document, where, batch)
                  for lo in range(0, len(texts), ENCODE_CHUNK))  # fmt: skip
        scores, index = top_k_sparse(q, chunks, top_k)
        offsets = np.arange(len(query_ids) + 1, dtype=np.int64) * index.shape[1]
        return as_results(RankedLists(query_ids, offsets, index.ravel(), scores.ravel(), doc_ids))

    def _encode_column(self, texts: list[str], prompt_type: Any, where: dict[str, Any], batch: int) -> Any:
        from ..streaming import Batches

        return self.encode_csr(Batches.of_texts(texts, batch), prompt_type=prompt_type, **where)


def _rank_candidates(q: Any, d: Any, query_ids: list[str], doc_ids: list[str], top_ranked: dict[str, list[str]],
                     k: int) -> Any:  # fmt: skip
    """Each query's candidates scored by dot product and the ``k`` best kept (mteb's reranking search)."""
    import itertools

    doc_index = {x: i for i, x in enumerate(doc_ids)}
    lists = [top_ranked.get(qid) or [] for qid in query_ids]
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    pair_query = np.repeat(np.arange(len(query_ids)), counts)
    flat = itertools.chain.from_iterable(lists)
    pair_doc = np.fromiter(map(doc_index.__getitem__, flat), dtype=np.int64, count=int(counts.sum()))
    scores = pair_scores(q, d, pair_query, pair_doc)
    keep, kept = best_first(np.concatenate([[0], np.cumsum(counts)]), scores, k)
    offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    return as_results(RankedLists(query_ids, offsets, pair_doc[keep], scores[keep], doc_ids))
