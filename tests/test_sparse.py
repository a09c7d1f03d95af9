"""Sparse retrieval models (SPLADE, BGE-M3's outputs) through vLLM, and vLLM's IO-processor plugins."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from vllm_eval.utils.errors import OptionError, UsageError


def test_rows_keep_each_id_once_at_its_largest_weight_and_top_k():
    from vllm_eval.models.sparse_encoder.base import pack_row, rows_to_csr, unpack_row

    ids, weights = unpack_row(pack_row([7, 3, 7, 5, 9, 3], [0.5, 0.2, 0.9, -1.0, 0.0, 0.4]))
    assert ids.tolist() == [3, 7] and weights.tolist() == pytest.approx([0.4, 0.9])
    ids, weights = unpack_row(pack_row([1, 2, 3, 4], [0.3, 0.1, 0.3, 0.2], max_active_dims=2))
    assert ids.tolist() == [1, 3]  # the two largest, ties by the lower id, ids ascending
    matrix = rows_to_csr([pack_row([2], [1.5]), pack_row([], [])], 4)
    assert matrix.toarray().tolist() == [[0, 0, 1.5, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        rows_to_csr([pack_row([9], [1.0])], 4)


def test_sparse_row_measures_of_parity():
    import scipy.sparse as sp

    from vllm_eval.models.sparse_encoder.base import row_cosines, row_max_abs_diff

    a = sp.csr_matrix(np.array([[0, 3, 4], [1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=np.float32))
    b = sp.csr_matrix(np.array([[0, 6, 8], [0, 2, 0], [0, 0, 0], [0, 0, 5]], dtype=np.float32))
    assert row_cosines(a, b).tolist() == pytest.approx([1.0, 0.0, 1.0, 0.0])  # two empty rows agree, one does not
    assert row_max_abs_diff(a, b).tolist() == [4.0, 2.0, 0.0, 5.0]  # an id on one side counts its weight


def test_sparse_search_scores_equal_a_dense_computation():
    import scipy.sparse as sp

    from vllm_eval.models.sparse_encoder import search
    from vllm_eval.models.sparse_encoder.base import sparse_dot

    rng = np.random.default_rng(0)
    q = sp.random(7, 500, density=0.04, random_state=1, dtype=np.float32, format="csr")
    d = sp.random(300, 500, density=0.06, random_state=2, dtype=np.float32, format="csr")
    dense = q.toarray().astype(np.float64) @ d.toarray().astype(np.float64).T
    search.BLOCK_ENTRIES, saved = 600, search.BLOCK_ENTRIES  # several query blocks and corpus chunks
    try:
        chunks = [d[:120], d[120:250], d[250:]]
        scores, index = search.top_k_sparse(q, chunks, 10)
    finally:
        search.BLOCK_ENTRIES = saved
    for i in range(7):
        expect = np.argsort(-dense[i], kind="stable")[:10]
        np.testing.assert_allclose(scores[i], dense[i][expect], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dense[i][index[i]], dense[i][expect], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sparse_dot(q, d).numpy(), dense, rtol=1e-5, atol=1e-6)
    pq, pd = rng.integers(0, 7, 50), rng.integers(0, 300, 50)
    np.testing.assert_allclose(search.pair_scores(q, d, pq, pd), dense[pq, pd], rtol=1e-5, atol=1e-6)


def test_bge_m3_all_mode_scoring_pieces():
    from vllm_eval.models.sparse_encoder import hybrid

    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(6, 8)).astype(np.float32), rng.normal(size=(50, 8)).astype(np.float32)
    scores, index = hybrid.dense_candidates(q, [d[:20], d[20:33], d[33:]], 7)
    exact = q.astype(np.float64) @ d.astype(np.float64).T
    for i in range(6):
        assert index[i].tolist() == np.argsort(-exact[i], kind="stable")[:7].tolist()
    np.testing.assert_allclose(scores, np.take_along_axis(exact, index, axis=1), rtol=1e-5, atol=1e-6)
    qv, dv = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.6, 0.8], [1.0, 0.0]])
    assert hybrid.colbert_score(qv, dv) == pytest.approx((1.0 + 0.8) / 2)  # max per query vector, mean over them
    assert hybrid.colbert_score(qv, dv[:0]) == 0.0
    one = np.ones(2, dtype=np.float32)
    assert hybrid.weighted((0.4, 0.2, 0.4), one, 2 * one, 3 * one).tolist() == pytest.approx([2.0, 2.0])
    assert hybrid.check_weights([1, 2, 3]) == (1.0, 2.0, 3.0) and hybrid.check_weights(None) is None
    for bad in ([1, 1], [1, -1, 1], [0, 0, 0], ["a", 1, 1], [float("nan"), 1, 1]):
        with pytest.raises(UsageError, match="three numbers"):
            hybrid.check_weights(bad)


@pytest.fixture(scope="module")
def io_plugins(tmp_path_factory):
    """The test plugins of ``tests/sparse_io_plugin.py`` registered as entry points of a dist-info on sys.path."""
    root = tmp_path_factory.mktemp("plugins")
    info = root / "vllm_eval_test_plugins-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-eval-test-plugins\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.io_processor_plugins]\nvllm_eval_sparse_rows = sparse_io_plugin:register\n"
        "vllm_eval_broken = sparse_io_plugin:broken\n"
    )
    added = [str(root), str(Path(__file__).parent)]
    sys.path[:0] = added
    yield
    for p in added:
        sys.path.remove(p)


@pytest.fixture(scope="module")
def sparse_models(tmp_path_factory):
    from vllm_eval.testing import build_tiny_bge_m3, build_tiny_splade

    root = tmp_path_factory.mktemp("sparse")
    return {"splade": str(build_tiny_splade(root / "splade")), "m3": str(build_tiny_bge_m3(root / "m3"))}


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    """A BEIR folder of 40 Lee documents and 10 queries (six words from the middle of a document)."""
    from vllm_eval.tasks.data import lee_documents

    out = tmp_path_factory.mktemp("beir")
    (out / "qrels").mkdir()
    docs = lee_documents()[:40]
    (out / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(docs))
    )
    (out / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": f"q{i}", "text": " ".join(d.split()[30:36])}) + "\n" for i, d in enumerate(docs[:10])
        )
    )
    (out / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(10))
    )
    return out


TEXTS = ["hello world, this is a test", "Ünïcödé text", "", "word " * 200, "Sport and politics in the world today."]


#: The SPLADE engine's options: the test IO-processor plugin, so one engine serves the plugin's test too.
SPLADE_ENGINE = {"io_processor_plugin": "vllm_eval_sparse_rows"}


@pytest.fixture(scope="module")
def splade_vllm(sparse_models, io_plugins):
    """The tiny SPLADE's vLLM backend, started once for this module: a backend of the same model and options built
    meanwhile (``run --check-parity``) shares its engine."""
    from vllm_eval.models.sparse_encoder.vllm import VllmSparseEncoder

    with VllmSparseEncoder(sparse_models["splade"], show_progress_bar=False, **SPLADE_ENGINE) as v:
        yield v


@pytest.mark.slow
def test_splade_vllm_equals_sparse_encoder_and_retrieval_scores_match(sparse_models, splade_vllm, beir):
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.models.sparse_encoder.st import SentenceTransformerSparseEncoder
    from vllm_eval.tasks.owntasks import own_mteb_tasks

    model, v = sparse_models["splade"], splade_vllm
    with SentenceTransformerSparseEncoder(model, show_progress_bar=False) as s:
        a, b = v.encode_sparse(TEXTS), s.encode_sparse(TEXTS)
        delta = float(abs(a - b).max())
        print(f"\nSPLADE vLLM vs SparseEncoder: {a.nnz} non-zeros (reference {b.nnz}), max |delta| {delta:.2e}")
        assert a.shape == (len(TEXTS), 30522) and a.nnz == b.nnz > 100 and delta <= 1e-5
        assert (a.indices == b.indices).all() and (a.indptr == b.indptr).all()
        v.max_active_dims = s.max_active_dims = 16
        a16, b16 = v.encode_sparse(TEXTS[:2]), s.encode_sparse(TEXTS[:2])
        assert np.diff(a16.indptr).max() == 16 and float(abs(a16 - b16).max()) <= 1e-5
        v.max_active_dims = s.max_active_dims = None

        # The IO-processor plugin the engine loaded: its rows are the backend's.
        sys.modules.pop("sparse_io_plugin", None)
        import sparse_io_plugin  # noqa: F401 - the module vLLM imported, by entry point

        out = v.llm.encode({"data": TEXTS[:2]}, pooling_task="plugin", use_tqdm=False)[0].outputs
        assert [len(r["token_ids"]) for r in out] == np.diff(a.indptr)[:2].tolist()
        np.testing.assert_allclose(out[0]["weights"], a[0].data, atol=1e-6)

        tasks = own_mteb_tasks(str(beir), None)
        got = {n: evaluate(x, tasks, show_progress_bar=False)[0].main_score for n, x in (("vllm", v), ("st", s))}
    print(f"BEIR (40 documents) nDCG@10: {got}")
    assert got["vllm"] == pytest.approx(got["st"], abs=1e-6) and got["vllm"] > 0.1


@pytest.mark.slow
def test_run_check_parity_of_splade_against_sparse_encoder(
    cli_in_process, sparse_models, splade_vllm, beir, tmp_path, monkeypatch
):
    import vllm

    # The run's vLLM backend shares the fixture's engine (same model and options): a second one must not start.
    monkeypatch.setattr(vllm, "LLM", lambda *a, **k: pytest.fail("run started an engine of its own"))
    options = [f"--{k.replace('_', '-')}={v}" for k, v in SPLADE_ENGINE.items()]
    code, err = cli_in_process(
        "run", "--model", sparse_models["splade"], "--data", str(beir), "--check-parity", "64", *options,
        "--no-cache", "--no-progress", "--output-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    row = json.loads((tmp_path / "summary.json").read_text())["scores"][0]
    print(f"\nrun --check-parity 64 (SPLADE, vllm vs st): {row['parity_n']} inputs, min cosine "
          f"{row['parity_min_cosine']}, max |delta| of a weight {row['parity_max_abs_diff']:.2e}")  # fmt: skip
    assert row["parity_n"] == 50  # every input the task sent: 10 queries, 40 documents
    assert row["parity_min_cosine"] > 0.99999 and row["parity_max_abs_diff"] <= 1e-5
    assert "parity max |Δ|" in cli_in_process.stdout


@pytest.fixture(scope="module")
def m3_engines(sparse_models):
    """The tiny BGE-M3's three vLLM backends (sparse, dense, ColBERT engines), started once for this module's BGE-M3
    tests: "all" mode's search shares these engines (same options) instead of starting its own."""
    from vllm_eval.models.encoder.vllm import VllmEncoder
    from vllm_eval.models.sparse_encoder.vllm import VllmSparseEncoder, bge_m3_engine_options
    from vllm_eval.models.token_embedder.vllm import VllmTokenEmbedder

    model = sparse_models["m3"]
    with (
        VllmSparseEncoder(model, show_progress_bar=False) as sparse,
        VllmEncoder(model, show_progress_bar=False, **bge_m3_engine_options("dense")) as dense,
        VllmTokenEmbedder(model, show_progress_bar=False, **bge_m3_engine_options("colbert")) as colbert,
    ):
        yield {"sparse": sparse, "dense": dense, "colbert": colbert}


@pytest.mark.slow
def test_bge_m3_modes_match_the_transformers_reference(sparse_models, m3_engines):
    from vllm_eval.models.sparse_encoder.hf import BgeM3Reference, TransformersBgeM3
    from vllm_eval.utils.modelinfo import ModelRef

    model = sparse_models["m3"]
    ref = BgeM3Reference(ModelRef.resolve(model, None))
    v = m3_engines["sparse"]
    with TransformersBgeM3(model, show_progress_bar=False) as h:
        a, b = v.encode_sparse(TEXTS), h.encode_sparse(TEXTS)
    ids = v.tokenizer(TEXTS)[0]
    sparse_delta = float(abs(a - b).max())
    assert a.nnz == b.nnz > 10 and (a.indices == b.indices).all() and sparse_delta <= 1e-5
    assert not set(a.indices.tolist()) & {0, 1, 2, 3}  # <s>, <pad>, </s>, <unk>: dropped as FlagEmbedding does
    outputs = [ref.outputs(x) for x in ids]
    dense = m3_engines["dense"].encode_texts(TEXTS)
    dense_delta = float(np.abs(dense - np.stack([o[0] for o in outputs])).max())
    colbert = m3_engines["colbert"].encode_texts(TEXTS)
    assert [x.shape for x in colbert] == [o[2].shape for o in outputs]
    colbert_delta = max(float(np.abs(x - o[2]).max()) for x, o in zip(colbert, outputs))
    print(f"\nBGE-M3 vLLM vs transformers max |delta|: sparse {sparse_delta:.2e}, dense {dense_delta:.2e}, "
          f"colbert {colbert_delta:.2e}")  # fmt: skip
    assert dense_delta <= 1e-5 and colbert_delta <= 1e-5


def _beir_split(beir):
    """The BEIR folder's corpus and queries as the ``datasets`` mteb hands a search."""
    from datasets import Dataset

    rows = [json.loads(x) for x in (beir / "corpus.jsonl").read_text().splitlines()]
    corpus = Dataset.from_dict({"id": [r["_id"] for r in rows], "text": [r["text"] for r in rows]})
    rows = [json.loads(x) for x in (beir / "queries.jsonl").read_text().splitlines()]
    return corpus, Dataset.from_dict({"id": [r["_id"] for r in rows], "text": [r["text"] for r in rows]})


def _flag_embedding_score(ref, query_ids, doc_ids, weights):
    """FlagEmbedding's ``compute_score`` (``colbert+sparse+dense``) of one pair, written out from the reference's
    three outputs: dense dot, lexical weights' dot (each id at its largest weight, specials out), mean MaxSim."""
    (qd, qw, qc), (dd, dw, dc) = ref.outputs(query_ids), ref.outputs(doc_ids)

    def lexical(ids, w):
        out = {}
        for i, x in zip(ids, w):
            if i not in ref.special and x > 0:
                out[i] = max(out.get(i, 0.0), float(x))
        return out

    lq, ld = lexical(query_ids, qw), lexical(doc_ids, dw)
    sparse = sum(x * ld[i] for i, x in lq.items() if i in ld)
    colbert = float((qc @ dc.T).max(axis=1).sum() / len(qc))
    return (weights[0] * float(qd @ dd) + weights[1] * sparse + weights[2] * colbert) / sum(weights)


@pytest.mark.slow
def test_bge_m3_all_mode_vllm_equals_the_transformers_reference(sparse_models, m3_engines, beir):
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.models.sparse_encoder.hf import TransformersBgeM3
    from vllm_eval.models.sparse_encoder.vllm import VllmSparseEncoder
    from vllm_eval.tasks.owntasks import own_mteb_tasks

    model, weights = sparse_models["m3"], (0.4, 0.2, 0.4)
    task = own_mteb_tasks(str(beir), None)
    corpus, queries = _beir_split(beir)
    where = {"task_metadata": task[0].metadata, "hf_split": "test", "hf_subset": "default", "encode_kwargs": {}}
    got = {}
    with (
        VllmSparseEncoder(model, show_progress_bar=False, bge_m3_weights=weights) as v,  # shares the sparse engine
        TransformersBgeM3(model, show_progress_bar=False, bge_m3_weights=weights) as h,
    ):
        for name, backend in (("vllm", v), ("hf", h)):
            backend.index(corpus, **where)
            full = backend.search(queries, top_k=10, **where)
            backend.index(corpus, **where)  # a reranking task's candidates: 5 per query, in a rotated order
            given = {q: [f"d{(i + j * 7) % 40}" for j in range(5)] for i, q in enumerate(queries["id"])}
            rerank = backend.search(queries, top_k=3, top_ranked=given, **where)
            got[name] = (full, rerank, evaluate(backend, task, show_progress_bar=False)[0].main_score)
        texts = dict(zip(list(queries["id"]) + list(corpus["id"]), list(queries["text"]) + list(corpus["text"])))
        ids = {x: v.tokenizer([t.strip()])[0][0] for x, t in texts.items()}
        full = got["hf"][0]
        score = {(q, d): _flag_embedding_score(h.m3, ids[q], ids[d], weights) for q in full for d in full[q]}
    delta = 0.0
    for a, b in zip(got["vllm"][:2], got["hf"][:2]):
        assert a.keys() == b.keys() and all(list(a[q]) == list(b[q]) for q in a)  # the same documents, in order
        delta = max(delta, max(abs(a[q][d] - b[q][d]) for q in a for d in a[q]))
    rerank = got["hf"][1]
    assert all(len(full[q]) == 10 for q in full) and all(len(rerank[q]) == 3 for q in rerank)
    assert all(set(rerank[q]) <= set(given[q]) for q in rerank)
    written_out = max(abs(full[q][d] - x) for (q, d), x in score.items())
    print(f"\nBGE-M3 all {weights}: vLLM vs transformers max |delta| {delta:.2e} (written-out compute_score: "
          f"{written_out:.2e}); nDCG@10 vllm {got['vllm'][2]:.5f}, hf {got['hf'][2]:.5f}")  # fmt: skip
    assert delta <= 1e-5 and written_out <= 1e-5
    assert got["vllm"][2] == pytest.approx(got["hf"][2], abs=1e-6) and got["vllm"][2] > 0.1


@pytest.mark.slow
def test_bench_and_compare_cover_sparse_encoders(cli_in_process, sparse_models, m3_engines, beir, tmp_path):
    from vllm_eval.measure.compare import agreement

    # SPLADE (BGE-M3's tiny tokenizer has too few whole words for the bench's texts): its default backends are vllm
    # (an engine of its own, ~2 s here) and sentence-transformers' SparseEncoder.
    fast = ("--lengths", "fixed:16", "--batch-sizes", "8", "--n-texts", "16")
    code, err = cli_in_process("bench", "--model", sparse_models["splade"], *fast, "--output-dir", str(tmp_path / "b"))
    assert code == 0, err
    records = json.loads((tmp_path / "b" / "bench.json").read_text())["records"]
    assert [r["backend"] for r in records] == ["vllm", "st"]
    assert all(r["texts_per_s"] > 0 and r["tokens_per_s"] > 0 and r["n_tokens"] == 16 * 16 for r in records)
    code, err = cli_in_process("bench", "--model", sparse_models["splade"], "--backends", "vllm", "mteb-vllm", *fast)
    assert code == 2 and "sparse model (splade) measures --backends vllm st, not mteb-vllm" in err
    compare = ("compare", "--kind", "sparse_encoder", "--model", sparse_models["m3"], "--data", str(beir))
    code, err = cli_in_process(*compare, "--backends", "vllm", "st", "--no-cache", "--output-dir", str(tmp_path))
    assert code == 2 and "sentence-transformers reference" in err and len(err.strip().splitlines()) == 1
    out = tmp_path / "compare"
    code, err = cli_in_process(*compare, "--sample", "20", "--no-cache", "--no-progress", "--output-dir", str(out))
    assert code == 0, err
    result = json.loads((out / "compare.json").read_text())
    agree = result["agreement"]["vllm default"]
    print(f"\ncompare --kind sparse_encoder (BGE-M3, vllm vs hf): {result['rows']}, {agree}")
    assert result["reference"].startswith("hf") and result["passed"] and len(result["rows"]) == 2
    assert agree["n"] == 20 and agree["max_abs_diff"] <= 1e-5
    import scipy.sparse as sp

    a = sp.csr_matrix(np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 0.0]], dtype=np.float32))
    b = sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 0.25]], dtype=np.float32))
    assert agreement(a, b) == {"max_abs_diff": 0.5, "median_abs_diff": 0.375, "n": 2}  # an id on one side only


def test_flags_and_plugins_are_checked_before_anything_loads(cli_in_process, sparse_models, io_plugins):
    from vllm_eval.engine.args import check_io_processor_plugin

    code, err = cli_in_process("run", "--model", sparse_models["m3"], "--bge-m3-mode", "lexical")
    assert code == 2 and "--bge-m3-mode" in err and "lexical" in err
    code, err = cli_in_process("run", "--bge-m3-mode", "sparse", "--pooling-task", "embed")
    assert code == 2 and "not both" in err
    code, err = cli_in_process("run", "--tasks", "LeeDocSimilarity", "--max-active-dims", "8")
    assert code == 2 and "--max-active-dims is for sparse models" in err
    m3 = ("run", "--model", sparse_models["m3"])
    code, err = cli_in_process(*m3, "--bge-m3-mode", "all", "--tasks", "LeeDocSimilarity")
    assert code == 2 and "LeeDocSimilarity is STS" in err and "--bge-m3-mode dense" in err
    code, err = cli_in_process(*m3, "--bge-m3-mode", "sparse", "--bge-m3-weights", "1", "1", "1")
    assert code == 2 and "--bge-m3-mode all" in err
    code, err = cli_in_process(*m3, "--bge-m3-mode", "all", "--bge-m3-weights", "1", "-1", "1")
    assert code == 2 and "three numbers >= 0" in err
    code, err = cli_in_process(*m3, "--bge-m3-mode", "all", "--backend", "st")
    assert code == 2 and "--bge-m3-weights needs --backend vllm or hf" in err
    splade = ("run", "--model", sparse_models["splade"])
    for refused, message in (
        ((*m3, "--bge-m3-mode", "colbert"), "--check-parity compares one vector per text; compare a token_embedder"),
        ((*m3, "--bge-m3-mode", "all"), "--check-parity checks one output per run, not --bge-m3-mode all's three"),
        ((*m3, "--bge-m3-mode", "sparse", "--backend", "hf"), "--check-parity compares with --backend hf; run it"),
        ((*splade, "--backend", "st"), "--check-parity compares with --backend st; run it with another backend"),
    ):
        code, err = cli_in_process(*refused, "--check-parity", "4")
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, err = cli_in_process("run", "--model", sparse_models["splade"], "--io-processor-plugin", "nope")
    assert code == 2 and "'nope': no such plugin installed" in err and "vllm_eval_sparse_rows" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(OptionError, match="'vllm_eval_broken' is broken: RuntimeError: this plugin fails on purpose"):
        check_io_processor_plugin("vllm_eval_broken")
    check_io_processor_plugin("vllm_eval_sparse_rows")
    with pytest.raises(UsageError, match="not a sparse model"):
        from vllm_eval.models.sparse_encoder.vllm import VllmSparseEncoder
        from vllm_eval.utils.modelinfo import packaged_model_path

        VllmSparseEncoder(packaged_model_path())


def test_conversation_queries_are_flattened_as_mtebs_sparse_wrapper_does(sparse_models, splade_vllm):
    """A retrieval task whose queries are conversations (mteb's dialog mock task): the sparse backend flattens each
    as mteb does for a text model (``role: content; ...``) and scores as mteb's own ``SparseEncoderWrapper``."""
    import mteb
    from mteb.mocks.mock_tasks.retrieval import MockRetrievalDialogTask
    from mteb.models.sentence_transformer_wrapper import SparseEncoderWrapper

    def scores(model):
        result = mteb.evaluate(model, [MockRetrievalDialogTask()], cache=None, show_progress_bar=False)[0]
        return {split: r[0]["main_score"] for split, r in result.scores.items()}

    ours, theirs = scores(splade_vllm), scores(SparseEncoderWrapper(sparse_models["splade"], device="cpu"))
    print(f"\ndialog retrieval main scores: ours {ours}, mteb's SparseEncoderWrapper {theirs}")
    assert ours.keys() == theirs.keys() and len(ours) >= 1
    for split in ours:
        assert ours[split] == pytest.approx(theirs[split], abs=1e-6)
