"""Full-corpus retrieval as one stream of encode calls, scored on the GPU when there is one.

mteb runs a retrieval task through a model's own ``index``/``search`` when it has them (mteb's
``SearchProtocol``), else through its ``SearchEncoderWrapper``, which encodes the corpus 50,000
documents at a time and, between two encode calls, scores that chunk against every query on the CPU
and merges the per-query top k in Python heaps: the engine waits while the CPU scores. Here the corpus
is encoded in calls of :data:`ENCODE_CHUNK` documents (one call for most corpora, so every replica is
busy to the end), and the similarity and the top k run in blocks on the GPU of this process when torch
sees one (else on the CPU), with the model's own similarity function. Tasks with candidates per query
(reranking, ``top_ranked``) go through mteb's wrapper unchanged: only their candidates are encoded.

The results are mteb's: the same top ``k`` documents per query with the same scores (up to float
rounding of the matrix product on another device; ties may order differently).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: Documents per encode call of a full-corpus search (embeddings kept in memory at once: 200,000 x 768
#: float32 = 614 MB).
ENCODE_CHUNK = 200_000
#: Score-matrix entries per block on the device (queries x documents): 2^26 float32 = 256 MiB.
BLOCK_ENTRIES = 1 << 26


def _device() -> Any:
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def best_documents(similarity: Any, queries: np.ndarray, docs_chunks: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best documents per query over every chunk of document embeddings.

    Args:
        similarity: ``(a, b) -> scores`` of torch tensors (the model's own, e.g. cosine).
        queries: float32 (n_queries, dim).
        docs_chunks: iterable of float32 (n_i, dim) arrays, the corpus in order.
        k: documents to keep per query.

    Returns:
        (scores float32 (n_queries, k'), corpus indices int64 (n_queries, k')), best first, with
        k' = min(k, corpus size).
    """
    import torch

    device = _device()
    q = torch.as_tensor(queries, device=device)
    best_scores = torch.empty((len(queries), 0), device=device)
    best_index = torch.empty((len(queries), 0), dtype=torch.long, device=device)
    offset = 0
    for chunk in docs_chunks:
        block = max(BLOCK_ENTRIES // max(len(queries), 1), 1)
        for lo in range(0, len(chunk), block):
            d = torch.as_tensor(chunk[lo : lo + block], device=device)
            scores = torch.as_tensor(similarity(q, d), device=device)
            keep = min(k, scores.shape[1])
            values, index = torch.topk(scores, keep, dim=1)
            best_scores = torch.cat([best_scores, values], dim=1)
            best_index = torch.cat([best_index, index + offset + lo], dim=1)
            if best_scores.shape[1] > k:
                best_scores, order = torch.topk(best_scores, k, dim=1)
                best_index = torch.gather(best_index, 1, order)
        offset += len(chunk)
    return best_scores.float().cpu().numpy(), best_index.cpu().numpy()


class CorpusSearch:
    """mteb's ``SearchProtocol`` for an encoder backend (see the module doc): mixed into a class that has
    mteb's ``encode`` and ``similarity`` and ``mteb_model_meta``."""

    _search_corpus: Any = None

    def index(self, corpus: Any, *, task_metadata: Any, hf_split: str, hf_subset: str, **kwargs: Any) -> None:
        """Keep ``corpus`` (mteb's corpus dataset) for :meth:`search`; nothing is encoded yet."""
        self._search_corpus = corpus

    def search(
        self,
        queries: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        top_k: int,
        encode_kwargs: dict[str, Any],
        top_ranked: Any = None,
        num_proc: int | None = None,
        **kwargs: Any,
    ) -> dict[str, dict[str, float]]:
        """Each query's ``top_k`` documents with their scores (mteb's ``RetrievalOutputType``).

        Raises:
            ValueError: :meth:`index` was not called first (as mteb's wrapper).
        """
        from mteb._create_dataloaders import create_dataloader
        from mteb.models.search_wrappers import SearchEncoderWrapper
        from mteb.types import PromptType

        corpus, self._search_corpus = self._search_corpus, None
        if corpus is None:
            raise ValueError("Corpus must be indexed before searching.")
        where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
        if top_ranked is not None:  # candidates per query: mteb's own path encodes only those
            wrapper = SearchEncoderWrapper(self)
            wrapper.index(corpus, encode_kwargs=encode_kwargs, num_proc=num_proc, **where)
            return wrapper.search(
                queries, top_k=top_k, encode_kwargs=encode_kwargs, top_ranked=top_ranked, num_proc=num_proc, **where
            )

        def encoded(data: Any, prompt_type: Any) -> np.ndarray:
            loader = create_dataloader(
                data, task_metadata=task_metadata, prompt_type=prompt_type, num_proc=num_proc, **encode_kwargs
            )
            return np.asarray(self.encode(loader, prompt_type=prompt_type, **where, **encode_kwargs), dtype=np.float32)

        query_embeddings = encoded(queries, PromptType.query)
        chunks = (
            encoded(corpus.select(range(lo, min(lo + ENCODE_CHUNK, len(corpus)))), PromptType.document)
            for lo in range(0, len(corpus), ENCODE_CHUNK)
        )
        scores, index = best_documents(self.similarity, query_embeddings, chunks, top_k)
        doc_ids = list(corpus["id"])
        return {
            qid: {doc_ids[j]: float(s) for s, j in zip(scores[i], index[i], strict=True)}
            for i, qid in enumerate(queries["id"])
        }
