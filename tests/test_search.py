"""Full-corpus retrieval through the encoder's own search: the documents mteb's wrapper finds, in one
stream of encode calls, scored in blocks."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_eval.models.encoder import search


def test_best_documents_over_chunks_and_blocks_is_the_global_top_k(monkeypatch):
    import torch

    monkeypatch.setattr(search, "BLOCK_ENTRIES", 16 * 13)  # 13 documents per block: their 16-wide embeddings
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(7, 16)).astype(np.float32)
    docs = rng.normal(size=(100, 16)).astype(np.float32)
    chunks = [docs[:40], docs[40:41], docs[41:]]
    scores, index = search.best_documents(lambda a, b: a @ b.T, queries, iter(chunks), 10)
    full = queries @ docs.T
    expected = np.argsort(-full, axis=1)[:, :10]
    assert index.shape == (7, 10) and (index == expected).all()
    assert np.allclose(scores, np.take_along_axis(full, expected, axis=1), atol=1e-5)
    few, _ = search.best_documents(lambda a, b: torch.as_tensor(a) @ torch.as_tensor(b).T, queries, [docs[:3]], 10)
    assert few.shape == (7, 3)  # a corpus smaller than k keeps every document


def test_a_block_of_documents_is_bounded_however_few_the_queries():
    """Few queries allow wide blocks of scores, but a block's documents are bounded too: the scoring warm-up
    allocates a whole block of them, and 10 queries once asked it for 6.7 million 768-wide documents (20 GB on an
    H100, beside four engines: out of memory)."""
    for n_queries in (1, 10, 1000, 100_000):
        queries = np.zeros((n_queries, 768), dtype=np.float32)
        block, entries = search._blocks(queries, 100)
        assert 1 <= block and block * 768 <= search.BLOCK_ENTRIES and block * n_queries <= search.BLOCK_ENTRIES
        assert entries >= queries.size + block * (768 + n_queries)
    assert search._blocks(np.zeros((1000, 768), dtype=np.float32), 10)[1] * 4 <= search.DEVICE_BYTES  # on the GPU


def test_search_finds_what_mtebs_wrapper_finds(vllm_encoder):
    from mteb.models.search_wrappers import SearchEncoderWrapper

    from vllm_eval.tasks import get_tasks

    (task,) = get_tasks(["LeeKnownItemRetrieval"])
    task.load_data()
    split = task.dataset["default"]["test"]
    corpus, queries = split["corpus"].select(range(120)), split["queries"]  # a third of the corpus: CI's time
    where = {"task_metadata": task.metadata, "hf_split": "test", "hf_subset": "default", "encode_kwargs": {}}
    results = {}
    for name, searcher in (("ours", vllm_encoder), ("mteb", SearchEncoderWrapper(vllm_encoder, corpus_chunk_size=64))):
        searcher.index(corpus, num_proc=None, **where)
        results[name] = searcher.search(queries, top_k=20, num_proc=None, **where)
    assert set(results["ours"]) == set(results["mteb"]) and len(results["ours"]) == len(queries) == 48
    for qid, found in results["mteb"].items():
        ours = results["ours"][qid]
        assert len(ours) == len(found) == 20
        # The same scores best first (documents with equal scores may swap), each document scored alike.
        assert np.allclose(sorted(ours.values()), sorted(found.values()), atol=1e-5), qid
        assert all(ours[d] == pytest.approx(found[d], abs=1e-5) for d in set(ours) & set(found))
        assert len(set(ours) & set(found)) >= 18
    with pytest.raises(ValueError, match="indexed"):
        vllm_encoder.search(split["queries"], top_k=5, num_proc=None, **where)


def test_document_and_query_texts_are_what_mteb_embeds():
    from datasets import Dataset
    from mteb._create_dataloaders import create_dataloader
    from mteb.types import PromptType

    from vllm_eval.tasks import get_tasks

    (task,) = get_tasks(["LeeKnownItemRetrieval"])
    titled = Dataset.from_dict({"id": ["a", "b", "c"], "title": ["T", "", " U "], "text": [" x ", "y ", "z"]})
    plain = Dataset.from_dict({"id": ["a", "b"], "text": [" x ", "y"]})
    for corpus in (titled, plain):
        loader = create_dataloader(corpus, task_metadata=task.metadata, prompt_type=PromptType.document)
        theirs = [t for batch in loader for t in batch["text"]]
        assert search.document_texts(corpus) == theirs
    instructed = Dataset.from_dict({"id": ["q", "r"], "text": ["what", "why"], "instruction": ["be brief", "say why"]})
    for queries in (instructed, plain):
        loader = create_dataloader(queries, task_metadata=task.metadata, prompt_type=PromptType.query)
        assert search.query_texts(queries) == [t for batch in loader for t in batch["text"]]
    conversations = Dataset.from_dict({"id": ["c"], "text": [["hi", "there"]]})
    assert search.query_texts(conversations) is None  # mteb converts those row by row; so does the search


def test_reranking_candidates_as_mtebs_wrapper_ranks_them(vllm_encoder, replica):
    """A reranking task (candidates per query) of a benchmark replica: the same candidates, scores alike."""
    from mteb.models.search_wrappers import SearchEncoderWrapper

    from vllm_eval.tasks.shaped import replica_tasks

    (task,) = [t for t in replica_tasks(replica) if t.metadata.name == "AskUbuntuDupQuestions"]
    task.load_data()
    split = task.dataset["default"]["test"]
    where = {"task_metadata": task.metadata, "hf_split": "test", "hf_subset": "default", "encode_kwargs": {}}
    results = {}
    for name, searcher in (("ours", vllm_encoder), ("mteb", SearchEncoderWrapper(vllm_encoder))):
        searcher.index(split["corpus"], num_proc=None, **where)
        results[name] = searcher.search(
            split["queries"], top_k=5, top_ranked=split["top_ranked"], num_proc=None, **where
        )
    assert results["ours"].keys() == results["mteb"].keys()
    for qid, found in results["mteb"].items():
        ours = results["ours"][qid]
        assert len(ours) == len(found) == min(5, len(split["top_ranked"][qid]))
        assert np.allclose(sorted(ours.values()), sorted(found.values()), atol=1e-5), qid


def test_scoring_stays_off_the_gpu_when_it_would_not_fit(monkeypatch):
    import torch

    free = [80 << 30]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free[0], 140 << 30))
    assert search._device(1000).type == "cuda"
    assert search._device(search.DEVICE_BYTES).type == "cpu"  # 4 GiB of float32: mteb's CPU path instead
    free[0] = search.DEVICE_HEADROOM + 1000 * 4 - 1  # an engine holds the rest of the GPU
    assert search._device(1000).type == "cpu"


class _RunsOutOnce:
    """A similarity whose first call fails as a GPU beside an engine does (an 8B run's scoring died of it)."""

    def __init__(self, error):
        self.error, self.calls = error, 0

    def __call__(self, a, b):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        return _Cosine.similarity(a, b)


@pytest.mark.parametrize(
    "error",
    [
        lambda torch: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB"),
        lambda torch: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    ],
    ids=["out-of-memory", "cublas"],
)
def test_scoring_that_runs_out_of_gpu_memory_finishes_on_the_cpu(monkeypatch, caplog, error):
    import torch

    monkeypatch.setattr(search, "BLOCK_ENTRIES", 9 * 16)
    rng = np.random.default_rng(2)
    queries = rng.normal(size=(6, 16)).astype(np.float32)
    docs = rng.normal(size=(50, 16)).astype(np.float32)
    want_scores, want_index = search.best_documents(_Cosine.similarity, queries, iter([docs[:20], docs[20:]]), 7)
    failing = _RunsOutOnce(error(torch))
    with caplog.at_level("WARNING", logger=search.__name__):
        scores, index = search.best_documents(failing, queries, iter([docs[:20], docs[20:]]), 7)
    assert (index == want_index).all() and np.allclose(scores, want_scores) and failing.calls > 2
    assert "scoring on the CPU: the GPU has no room beside the engine" in caplog.text
    pair_query, pair_doc = np.repeat(np.arange(6), 5), rng.integers(0, 50, size=30)
    want = search.candidate_scores(_Cosine.similarity, _Cosine.similarity_pairwise, queries, docs, pair_query, pair_doc)
    failing = _RunsOutOnce(error(torch))
    got = search.candidate_scores(failing, _Cosine.similarity_pairwise, queries, docs, pair_query, pair_doc)
    assert np.allclose(got, want) and failing.calls > 1
    with pytest.raises(ValueError):  # any other failure is the search's own
        search.best_documents(_RunsOutOnce(ValueError("bad")), queries, iter([docs]), 7)


class _Cosine:
    """mteb's cosine similarity, as a matrix and pair by pair."""

    @staticmethod
    def similarity(a, b):
        import torch

        a, b = (
            torch.nn.functional.normalize(torch.as_tensor(a), dim=-1),
            torch.nn.functional.normalize(torch.as_tensor(b), dim=-1),
        )
        return a @ b.T

    @staticmethod
    def similarity_pairwise(a, b):
        import torch

        a, b = (
            torch.nn.functional.normalize(torch.as_tensor(a), dim=-1),
            torch.nn.functional.normalize(torch.as_tensor(b), dim=-1),
        )
        return (a * b).sum(-1)


def _candidates(seed, n_queries, n_docs, dim, most):
    """Seeded query and document vectors, their ids, and up to ``most`` - 1 distinct candidates per query."""
    rng = np.random.default_rng(seed)
    queries = rng.normal(size=(n_queries, dim)).astype(np.float32)
    docs = rng.normal(size=(n_docs, dim)).astype(np.float32)
    query_ids, doc_ids = [f"q{i}" for i in range(n_queries)], [f"d{i}" for i in range(n_docs)]
    picks = {q: rng.choice(n_docs, size=rng.integers(0, most), replace=False) for q in query_ids}
    return rng, queries, query_ids, docs, doc_ids, {q: [doc_ids[j] for j in p] for q, p in picks.items()}


@pytest.mark.parametrize("factor", [0, 16])  # 0: every pair gathered; 16: read from the score matrix
def test_candidates_ranked_best_first_and_cut_at_k(monkeypatch, factor):
    monkeypatch.setattr(search, "MATRIX_FACTOR", factor)
    monkeypatch.setattr(search, "BLOCK_ENTRIES", 7 * 16)  # several blocks either way
    _, queries, query_ids, docs, doc_ids, top_ranked = _candidates(1, 40, 25, 16, 12)
    ranked = search.rank_candidates(_Cosine, queries, query_ids, docs, doc_ids, top_ranked, 5)
    full = _Cosine.similarity(queries, docs).numpy()
    assert list(ranked) == query_ids
    for i, q in enumerate(query_ids):
        candidates = [doc_ids.index(d) for d in top_ranked[q]]
        best = sorted(candidates, key=lambda j: -full[i, j])[:5]
        assert list(ranked[q]) == [doc_ids[j] for j in best]  # best first, k at most
        assert np.allclose(list(ranked[q].values()), full[i, best], atol=1e-6)


@pytest.mark.parametrize("factor", [0, 16])
def test_queries_that_repeat_are_scored_once_each_as_if_every_one_were_encoded(monkeypatch, factor):
    """Candidates of queries that share a row (``rows``) rank as the queries with their own copies of the row, the
    pairs read block by block in any order."""
    monkeypatch.setattr(search, "MATRIX_FACTOR", factor)
    monkeypatch.setattr(search, "BLOCK_ENTRIES", 3 * 25)  # blocks of 3 distinct queries: pairs out of order
    rng, _, query_ids, docs, doc_ids, top_ranked = _candidates(2, 50, 25, 16, 12)
    distinct = rng.normal(size=(9, 16)).astype(np.float32)
    rows = rng.integers(0, 9, size=50)
    once = search.rank_candidates(_Cosine, distinct, query_ids, docs, doc_ids, top_ranked, 5, rows)
    every = search.rank_candidates(_Cosine, distinct[rows], query_ids, docs, doc_ids, top_ranked, 5)
    assert list(once) == list(every) == query_ids
    for q in query_ids:
        assert list(once[q].items()) == list(every[q].items())


def test_candidates_looked_up_in_ranges_of_forked_children_rank_as_in_one(monkeypatch):
    from vllm_eval.utils import forked

    _, queries, query_ids, docs, doc_ids, top_ranked = _candidates(3, 30, 12, 8, 9)
    whole = search.rank_candidates(_Cosine, queries, query_ids, docs, doc_ids, top_ranked, 4)
    monkeypatch.setattr(forked, "MIN_ITEMS", 1)
    monkeypatch.setattr(search, "worker_threads", lambda: 3)
    ranged = search.rank_candidates(_Cosine, queries, query_ids, docs, doc_ids, top_ranked, 4)
    assert [list(ranged[q].items()) for q in query_ids] == [list(whole[q].items()) for q in query_ids]
    top_ranked["q29"] = ["d1", "nowhere"]  # in the last range: its child fails, the range here fails as mteb's
    with pytest.raises(KeyError, match="nowhere"):
        search.rank_candidates(_Cosine, queries, query_ids, docs, doc_ids, top_ranked, 4)


def test_distinct_texts_keep_first_seen_order_and_map_every_text():
    texts = ["b", "a", "b", "c", "a"]
    distinct, rows = search.distinct_texts(texts)
    assert distinct == ["b", "a", "c"] and rows.tolist() == [0, 1, 0, 2, 1]
    assert [distinct[r] for r in rows] == texts
    assert search.distinct_texts(["x", "y"]) == (["x", "y"], None)


def test_a_reranking_task_whose_queries_repeat_encodes_each_text_once(vllm_encoder, replica, monkeypatch):
    """Queries repeated under new ids (as MindSmallReranking's subqueries): one encode of the distinct texts, and
    the candidates ranked as mteb's wrapper ranks them."""
    import datasets
    from mteb.models.search_wrappers import SearchEncoderWrapper

    from vllm_eval.tasks.shaped import replica_tasks

    (task,) = [t for t in replica_tasks(replica) if t.metadata.name == "AskUbuntuDupQuestions"]
    task.load_data()
    split = task.dataset["default"]["test"]
    again = split["queries"].map(lambda row: {"id": row["id"] + "-again"})
    queries = datasets.concatenate_datasets([split["queries"], again])
    top_ranked = {**split["top_ranked"], **{q + "-again": docs for q, docs in split["top_ranked"].items()}}
    where = {"task_metadata": task.metadata, "hf_split": "test", "hf_subset": "default", "encode_kwargs": {}}
    seen = []
    encode = vllm_encoder.encode

    def counted(inputs, **kwargs):
        seen.append(sum(len(batch["text"]) for batch in inputs))
        return encode(inputs, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(vllm_encoder, "encode", counted)
        vllm_encoder.index(split["corpus"], num_proc=None, **where)
        ours = vllm_encoder.search(queries, top_k=5, top_ranked=top_ranked, num_proc=None, **where)
    assert seen == [len(set(search.query_texts(split["queries"]))), len(split["corpus"])]
    mteb_wrapper = SearchEncoderWrapper(vllm_encoder)
    mteb_wrapper.index(split["corpus"], num_proc=None, **where)
    theirs = mteb_wrapper.search(queries, top_k=5, top_ranked=top_ranked, num_proc=None, **where)
    assert ours.keys() == theirs.keys()
    for qid, found in theirs.items():
        assert np.allclose(sorted(ours[qid].values()), sorted(found.values()), atol=1e-5), qid
    for qid in again["id"]:
        assert ours[qid] == ours[qid.removesuffix("-again")]


def test_columns_and_texts_read_at_once_follow_a_selection():
    import datasets

    corpus = datasets.Dataset.from_dict(
        {"id": ["a", "b", "c", "d"], "title": ["T", "", "U", ""], "text": [" one ", "two ", "three", " four"]}
    ).select([3, 1, 2])  # an indices mapping over the table, as mteb's splits and subsets make
    assert search.column(corpus, "id") == ["d", "b", "c"] == [row["id"] for row in corpus]
    assert search.document_texts(corpus) == ["four", "two", "U three"]
    queries = datasets.Dataset.from_dict({"text": ["q1", "q2"], "instruction": ["do", None]}).select([1, 0])
    assert search.query_texts(queries) == ["q2", "q1 do"]
    assert search.query_texts(queries.remove_columns("instruction")) == ["q2", "q1"]


def test_no_scoring_warm_up_where_the_scoring_runs_on_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    queries = np.ones((4, 8), dtype=np.float32)
    assert search.warm_scoring(lambda a, b: a @ b.T, queries, 10) is None  # no CPU block scored for nothing
    assert search.warm_scoring(lambda a, b: a @ b.T, queries[:0], 10) is None
