"""Retrieval as one stream of encode calls, scored in blocks on the GPU when there is one.

mteb runs a retrieval task through a model's own ``index``/``search`` when it has them (mteb's
``SearchProtocol``), else through its ``SearchEncoderWrapper``, which (full-corpus search) encodes the
corpus 50,000 documents at a time and, between two encode calls, scores that chunk against every query
on the CPU and merges the per-query top k in Python heaps, so the engine waits while the CPU scores;
and (tasks with candidates per query, ``top_ranked``) scores one query at a time. Here the corpus is
encoded in calls of :data:`ENCODE_CHUNK` documents (one call for most corpora, so every replica is busy
to the end; each document's text built column-wise, :func:`document_texts`), and the scores and the top
k are computed in blocks on the GPU of this process when torch sees one (else on the CPU) with the
model's own similarity: :func:`best_documents` for a full corpus (its GPU kernels loaded while the corpus
is encoded, :func:`warm_scoring`), :func:`rank_candidates` for candidates. A task scored in a task process
(:mod:`vllm_eval.evaluation.task_processes`) searches its candidates there (:func:`search_candidates`, its encode calls
served by the command's backend); a full-corpus search is sent to the command's process, whose GPU scores it.

The results are mteb's: the same top ``k`` documents per query with the same scores (up to float
rounding of the matrix product on another device; documents with equal scores may swap).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from typing import Any

import numpy as np

from ..ranked import RankedLists, as_results, best_first, worker_threads
from ..streaming import Batches

logger = logging.getLogger(__name__)

#: Documents per encode call of a full-corpus search (embeddings kept in memory at once: 200,000 x 768
#: float32 = 614 MB).
ENCODE_CHUNK = 200_000
#: Score-matrix entries per block on the device (queries x documents): 2^26 float32 = 256 MiB.
BLOCK_ENTRIES = 1 << 26
#: Candidates are read from the whole score matrix when it has at most this many entries per candidate pair: one
#: pair scored alone (its two embeddings gathered, normalised, multiplied) cost about as much as 600 entries of a
#: matrix product on a 2-core CPU (MindSmallReranking at full size: 97 million pairs scored alone in 236 s, from
#: the 12.5 billion entries of its matrix in a fraction of that); a GPU favours the matrix more still.
MATRIX_FACTOR = 256


#: Most device memory the scoring may hold at once (the engines keep the rest of the GPU): beyond it the
#: blocks are scored on the CPU, as mteb does.
DEVICE_BYTES = 1 << 30


#: Free GPU memory kept beyond the scoring's own values: cuBLAS's handle and workspace, the caching allocator's
#: rounding. An 8B engine leaves ~10 % of an H200; scoring that took it died with CUBLAS_STATUS_ALLOC_FAILED.
DEVICE_HEADROOM = 512 << 20


def _device(entries: int = 0) -> Any:
    """The GPU when torch sees one, ``entries`` float32 values fit :data:`DEVICE_BYTES` and the GPU has that much
    free (with :data:`DEVICE_HEADROOM`) beside whatever else holds it (the engine), else the CPU."""
    import torch

    if entries * 4 > DEVICE_BYTES or not torch.cuda.is_available():
        return torch.device("cpu")
    free, _ = torch.cuda.mem_get_info()
    return torch.device("cuda") if free >= entries * 4 + DEVICE_HEADROOM else torch.device("cpu")


def gpu_ran_out(exc: BaseException) -> bool:
    """Whether ``exc`` is the GPU lacking memory (torch's out-of-memory, or cuBLAS failing to allocate its
    handle or workspace): the engine beside the scoring took it meanwhile. Such a block is scored on the CPU."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def _to_cpu(exc: BaseException, *tensors: Any) -> list[Any]:
    """``tensors`` moved to the CPU after :func:`gpu_ran_out` (logged once per fallback)."""
    import torch

    logger.warning("scoring on the CPU: the GPU has no room beside the engine (%s)", str(exc).splitlines()[0][:120])
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return [t.cpu() for t in tensors]


def _blocks(queries: np.ndarray, k: int) -> tuple[int, int]:
    """Documents per block of :func:`best_documents` for these queries (its scores and its embeddings each at most
    :data:`BLOCK_ENTRIES` values), and the float32 values it holds at once: the queries, one block of documents and
    its scores, and the running best (values and indices, twice ``k``)."""
    dim = queries.shape[1] if queries.ndim == 2 else 1
    block = max(min(BLOCK_ENTRIES // max(len(queries), 1), BLOCK_ENTRIES // max(dim, 1)), 1)
    return block, queries.size + block * dim + len(queries) * (block + 6 * k)


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

    block, entries = _blocks(queries, k)
    device = _device(entries)
    q = torch.as_tensor(queries, device=device)
    best_scores = torch.empty((len(queries), 0), device=device)
    best_index = torch.empty((len(queries), 0), dtype=torch.long, device=device)
    offset, fell_back = 0, False
    for chunk in docs_chunks:
        for lo in range(0, len(chunk), block):
            try:
                best_scores, best_index = _merged(
                    similarity, q, chunk[lo : lo + block], offset + lo, k, best_scores, best_index
                )
            except Exception as exc:  # the corpus is streamed: the blocks scored so far stay, this one runs again
                if not gpu_ran_out(exc) or fell_back:
                    raise
                fell_back = True
                q, best_scores, best_index = _to_cpu(exc, q, best_scores, best_index)
                best_scores, best_index = _merged(
                    similarity, q, chunk[lo : lo + block], offset + lo, k, best_scores, best_index
                )
        offset += len(chunk)
    return best_scores.float().cpu().numpy(), best_index.cpu().numpy()


def _merged(similarity: Any, q: Any, docs: np.ndarray, first: int, k: int, best_scores: Any, best_index: Any) -> tuple:
    """One block of :func:`best_documents`: ``docs`` (corpus rows from ``first``) scored against ``q`` on its device,
    merged into the running best ``k`` (scores, corpus indices)."""
    import torch

    d = torch.as_tensor(docs, device=q.device)
    scores = torch.as_tensor(similarity(q, d), device=q.device)
    values, index = torch.topk(scores, min(k, scores.shape[1]), dim=1)
    best_scores = torch.cat([best_scores, values], dim=1)
    best_index = torch.cat([best_index, index + first], dim=1)
    if best_scores.shape[1] > k:
        best_scores, order = torch.topk(best_scores, k, dim=1)
        best_index = torch.gather(best_index, 1, order)
    return best_scores, best_index


def column(data: Any, name: str) -> list[Any]:
    """Column ``name`` of a ``datasets.Dataset`` (or a dict of lists) as a list, read at once: ``datasets``
    4+ returns a lazy ``Column`` whose iteration reads one row at a time (``list(ds["id"])``: 1.36 s for 200,000
    ids on a 2-core machine; ``ds["id"][:]``: 0.014 s)."""
    return data[name][:]


def warm_scoring(similarity: Any, queries: np.ndarray, k: int) -> threading.Thread | None:
    """Start, on a thread, one block of :func:`best_documents`' work on the GPU it will score on (``queries``
    against random documents), so that CUDA's first-use costs in this process (kernels loaded on first use,
    cuBLAS's handle, the first large allocations) are paid while the corpus is encoded. Measured on an H100
    (``scripts/search_bench.py``, 1,000 queries x 200,000 documents x 768): the first ``best_documents`` of a process
    took 3.4 s, the second 0.08 s, the CPU 0.98 s.

    Returns:
        the started thread (join it before the process ends), or None where scoring would run on the CPU.
        A failure on the thread is logged at debug level; the scoring itself then meets it again.
    """
    block, entries = _blocks(queries, k)
    device = _device(entries)
    if len(queries) == 0 or device.type != "cuda":
        return None

    def warm() -> None:
        import torch

        try:
            q = torch.as_tensor(queries, device=device)
            d = torch.randn((block, queries.shape[1]), device=device, dtype=q.dtype)
            scores = torch.as_tensor(similarity(q, d), device=device)
            torch.topk(scores, min(k, block), dim=1)
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - a warm-up only; the search reports its own failure
            logger.debug("warming the scoring device failed: %s: %s", type(exc).__name__, exc)

    thread = threading.Thread(target=warm, name="vllm-eval-warm-scoring", daemon=True)
    thread.start()
    return thread


def document_texts(corpus: Any) -> list[str]:
    """The text mteb embeds for each document of a corpus dataset: ``title + " " + text`` stripped when the
    title is not empty, else the text stripped (mteb's ``_corpus_to_dict``), read column-wise: mteb maps
    it row by row with ``datasets``, 7 s for 200,000 documents on an H100 machine."""
    texts = column(corpus, "text")
    if "title" not in corpus.column_names:
        return [t.strip() for t in texts]
    return [(f"{title} {t}" if title else t).strip() for title, t in zip(column(corpus, "title"), texts, strict=True)]


def query_texts(queries: Any) -> list[str] | None:
    """The text mteb embeds for each query of a text query dataset: the text, then ``" " + instruction`` where
    the query has one (mteb's ``_combine_queries_with_instruction_text``), read column-wise; None for queries
    that are conversations (lists of turns), which mteb converts row by row."""
    texts = column(queries, "text")
    if texts and not isinstance(texts[0], str):
        return None
    if "instruction" not in queries.column_names:
        return texts
    return [t + " " + i if i is not None else t for t, i in zip(texts, column(queries, "instruction"), strict=True)]


def flat_query_texts(queries: Any) -> list[str]:
    """:func:`query_texts`, with conversations flattened as mteb flattens them for a text model (its
    ``_retrieval_texts``: turns joined as ``role: content; ...``, an instruction in front), row by row."""
    texts = query_texts(queries)
    if texts is not None:
        return texts
    from mteb._create_dataloaders import _retrieval_texts
    from mteb.types import PromptType

    return _retrieval_texts(queries, PromptType.query)


def candidate_scores(
    similarity: Any, pairwise: Any, queries: np.ndarray, docs: np.ndarray, pair_query: np.ndarray, pair_doc: np.ndarray
) -> np.ndarray:
    """The score of each (query, document) pair, float32 (n_pairs,).

    When the whole query x document score matrix costs at most :data:`MATRIX_FACTOR` times as many entries as
    there are pairs (MindSmall: 2.4 million queries, 5,277 documents, 97 million pairs), it is computed in blocks
    of queries by ``similarity`` (a matrix product, as mteb scores each query's candidates) and the pairs are read
    from it: gathering two embeddings per pair, as ``pairwise`` needs, moves ``2 x dim`` floats per score instead.

    Args:
        similarity: ``(a, b) -> (len(a), len(b))`` scores, torch tensors (the model's ``similarity``).
        pairwise: ``(a, b) -> (len(a),)`` scores row by row (the model's ``similarity_pairwise``).
        queries, docs: float32 (n, dim) embeddings.
        pair_query, pair_doc: int64 (n_pairs,) row indices into ``queries`` / ``docs``, in any order (ascending
            ``pair_query`` is read block by block; others are first grouped by block, a stable sort of small ints).
    """
    try:
        return _pair_scores(similarity, pairwise, queries, docs, pair_query, pair_doc, _device)
    except Exception as exc:  # scored again on the CPU, whole: the arrays are all here
        if not gpu_ran_out(exc):
            raise
        _to_cpu(exc)
        return _pair_scores(similarity, pairwise, queries, docs, pair_query, pair_doc, lambda entries: "cpu")


def _pair_scores(
    similarity: Any, pairwise: Any, queries: np.ndarray, docs: np.ndarray, pair_query: np.ndarray,
    pair_doc: np.ndarray, place: Any,
) -> np.ndarray:  # fmt: skip
    """:func:`candidate_scores` on the device ``place(entries)`` picks for that many float32 values."""
    import torch

    scores = np.empty(len(pair_query), dtype=np.float32)
    if len(queries) * len(docs) <= MATRIX_FACTOR * len(pair_query):
        rows = max(BLOCK_ENTRIES // max(len(docs), 1), 1)
        device = place(docs.size + rows * (len(docs) + queries.shape[1]))
        d = torch.as_tensor(docs, device=device)
        order, bounds = _by_block(pair_query, rows, len(queries))
        for block, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if hi > lo:  # the pairs are read where the matrix is: only their scores come back from a GPU
                at = slice(lo, hi) if order is None else order[lo:hi]
                q = torch.as_tensor(queries[block * rows : (block + 1) * rows], device=device)
                matrix = torch.as_tensor(similarity(q, d))
                where = (torch.as_tensor(pair_query[at] - block * rows), torch.as_tensor(pair_doc[at]))
                scores[at] = matrix[where[0].to(matrix.device), where[1].to(matrix.device)].float().cpu().numpy()
        return scores
    block = max(BLOCK_ENTRIES // max(queries.shape[1], 1), 1)
    device = place(3 * block * queries.shape[1])
    for lo in range(0, len(pair_query), block):
        a = torch.as_tensor(queries[pair_query[lo : lo + block]], device=device)
        b = torch.as_tensor(docs[pair_doc[lo : lo + block]], device=device)
        scores[lo : lo + block] = torch.as_tensor(pairwise(a, b)).float().cpu().numpy()
    return scores


def _by_block(pair_query: np.ndarray, rows: int, n_queries: int) -> tuple[np.ndarray | None, list[int]]:
    """The pairs grouped by block of ``rows`` queries: (None, bounds) when ``pair_query`` ascends (block b is
    ``bounds[b]:bounds[b + 1]``), else (a stable order of the pairs by block, bounds into it). The blocks number a
    few where queries repeat (MindSmallReranking: 37,162 distinct query texts, 3 blocks), and NumPy sorts 16-bit
    keys by radix."""
    edges = np.arange(0, n_queries + rows, rows)
    if len(pair_query) < 2 or bool(np.all(pair_query[1:] >= pair_query[:-1])):
        return None, np.searchsorted(pair_query, edges).tolist()
    block = pair_query // rows
    block = block.astype(np.int16 if len(edges) < 1 << 15 else np.int64)
    counts = np.bincount(block, minlength=len(edges) - 1)
    return np.argsort(block, kind="stable"), np.concatenate([[0], np.cumsum(counts)]).tolist()


def _doc_rows(lists: list[list[str]], doc_index: dict[str, int], counts: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The row in ``doc_index`` of every candidate of ``lists[lo:hi]``, in order, int64.

    Raises:
        KeyError: a candidate that is not a document of the corpus (as mteb's search fails on it).
    """
    flat = itertools.chain.from_iterable(lists[lo:hi])
    return np.fromiter(map(doc_index.__getitem__, flat), dtype=np.int64, count=int(counts[lo:hi].sum()))


def rank_candidates(
    model: Any,
    queries: np.ndarray,
    query_ids: list[str],
    docs: np.ndarray,
    doc_ids: list[str],
    top_ranked: dict[str, list[str]],
    k: int,
    rows: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """Each query's candidates (``top_ranked``) scored and the ``k`` best kept: mteb's reranking search, with
    every (query, candidate) pair scored in blocks (:func:`candidate_scores`) instead of one query at a time
    (MindSmall has 2.4 million queries).

    Args:
        model: has mteb's ``similarity`` and ``similarity_pairwise`` (torch tensors in, torch tensors out).
        queries, docs: float32 (n, dim) embeddings, in the order of ``query_ids`` / ``doc_ids``; with ``rows``,
            ``queries`` holds one row per distinct query text and ``rows`` (int64, one per query id) names each
            query's row (:func:`distinct_texts`).

    Returns:
        ``{query id: {document id: score}}``, each query's documents best first (equal scores in the
        candidates' order; mteb's metrics sort each query's documents, and sorting sorted ones is cheap); a
        query without candidates maps to ``{}`` (as mteb). A :class:`~vllm_eval.models.ranked.RankedLists` where
        this thread's scoring reads one (:func:`~vllm_eval.models.ranked.as_results`).

    Raises:
        ValueError: a score is NaN (as mteb).
    """
    from ...utils.forked import in_ranges

    doc_index = {d: i for i, d in enumerate(doc_ids)}
    lists = [top_ranked.get(qid) or [] for qid in query_ids]
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    pair_query = np.repeat(np.arange(len(query_ids)), counts)
    # in ranges of forked children where there are enough queries (MindSmall: 97 million lookups)
    pair_doc = np.concatenate(in_ranges(_doc_rows, len(lists), worker_threads(), lists, doc_index, counts))
    scored = pair_query if rows is None else np.asarray(rows, dtype=np.int64)[pair_query]
    scores = candidate_scores(model.similarity, model.similarity_pairwise, queries, docs, scored, pair_doc)
    if np.isnan(scores).any():
        raise ValueError(f"NaN values detected in the similarity scores: {int(np.isnan(scores).sum())}")
    keep, kept = best_first(np.concatenate([[0], np.cumsum(counts)]), scores, k)
    offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    return as_results(RankedLists(query_ids, offsets, pair_doc[keep], scores[keep], doc_ids))


def search_candidates(
    model: Any,
    corpus: Any,
    queries: Any,
    *,
    top_ranked: dict[str, list[str]],
    top_k: int,
    encode_kwargs: dict[str, Any],
    task_metadata: Any,
    hf_split: str,
    hf_subset: str,
    num_proc: int | None = None,
    **_: Any,
) -> dict[str, dict[str, float]]:
    """mteb's search of a task with candidates per query (``top_ranked``; the keywords are mteb's ``search``
    call's) through ``model``'s ``encode`` (each distinct query text once, then the corpus: one call each) and
    :func:`rank_candidates`. A task process runs this itself with a stand-in whose ``encode`` runs in the
    command's process, so neither the candidates nor the ranked lists cross between the two."""
    from mteb.types import PromptType

    where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
    encoded = functools.partial(_encoded, model, encode_kwargs=encode_kwargs, num_proc=num_proc, where=where)
    texts = query_texts(queries) if task_metadata.get_modalities(PromptType.query) == ["text"] else None
    rows = None
    if texts is not None:
        texts, rows = distinct_texts(texts)
    query_embeddings = encoded(queries, "query", texts=texts)
    doc_embeddings = encoded(corpus, "document")
    return rank_candidates(
        model, query_embeddings, column(queries, "id"), doc_embeddings, column(corpus, "id"), top_ranked, top_k, rows
    )


def distinct_texts(texts: list[str]) -> tuple[list[str], np.ndarray | None]:
    """``texts`` once each, in first-seen order, and each text's index among them (int64, ``len(texts)``); the
    texts themselves and None when none repeats. A task whose queries repeat is encoded and scored once per
    distinct query (MindSmallReranking: 2,362,514 queries, 37,162 distinct texts): an encoder gives equal texts
    equal rows, so the scores are those of every query encoded."""
    index: dict[str, int] = {}
    rows = np.fromiter((index.setdefault(t, len(index)) for t in texts), dtype=np.int64, count=len(texts))
    if len(index) == len(texts):
        return texts, None
    return list(index), rows


def _encoded(
    model: Any, data: Any, prompt: str, encode_kwargs: dict[str, Any], num_proc: int | None, where: dict[str, Any],
    texts: list[str] | None = None,
) -> np.ndarray:  # fmt: skip
    """``data`` (mteb's corpus or queries dataset) encoded by ``model`` in one call, float32 (n, dim); ``texts``:
    the texts to encode instead, where the caller has them (float32 (len(texts), dim))."""
    from mteb._create_dataloaders import create_dataloader
    from mteb.types import PromptType

    prompt_type = PromptType(prompt)
    metadata = where["task_metadata"]
    if texts is None and metadata.get_modalities(prompt_type) == ["text"]:
        texts = document_texts(data) if prompt_type == PromptType.document else query_texts(data)
    if texts is not None:
        loader = Batches.of_texts(texts, encode_kwargs.get("batch_size", 32))
    else:
        loader = create_dataloader(
            data, task_metadata=metadata, prompt_type=prompt_type, num_proc=num_proc, **encode_kwargs
        )
    return np.asarray(model.encode(loader, prompt_type=prompt_type, **where, **encode_kwargs), dtype=np.float32)


def _after_first(warming: threading.Thread | None, chunks: Any) -> Any:
    """``chunks``, the first handed on only once ``warming`` has ended: it is encoded meanwhile, but the first scoring
    call must not run beside the warm-up's (mteb's similarity is compiled by torch on first use, and two threads
    compiling it at once failed: "using FX to symbolically trace a dynamo-optimized function")."""
    for i, chunk in enumerate(chunks):
        if i == 0 and warming is not None:
            warming.join()
        yield chunk


class IndexedCorpus:
    """mteb's ``index`` of a ``SearchProtocol``: the corpus is kept, per thread, for that thread's next ``search``
    (tasks evaluated at once each index, then search, their own corpus); nothing is encoded yet."""

    def _indexed(self) -> dict[int, Any]:
        return self.__dict__.setdefault("_search_corpora", {})

    def index(self, corpus: Any, *, task_metadata: Any, hf_split: str, hf_subset: str, **kwargs: Any) -> None:
        """Keep ``corpus`` (mteb's corpus dataset) for this thread's next ``search``; nothing is encoded yet."""
        self._indexed()[threading.get_ident()] = corpus

    def _indexed_corpus(self) -> Any:
        """This thread's indexed corpus, taken.

        Raises:
            ValueError: ``index`` was not called first (as mteb's wrapper).
        """
        corpus = self._indexed().pop(threading.get_ident(), None)
        if corpus is None:
            raise ValueError("Corpus must be indexed before searching.")
        return corpus


class CorpusSearch(IndexedCorpus):
    """mteb's ``SearchProtocol`` for an encoder backend (see the module doc): mixed into a class that has
    mteb's ``encode`` and ``similarity`` and ``mteb_model_meta``."""

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
        """Each query's ``top_k`` documents with their scores (mteb's ``RetrievalOutputType``; a
        :class:`~vllm_eval.models.ranked.RankedLists` where this thread's scoring reads one).

        Raises:
            ValueError: :meth:`index` was not called first (as mteb's wrapper).
        """
        corpus = self._indexed_corpus()
        where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
        if top_ranked is not None:
            return search_candidates(
                self, corpus, queries, top_ranked=top_ranked, top_k=top_k, encode_kwargs=encode_kwargs,
                num_proc=num_proc, **where,
            )  # fmt: skip
        encoded = functools.partial(_encoded, self, encode_kwargs=encode_kwargs, num_proc=num_proc, where=where)
        query_embeddings = encoded(queries, "query")
        warming = warm_scoring(self.similarity, query_embeddings, top_k)
        chunks = _after_first(
            warming,
            (
                encoded(corpus.select(range(lo, min(lo + ENCODE_CHUNK, len(corpus)))), "document")
                for lo in range(0, len(corpus), ENCODE_CHUNK)
            ),
        )
        try:
            scores, index = best_documents(self.similarity, query_embeddings, chunks, top_k)
        finally:
            if warming is not None:
                warming.join()
        query_ids = column(queries, "id")
        offsets = np.arange(len(query_ids) + 1, dtype=np.int64) * index.shape[1]
        return as_results(RankedLists(query_ids, offsets, index.ravel(), scores.ravel(), column(corpus, "id")))
