"""Rerankers against the real vLLM CPU engine, with locally built test models."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from mteb.types import PromptType
from torch.utils.data import DataLoader

from vllm_eval.models.presets import ScoreTemplate, get_preset
from vllm_eval.models.streaming import TruncationWarning
from vllm_eval.tasks.offline import LeeKnownItemRetrieval
from vllm_eval.utils.errors import UsageError

QUERIES = ["what is a cat", "stock market news", "", "rain in the forecast"]
DOCS = ["a cat is a small domesticated animal", "shares fell sharply on monday", "an empty query", ""]


def loader(texts: list) -> DataLoader:
    return DataLoader([{"text": t} for t in texts], batch_size=3, collate_fn=lambda b: {"text": [x["text"] for x in b]})


@pytest.fixture(scope="session")
def qwen3_reranker(test_models):
    from vllm_eval.models.reranker import VllmReranker

    with VllmReranker(str(test_models["qwen3"]), preset="qwen3-reranker", show_progress_bar=False) as ce:
        yield ce


def test_cross_encoder_matches_sentence_transformers(vllm_cross, st_cross):
    from sentence_transformers import CrossEncoder

    assert vllm_cross.mode == "cross-encoder"
    got = vllm_cross.score_pairs(QUERIES, DOCS)
    ref = CrossEncoder(str(st_cross.model), device="cpu").predict(list(zip(QUERIES, DOCS)))
    assert got.dtype == np.float32 and got.shape == (4,)
    # Pairs 0-2 (an empty query included) tokenize identically; an empty *document* does not:
    # HF's single-pair call (vLLM) drops the empty second segment's [SEP], the batched call
    # (sentence-transformers) keeps it. Documented; both scores are valid probabilities.
    delta = float(np.max(np.abs(got[:3] - ref[:3])))
    print(f"cross-encoder |vLLM - CrossEncoder.predict| max = {delta:.2e}")
    assert delta <= 1e-4
    assert np.all((got > 0) & (got < 1))
    assert np.ptp(got) > 1e-3  # the seeded head separates the pairs: the check can fail
    np.testing.assert_allclose(st_cross.score_pairs(QUERIES, DOCS), ref, atol=1e-6)


def test_predict_streams_pairs_with_prefixes(vllm_cross):
    from vllm_eval.models.reranker import VllmReranker

    meta = LeeKnownItemRetrieval.metadata
    with VllmReranker(
        str(vllm_cross.model),
        prompts={"query": "query: ", "document": "passage: "},
        chunk_size=3,
        show_progress_bar=False,
    ) as ce:
        assert ce.llm is vllm_cross.llm
        got = ce.predict(
            loader(QUERIES),
            loader(DOCS),
            task_metadata=meta,
            hf_split="test",
            hf_subset="default",
            prompt_type=PromptType.query,
        )
    ref = vllm_cross.score_pairs(["query: " + q for q in QUERIES], ["passage: " + d for d in DOCS])
    np.testing.assert_allclose(got, ref, atol=1e-6)
    assert np.max(np.abs(got - vllm_cross.score_pairs(QUERIES, DOCS))) > 1e-4


def _p_yes_reference(model_dir, prompts: list[str]) -> np.ndarray:
    """P(yes) = softmax(logit_no, logit_yes)[yes] at the last position, straight from transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([tok(p)["input_ids"]])
            logits = lm(ids).logits[0, -1]
            out.append(torch.softmax(torch.stack([logits[no], logits[yes]]), 0)[1].item())
    return np.asarray(out)


def test_qwen3_recipe_matches_transformers_p_yes(qwen3_reranker, test_models):
    assert qwen3_reranker.mode == "template"
    template = get_preset("qwen3-reranker").score_template
    got = qwen3_reranker.score_pairs(QUERIES, DOCS)
    prompts = [template.query(q) + template.document_template.format(document=d) for q, d in zip(QUERIES, DOCS)]
    assert "<Instruct>: Given a web search query" in prompts[0] and prompts[0].endswith("</think>\n\n")
    ref = _p_yes_reference(test_models["qwen3"], prompts)
    delta = float(np.max(np.abs(got - ref)))
    print(f"qwen3 recipe |vLLM - transformers P(yes)| max = {delta:.2e}")
    assert delta <= 1e-4
    assert np.all((got > 0) & (got < 1))


def test_random_reranker_shape_scores_p_yes_in_sentence_transformers(tmp_path):
    """The benchmark's random reranker (MiniLM's WordPiece made prompt-only) and the st backend's causal-LM path:
    the preset's template through sentence-transformers' LogitScore is transformers' P(yes), on the ids vLLM scores."""
    from transformers import AutoTokenizer

    from vllm_eval.models.reranker import SentenceTransformerReranker
    from vllm_eval.testing import build_random_reranker_model

    model = build_random_reranker_model(tmp_path / "qwen3-reranker-tiny", "qwen3-tiny")
    tok = AutoTokenizer.from_pretrained(model)
    assert tok("yes no")["input_ids"] == tok.convert_tokens_to_ids(["yes", "no"])  # no [CLS]/[SEP] around a prompt
    template = get_preset("qwen3-reranker").score_template
    # The preset applies by the folder's name.
    with SentenceTransformerReranker(str(model), device="cpu", show_progress_bar=False) as st:
        assert st.mode == "template" and st.ce.num_labels == 1
        got = st.score_pairs(QUERIES, DOCS)
        parts = [(template.query(q), template.document_template.format(document=d)) for q, d in zip(QUERIES, DOCS)]
        features = st.ce.preprocess(parts)
    ids = [row[mask.bool()].tolist() for row, mask in zip(features["input_ids"], features["attention_mask"])]
    assert ids == [tok(q + d)["input_ids"] for q, d in parts]  # what vLLM tokenizes: the prompt as one text
    np.testing.assert_allclose(got, _p_yes_reference(model, [q + d for q, d in parts]), atol=1e-5)
    with pytest.raises(UsageError, match="causal LMs"):
        SentenceTransformerReranker(str(_seq_cls_dir(tmp_path)), preset="qwen3-reranker")


def _seq_cls_dir(tmp_path):
    """A sequence-classification reranker folder (its config and an empty weights file: refused before anything
    loads)."""
    import json

    path = tmp_path / "seq-cls"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_template_uses_task_instruction_and_keeps_its_tail(qwen3_reranker, test_models):
    template = get_preset("qwen3-reranker").score_template
    got = qwen3_reranker.score_pairs(["q"], ["d"], instruction="Find the article")
    ref = _p_yes_reference(
        test_models["qwen3"],
        [template.query("q", "Find the article") + template.document_template.format(document="d")],
    )
    assert abs(got[0] - ref[0]) <= 1e-4
    long_doc = "the market " * 3000  # far over max_model_len=2048
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        score = qwen3_reranker.score_pairs(["q"], [long_doc])
    assert any(issubclass(w.category, TruncationWarning) for w in caught)
    qs, ds, cut = qwen3_reranker._apply_template(["q"], [long_doc], None)
    assert cut == 1 and ds[0].endswith("</think>\n\n")
    assert len(qwen3_reranker.tokenizer(qs[0] + ds[0])["input_ids"]) <= qwen3_reranker.max_length
    assert score.shape == (1,) and 0 < score[0] < 1


def test_general_score_template_for_any_classifier(vllm_cross):
    from vllm_eval.models.reranker import VllmReranker

    tpl = ScoreTemplate(query_template="Q: {query} ", document_template="D: {document}")
    with VllmReranker(str(vllm_cross.model), score_template=tpl, show_progress_bar=False) as ce:
        assert ce.mode == "template"
        got = ce.score_pairs(["cat"], ["a cat"])
    # The template's prompt is one text (no pair separator): same as scoring it as a single input.
    one = vllm_cross.llm.classify(["Q: cat D: a cat"], use_tqdm=False)[0].outputs.probs[0]
    assert abs(got[0] - one) <= 1e-5


def test_bi_encoder_scores_by_cosine(vllm_encoder):
    from vllm_eval.models.reranker import VllmReranker
    from vllm_eval.utils.modelinfo import packaged_model_path

    with VllmReranker(packaged_model_path(), show_progress_bar=False) as bi:
        assert bi.mode == "bi-encoder"
        assert bi.llm is vllm_encoder.llm  # same model, same options: one engine
        got = bi.score_pairs(QUERIES[:2], DOCS[:2])
    a, b = vllm_encoder.encode_texts(QUERIES[:2]), vllm_encoder.encode_texts(DOCS[:2])
    np.testing.assert_allclose(got, np.sum(a * b, axis=1), atol=1e-5)


def test_bad_reranker_inputs(test_models, vllm_cross):
    from vllm_eval.models.reranker import VllmReranker

    with pytest.raises(ValueError, match="neither a classifier head nor a registered reranker recipe"):
        VllmReranker(str(test_models["qwen3"]))
    with pytest.raises(TypeError, match="input 1 is NoneType"):
        vllm_cross.score_pairs(["a", None], ["b", "c"])
    with pytest.raises(ValueError, match="2 queries but 1 documents"):
        vllm_cross.score_pairs(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="different numbers"):
        vllm_cross.predict(
            loader(["a", "b"]),
            loader(["c"]),
            task_metadata=LeeKnownItemRetrieval.metadata,
            hf_split="test",
            hf_subset="default",
        )
    assert vllm_cross.score_pairs([], []).shape == (0,)
    with pytest.raises(KeyError, match="unknown model preset"):
        VllmReranker(str(test_models["cross"]), preset="nope")


@pytest.fixture(scope="module")
def two_stage_rows(vllm_cross, st_cross, tmp_path_factory):
    import mteb

    from vllm_eval.evaluation.two_stage import evaluate_two_stage

    bm25 = mteb.get_model("mteb/baseline-bm25s")
    out = tmp_path_factory.mktemp("rerank")
    rows = {}
    for name, model in (("vllm", vllm_cross), ("st", st_cross)):
        rows[name] = evaluate_two_stage(
            bm25, model, [LeeKnownItemRetrieval()], top_k=5, output_dir=out / name, show_progress_bar=False
        )
    return rows


def test_bm25_then_rerank_matches_between_backends(two_stage_rows):
    v, s = two_stage_rows["vllm"], two_stage_rows["st"]
    assert [r.stage for r in v] == ["first", "rerank"]
    assert v[0].main_score == pytest.approx(s[0].main_score)  # same bm25s first stage
    assert v[0].main_score > 0.5  # bm25 finds most known items
    delta = abs(v[1].main_score - s[1].main_score)
    print(
        f"LeeKnownItemRetrieval bm25s top-5 rerank nDCG@10: vllm {v[1].main_score:.6f} st {s[1].main_score:.6f} "
        f"|delta| {delta:.2e}"
    )
    assert delta <= 1e-3
    assert v[1].main_score != pytest.approx(v[0].main_score)  # the reranker really reordered


class TinyRetrieval(LeeKnownItemRetrieval):
    """Three queries over five documents; q2 shares no word with any document."""

    metadata = LeeKnownItemRetrieval.metadata.model_copy(update={"name": "TinyRetrieval"})

    def _build(self):
        from datasets import Dataset
        from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

        docs = {
            "d0": "cats purr and sleep",
            "d1": "stock markets fell",
            "d2": "rain is forecast",
            "d3": "a dog barks",
            "d4": "the senate voted",
        }
        queries = {"q0": "why do cats purr", "q1": "markets fell today", "q2": "zzz qqq"}
        return {
            "test": RetrievalSplitData(
                corpus=Dataset.from_dict({"id": list(docs), "text": list(docs.values())}),
                queries=Dataset.from_dict({"id": list(queries), "text": list(queries.values())}),
                relevant_docs={"q0": {"d0": 1}, "q1": {"d1": 1}, "q2": {"d2": 1}},
                top_ranked=None,
            )
        }


def test_top_k_larger_than_corpus_and_query_without_candidates(vllm_cross, tmp_path):
    import mteb

    from vllm_eval.evaluation.two_stage import evaluate_two_stage

    with pytest.warns(UserWarning, match="larger than TinyRetrieval's corpus"):
        rows = evaluate_two_stage(
            mteb.get_model("mteb/baseline-bm25s"),
            vllm_cross,
            [TinyRetrieval()],
            top_k=10,
            output_dir=tmp_path,
            show_progress_bar=False,
        )
    assert [r.stage for r in rows] == ["first", "rerank"]
    assert all(0 <= r.main_score <= 1 for r in rows)
    # Drop q2's candidates from the first stage's predictions: the reranker then has nothing for
    # it and mteb scores that query 0 (the documented result), while the others are reranked.
    import json

    pred = next((tmp_path / "predictions").glob("*.json"))
    data = json.loads(pred.read_text())
    data["default"]["test"]["q2"] = {}
    pred.write_text(json.dumps(data))
    task = TinyRetrieval().convert_to_reranking(tmp_path / "predictions", top_k=5)
    from vllm_eval.evaluation.results import evaluate

    (row,) = evaluate(vllm_cross, [task], show_progress_bar=False)
    assert 0 <= row.main_score <= 2 / 3 + 1e-9  # q2 contributes 0 to the mean
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        evaluate_two_stage(None, vllm_cross, [TinyRetrieval()], top_k=0, output_dir=tmp_path)


def test_pairs_of_unequal_sides_are_refused_and_an_inputs_own_error_kept():
    from vllm_eval.models.reranker.base import _pairs

    assert list(_pairs(["q1", "q2"], ["d1", "d2"])) == [("q1", "d1"), ("q2", "d2")]
    for queries, docs in ((["q1"], ["d1", "d2"]), (["q1", "q2"], ["d1"])):
        with pytest.raises(UsageError, match="different numbers of queries and documents"):
            list(_pairs(queries, docs))

    def refused():
        yield "d1"
        raise UsageError("scores texts only")

    with pytest.raises(UsageError, match="scores texts only"):
        list(_pairs(["q1", "q2"], refused()))


def test_rerank_on_a_replicas_retrieval_task_reads_its_files(replica, vllm_cross, tmp_path):
    """`rerank --data REPLICA --tasks NAME`: both stages read the replica's files (the second stage's task is a fresh
    copy reading the same folder, not the class's hub dataset), the first stage's task is left as it was."""
    import mteb

    from vllm_eval.evaluation.two_stage import evaluate_two_stage
    from vllm_eval.tasks import rerank_tasks

    assert {t.metadata.type for t in rerank_tasks(None, str(replica))} == {"Retrieval", "Reranking"}
    with pytest.raises(UsageError, match="needs retrieval tasks; STS12 is STS"):
        rerank_tasks(["STS12"], str(replica))
    with pytest.raises(UsageError, match="'SCIDOC' is not a task of the replica .*; its tasks: .*SCIDOCS"):
        rerank_tasks(["SCIDOC"], str(replica))
    with pytest.raises(UsageError, match="give --data or --tasks, not both"):
        rerank_tasks(["SCIDOCS"], str(tmp_path / "pairs.jsonl"))
    [task] = rerank_tasks(["scidocs"], str(replica))
    rows = evaluate_two_stage(
        mteb.get_model("mteb/baseline-bm25s"), vllm_cross, [task], top_k=5, output_dir=tmp_path, show_progress_bar=False
    )
    assert [(r.task, r.stage) for r in rows] == [("SCIDOCS", "first"), ("SCIDOCS", "rerank")]
    assert rows[0].main_score > 0.5 and rows[1].main_score != pytest.approx(rows[0].main_score)
    split = task.dataset["default"]["test"] if task.data_loaded else {}
    assert split.get("top_ranked") is None  # the reranking stage's candidates went to its own copy


def test_the_bm25_first_stage_keeps_jax_on_the_cpu_unless_the_user_chose(monkeypatch):
    """bm25s runs a JAX top-k at import; JAX on a GPU would take 75 % of its memory from the reranker."""
    from vllm_eval.engine import procenv
    from vllm_eval.evaluation.two_stage import load_first_stage

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(procenv, "ENV_SET_HERE", set())
    load_first_stage("bm25s")
    assert os.environ["JAX_PLATFORMS"] == "cpu" and procenv.ENV_SET_HERE == {"JAX_PLATFORMS"}
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setattr(procenv, "ENV_SET_HERE", set())
    load_first_stage("bm25s")
    assert os.environ["JAX_PLATFORMS"] == "cuda"
