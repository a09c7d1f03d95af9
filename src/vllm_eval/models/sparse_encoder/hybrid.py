"""BGE-M3's "all" mode: retrieval by the weighted sum of its dense, sparse and ColBERT scores.

BGE-M3 (Chen et al. 2024, arXiv:2402.03216, §3.2) scores a query q against a passage p three ways, from one model:

* dense: ``e_q · e_p``, the dot product of the L2-normalised CLS vectors (a cosine);
* sparse (lexical matching): ``sum over the ids t in both of w_q[t] * w_p[t]``, the lexical weights' dot product
  (FlagEmbedding's ``compute_lexical_matching_score``);
* multi-vector (ColBERT): ``1/N_q * sum over q's N_q vectors of max over p's vectors of q_i · p_j`` (a MaxSim
  averaged over the query's vectors, FlagEmbedding's ``M3Embedder.colbert_score``; the vectors are every token
  but CLS, L2-normalised);

and ranks by ``(w_dense * dense + w_sparse * sparse + w_colbert * colbert) / (w_dense + w_sparse + w_colbert)``,
FlagEmbedding's ``BGEM3FlagModel.compute_score`` (``FlagEmbedding/inference/embedder/encoder_only/m3.py``, key
``colbert+sparse+dense``), whose default weights are ``[1, 1, 1]`` (:data:`DEFAULT_WEIGHTS`, kept here; its
README's example passes ``[0.4, 0.2, 0.4]``).

How a search runs (:class:`HybridSearch`), so that a full-size corpus stays feasible: ColBERT vectors of a whole
corpus do not fit in memory (382,545 Touche2020 documents x ~200 tokens x 1,024 float32 = ~300 GB), so the
weighted sum is computed over candidates:

1. first stage, dense: the queries and the whole corpus are embedded (one pass, in chunks of
   :data:`~vllm_eval.models.encoder.search.ENCODE_CHUNK`), and each query keeps its ``max(top_k,
   first_stage_k)`` best documents by dense score (:data:`FIRST_STAGE_K` = 100 by default); a corpus of at most
   that many documents is scored exactly (every document a candidate). A task with candidates of its own
   (``top_ranked``: reranking) uses those instead;
2. the candidate documents (each once, in blocks of :data:`DOC_BLOCK`) get their lexical weights, then their
   ColBERT vectors, and each (query, candidate) pair its sparse and ColBERT score;
3. each query's candidates are ranked by the weighted sum, the ``top_k`` best kept.

Documents outside a query's dense top ``first_stage_k`` are not ranked for it (their weighted score is not
computed): a recall bound the dense first stage sets, as any re-ranking pipeline has. Each stage's model output
is a backend's hook (:meth:`HybridSearch._hybrid_phase`, ``_hybrid_dense``, ``_hybrid_colbert``, and the sparse
encoder's own ``encode_sparse``), so the vLLM backend runs one engine per output (vLLM 0.32 serves one pooling
task per engine) and the transformers reference the same computation from its one model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ...utils.errors import UsageError
from ..encoder.search import ENCODE_CHUNK, column, document_texts, flat_query_texts
from ..ranked import RankedLists, as_results, best_first, refuse_other_task_types
from .search import SparseSearch, _top, pair_scores

#: FlagEmbedding's default weights of ``compute_score`` (dense, sparse, ColBERT).
DEFAULT_WEIGHTS = (1.0, 1.0, 1.0)
#: Documents per query kept by the dense first stage (at least ``top_k``).
FIRST_STAGE_K = 100
#: Candidate documents encoded at once for the sparse and ColBERT stages.
DOC_BLOCK = 4096
#: The mteb task types "all" mode ranks documents for (a query against documents; no vector for other types).
HYBRID_TASK_TYPES = ("Retrieval", "Reranking", "InstructionRetrieval", "InstructionReranking")


def check_weights(weights: Any) -> tuple[float, float, float] | None:
    """``weights`` (dense, sparse, ColBERT) as three floats, or None.

    Raises:
        UsageError: not three finite numbers >= 0 with a positive sum.
    """
    if weights is None:
        return None
    try:
        out = tuple(float(x) for x in weights)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or not all(math.isfinite(x) and x >= 0 for x in out) or sum(out) <= 0:
        raise UsageError(
            f"--bge-m3-weights takes three numbers >= 0 with a positive sum (W_DENSE W_SPARSE W_COLBERT), "
            f"not {weights!r}"
        )
    return out  # type: ignore[return-value]


def check_hybrid_task_types(tasks: list[Any]) -> None:
    """Refuse, before anything loads, tasks that "all" mode cannot score: it ranks documents for a query by a
    weighted sum of three pair scores, with no single vector to give classification, clustering or STS (neither
    FlagEmbedding nor mteb defines "all" for them).

    Raises:
        UsageError: naming the first such task and its type.
    """
    reason = "--bge-m3-mode all ranks documents for queries (retrieval and reranking tasks only)"
    refuse_other_task_types(tasks, HYBRID_TASK_TYPES, reason, ": use --bge-m3-mode dense for it")


def colbert_score(query: np.ndarray, doc: np.ndarray) -> float:
    """FlagEmbedding's ``colbert_score``: the mean over the query's vectors (float32 (n_q, dim)) of their largest
    dot product with the document's (float32 (n_d, dim)); 0.0 when either has no vector."""
    if not len(query) or not len(doc):
        return 0.0
    sims = np.asarray(query, dtype=np.float32) @ np.asarray(doc, dtype=np.float32).T
    return float(sims.max(axis=1).mean())


def weighted(weights: Sequence[float], dense: np.ndarray, sparse: np.ndarray, colbert: np.ndarray) -> np.ndarray:
    """``(w_d * dense + w_s * sparse + w_c * colbert) / sum(w)`` (``compute_score``'s ``colbert+sparse+dense``),
    float32 of the inputs' shape."""
    w = [float(x) for x in weights]
    total = w[0] * dense.astype(np.float64) + w[1] * sparse.astype(np.float64) + w[2] * colbert.astype(np.float64)
    return (total / sum(w)).astype(np.float32)


def dense_candidates(queries: np.ndarray, docs_chunks: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best documents per query by dot product of dense vectors, over the corpus in chunks.

    Args:
        queries: float32 (n_queries, dim).
        docs_chunks: iterable of float32 (n_i, dim), the corpus in order.
        k: documents kept per query.

    Returns:
        (scores float32 (n_queries, k'), corpus indices int64 (n_queries, k')), best first (ties: the lower
        index), k' = min(k, corpus size).
    """
    q = np.asarray(queries, dtype=np.float32)
    best_scores = np.empty((len(q), 0), dtype=np.float32)
    best_index = np.empty((len(q), 0), dtype=np.int64)
    offset = 0
    for chunk in docs_chunks:
        scores = q @ np.asarray(chunk, dtype=np.float32).T
        values, index = _top(scores, min(k, scores.shape[1]))
        best_scores = np.concatenate([best_scores, values], axis=1)
        best_index = np.concatenate([best_index, index + offset], axis=1)
        best_scores, order = _top(best_scores, min(k, best_scores.shape[1]), index_order=best_index)
        best_index = np.take_along_axis(best_index, order, axis=1)
        offset += scores.shape[1]
    return best_scores, best_index


class HybridSearch(SparseSearch):
    """mteb's ``SearchProtocol`` of a BGE-M3 sparse encoder: the sparse search, or, with :attr:`bge_m3_weights`
    set, BGE-M3's "all" mode (see the module doc). A backend supplies the dense and ColBERT outputs:
    ``_hybrid_dense(texts) -> float32 (n, dim)`` and ``_hybrid_colbert(texts) -> [float32 (n_tokens, dim)]``,
    called inside :meth:`_hybrid_phase` of their mode."""

    #: (w_dense, w_sparse, w_colbert), or None: the plain sparse search.
    bge_m3_weights: tuple[float, float, float] | None = None
    first_stage_k: int = FIRST_STAGE_K
    #: The plain search is mteb's own ``SearchEncoderWrapper`` over ``encode`` and ``similarity`` (a reference
    #: backend keeps mteb's path), not :class:`SparseSearch`'s.
    plain_search_by_mteb: bool = False

    def experiment(self) -> dict[str, Any]:
        """The backend's experiment plus, in "all" mode, ``bge_m3: all-<weights>``: its results go to an mteb
        experiment folder of their own, never read back as the sparse mode's (same model, same tasks)."""
        out = super().experiment()  # type: ignore[misc]
        if self.bge_m3_weights is not None:
            out["bge_m3"] = "all-" + "-".join(f"{w:g}" for w in self.bge_m3_weights)
        return out

    @contextmanager
    def _hybrid_phase(self, mode: str) -> Iterator[None]:
        """Where ``mode``'s (``dense``, ``sparse``, ``colbert``) outputs are computed; a backend that needs an
        engine per output starts it here."""
        yield

    def _hybrid_dense(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def _hybrid_colbert(self, texts: list[str]) -> list[np.ndarray]:
        raise NotImplementedError

    def search(self, queries: Any, *, task_metadata: Any, hf_split: str, hf_subset: str, top_k: int,
               encode_kwargs: dict[str, Any], top_ranked: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """The sparse search, or with :attr:`bge_m3_weights` each query's ``top_k`` documents by BGE-M3's weighted
        score (mteb's ``RetrievalOutputType``; a :class:`~vllm_eval.models.ranked.RankedLists` where read so).

        Raises:
            ValueError: :meth:`index` was not called first (as mteb's wrapper); conversation queries.
        """
        if self.bge_m3_weights is None and self.plain_search_by_mteb:
            from mteb.models.search_wrappers import SearchEncoderWrapper

            wrapper = SearchEncoderWrapper(self)
            where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
            wrapper.index(self._indexed_corpus(), encode_kwargs=encode_kwargs, **where)
            return wrapper.search(queries, top_k=top_k, encode_kwargs=encode_kwargs, top_ranked=top_ranked, **where,
                                  **kwargs)  # fmt: skip
        if self.bge_m3_weights is None:
            where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
            return super().search(queries, top_k=top_k, encode_kwargs=encode_kwargs, top_ranked=top_ranked, **where,
                                  **kwargs)  # fmt: skip
        from mteb.types import PromptType

        corpus = self._indexed_corpus()
        texts = flat_query_texts(queries)
        prefix = {t: self.prompting.prefix(task_metadata, t) for t in (PromptType.query, PromptType.document)}
        q_texts = [prefix[PromptType.query] + t for t in texts]
        d_texts = [prefix[PromptType.document] + t for t in document_texts(corpus)]
        query_ids, doc_ids = column(queries, "id"), column(corpus, "id")
        if not query_ids or not doc_ids:  # nothing to rank (and no engine to start for it)
            return {qid: {} for qid in query_ids}
        pair_query, pair_doc, dense = self._first_stage(q_texts, d_texts, query_ids, doc_ids, top_ranked, top_k)
        sparse, colbert = self._rescore(q_texts, d_texts, pair_query, pair_doc)
        scores = weighted(self.bge_m3_weights, dense, sparse, colbert)
        counts = np.bincount(pair_query, minlength=len(query_ids))
        keep, kept = best_first(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), scores, top_k)
        offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
        return as_results(RankedLists(query_ids, offsets, pair_doc[keep], scores[keep], doc_ids))

    def _first_stage(self, q_texts: list[str], d_texts: list[str], query_ids: list[str], doc_ids: list[str],
                     top_ranked: Any, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """(pair query indices int64, pair document indices int64, dense scores float32), grouped by query in
        order: the dense top ``max(top_k, first_stage_k)``, or the task's own candidates."""
        with self._hybrid_phase("dense"):
            q = self._hybrid_dense(q_texts)
            if top_ranked is None:
                chunks = (
                    self._hybrid_dense(d_texts[lo : lo + ENCODE_CHUNK]) for lo in range(0, len(d_texts), ENCODE_CHUNK)
                )
                scores, index = dense_candidates(q, chunks, max(top_k, self.first_stage_k))
                pair_query = np.repeat(np.arange(len(q_texts), dtype=np.int64), index.shape[1])
                return pair_query, index.ravel(), scores.ravel()
            where = {x: i for i, x in enumerate(doc_ids)}
            lists = [[where[d] for d in (top_ranked.get(qid) or [])] for qid in query_ids]
            pair_query = np.repeat(np.arange(len(lists), dtype=np.int64), [len(x) for x in lists])
            pair_doc = np.asarray([d for x in lists for d in x], dtype=np.int64)
            dense = np.zeros(len(pair_doc), dtype=np.float32)
            for block, at in _doc_blocks(pair_doc):
                d = self._hybrid_dense([d_texts[i] for i in block])
                dense[at] = np.einsum("ij,ij->i", q[pair_query[at]], d[np.searchsorted(block, pair_doc[at])])
            return pair_query, pair_doc, dense

    def _rescore(self, q_texts: list[str], d_texts: list[str], pair_query: np.ndarray,
                 pair_doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The sparse and ColBERT score of each (query, document) pair: float32 (n_pairs,) each; each candidate
        document encoded once per output."""
        sparse = np.zeros(len(pair_doc), dtype=np.float32)
        colbert = np.zeros(len(pair_doc), dtype=np.float32)
        with self._hybrid_phase("sparse"):
            q = self.encode_sparse(q_texts)
            for block, at in _doc_blocks(pair_doc):
                d = self.encode_sparse([d_texts[i] for i in block])
                sparse[at] = pair_scores(q, d, pair_query[at], np.searchsorted(block, pair_doc[at]))
        with self._hybrid_phase("colbert"):
            qv = self._hybrid_colbert(q_texts)
            for block, at in _doc_blocks(pair_doc):
                dv = self._hybrid_colbert([d_texts[i] for i in block])
                local = np.searchsorted(block, pair_doc[at])
                colbert[at] = [colbert_score(qv[i], dv[j]) for i, j in zip(pair_query[at], local, strict=True)]
        return sparse, colbert


def _doc_blocks(pair_doc: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(distinct document indices of a block, ascending; the pair positions whose document is in it), over
    blocks of :data:`DOC_BLOCK` distinct candidate documents."""
    distinct = np.unique(pair_doc)
    for lo in range(0, len(distinct), DOC_BLOCK):
        block = distinct[lo : lo + DOC_BLOCK]
        yield block, np.flatnonzero(np.isin(pair_doc, block))
