"""Multi-vector (token_embed, ColBERT-style) models: MaxSim, vLLM vs transformers vectors, mteb retrieval, /pooling."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest


class _Scorer:
    """TokenEmbedderBase's MaxSim without a model (the methods only read score_batch_size)."""

    def __init__(self, batch: int) -> None:
        self.score_batch_size = batch


def test_max_sim_on_a_hand_checked_example():
    from vllm_eval.models.token_embedder.base import TokenEmbedderBase

    q = [np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float16)]
    docs = [np.array([[1.0, 0.0]]), np.array([[0.6, 0.8], [0.0, 1.0]]), np.array([[0.0, -1.0], [0.8, 0.6]])]
    # per query token, the best document token; summed: d0 1+0, d1 0.6+1, d2 0.8+0.6
    for batch in (1, 2, 1024):
        got = TokenEmbedderBase.similarity(_Scorer(batch), q, docs).numpy()
        np.testing.assert_allclose(got, [[1.0, 1.6, 1.4]], atol=1e-3)
    pair = TokenEmbedderBase.pairwise_max_sim(_Scorer(1), q * 2, docs[1:]).numpy()
    np.testing.assert_allclose(pair, [1.6, 1.4], atol=1e-3)


def test_token_embed_refuses_tasks_maxsim_cannot_score(cli_in_process, tmp_path):
    from vllm_eval.testing import build_minilm_colbert

    model = build_minilm_colbert(tmp_path / "colbert")
    code, err = cli_in_process("run", "--model", str(model), "--tasks", "LeeDocSimilarity")
    assert code == 2 and "retrieval and reranking tasks only; LeeDocSimilarity is STS" in err
    code, err = cli_in_process("run", "--tasks", "LeeDocSimilarity", "--store-dtype", "float16")
    assert code == 2 and "--store-dtype is for --pooling-task token_embed" in err


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="45 s of CI's 30 minutes: the token embedder runs in CI in tests/test_served_kinds.py (served against"
    " in process), tests/test_mock_run.py (mteb's multi-vector wrapper) and tests/test_replicas_kinds.py;"
    " VLLMEVAL_FULL_TESTS=1 runs it",
)
@pytest.mark.slow
def test_vllm_token_vectors_match_transformers_and_retrieval_runs_in_mteb(colbert, cli_in_process, tmp_path):
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.models.token_embedder.hf import TransformersTokenEmbedder
    from vllm_eval.models.token_embedder.vllm import VllmTokenEmbedder
    from vllm_eval.tasks import get_tasks
    from vllm_eval.tasks.data import lee_documents

    texts = [*lee_documents()[:20], "", "Ünïcödé text", "word " * 700]
    with (
        VllmTokenEmbedder(colbert, show_progress_bar=False) as v,
        TransformersTokenEmbedder(colbert, show_progress_bar=False) as h,
    ):
        a, b = v.encode_texts(texts), h.encode_texts(texts)
        assert [x.shape for x in a] == [x.shape for x in b] and a[-1].shape == (512, 48) and a[-3].shape == (2, 48)
        delta = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
        print(f"\ntoken_embed vLLM vs transformers: max |delta| {delta:.2e} over {len(texts)} texts")
        assert delta <= 1e-4
        np.testing.assert_allclose(np.linalg.norm(a[0], axis=1), 1.0, atol=1e-5)
        full = evaluate(v, get_tasks(["LeeKnownItemRetrieval"]), show_progress_bar=False)[0].main_score

        out = tmp_path / "run"
        # The architecture (HF_ColBERT) selects token_embed; the offline suite keeps its retrieval task.
        # The engine above is open, so the command shares it.
        code, err = cli_in_process(
            "run", "--model", colbert, "--store-dtype", "float16", "--output-dir", str(out), "--no-progress",
            "--no-cache",
        )  # fmt: skip
        assert code == 0, err
        # compare --kind token_embedder on a small BEIR directory: nDCG@10 and per-token vectors against
        # transformers (the whole LeeKnownItemRetrieval through transformers would cost CI most of a minute).
        beir = tmp_path / "beir"
        (beir / "qrels").mkdir(parents=True)
        docs = lee_documents()[:30]
        (beir / "corpus.jsonl").write_text(
            "".join(json.dumps({"_id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(docs))
        )
        (beir / "queries.jsonl").write_text(
            "".join(
                json.dumps({"_id": f"q{i}", "text": " ".join(d.split()[:12])}) + "\n" for i, d in enumerate(docs[:8])
            )
        )
        (beir / "qrels" / "test.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(8))
        )
        code, err = cli_in_process(
            "compare", "--kind", "token_embedder", "--model", colbert, "--data", str(beir), "--sample", "16",
            "--output-dir", str(tmp_path / "cmp"), "--no-progress", "--no-cache",
        )  # fmt: skip
        assert code == 0, err
        report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
        agree = report["agreement"]["vllm default"]
        print(f"compare token_embedder: {agree}")
        assert report["reference"] == "hf default" and {r["task"] for r in report["rows"]} == {"beir"}
        assert agree["n"] > 16 and agree["min_cosine"] > 0.9999  # one row per token of the 16 sampled texts
    rows = {r["task"]: r for r in json.loads((out / "summary.json").read_text())["scores"]}
    assert list(rows) == ["LeeKnownItemRetrieval"]
    half = rows["LeeKnownItemRetrieval"]["main_score"]
    print(f"LeeKnownItemRetrieval nDCG@10: float32 vectors {full:.5f}, float16 storage {half:.5f}")
    assert full > 0.3 and half == pytest.approx(full, abs=0.01)


def test_colbert_width_in_config_is_left_to_the_weights():
    from vllm_eval.models.token_embedder.vllm import _colbert_width_overrides

    assert _colbert_width_overrides({"architectures": ["HF_ColBERT"], "dim": 128}) == {"hf_overrides": {"dim": None}}
    assert _colbert_width_overrides({"architectures": ["HF_ColBERT"]}) is None
    assert _colbert_width_overrides({"architectures": ["ColBERTModernBertModel"], "dim": 128}) is None
    assert _colbert_width_overrides({"architectures": ["BertModel"], "projection_dim": 8}) is None


@pytest.mark.slow
def test_colbert_config_naming_its_width_starts_and_gives_the_same_vectors(colbert, tmp_path):
    import shutil

    from vllm_eval.models.token_embedder.vllm import VllmTokenEmbedder
    from vllm_eval.tasks.data import lee_documents

    # colbert-ir/colbertv2.0-style configs may carry the width; vLLM 0.32's BERT ColBERT fails to start on it.
    named = tmp_path / "with-dim"
    shutil.copytree(colbert, named)
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "dim": 48}))
    texts = lee_documents()[:5]
    with (
        VllmTokenEmbedder(str(named), show_progress_bar=False) as a,
        VllmTokenEmbedder(colbert, show_progress_bar=False) as b,
    ):
        assert a.engine_kwargs["hf_overrides"] == {"dim": None}
        for x, y in zip(a.encode_texts(texts), b.encode_texts(texts)):
            assert x.shape == y.shape and x.shape[1] == 48
            np.testing.assert_allclose(x, y, atol=1e-6)


def _digit_images(n: int) -> list:
    from PIL import Image
    from sklearn.datasets import load_digits

    images = load_digits().images[:n]
    return [Image.fromarray((im * 255 / 16).astype(np.uint8)).convert("RGB").resize((32, 32)) for im in images]


def test_late_interaction_over_images_matches_transformers_and_runs_an_image_task(cli_in_process, tmp_path):
    """A tiny random ColModernVBERT (ColPali-style): queries (with the preset's query augmentation) and images
    (their tokens first, as vLLM's processor puts them) at per-token cosine >= 0.99999 of transformers'
    ColModernVBertForRetrieval fed the same tokens and pixels; then `vllm-eval run` on a text-to-image task."""
    import torch
    from transformers import AutoTokenizer, Idefics3ImageProcessor

    from vllm_eval.models.token_embedder.vllm import VllmTokenEmbedder
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import (
        build_tiny_colmodernvbert,
        load_tiny_colmodernvbert_reference,
        row_cosines,
        text_loader,
    )

    model = str(build_tiny_colmodernvbert(tmp_path / "tiny-colmodernvbert"))
    images, queries = _digit_images(3), ["a handwritten seven", "zero"]
    meta = get_tasks(["DigitsTextToImageRetrieval"])[0].metadata
    with VllmTokenEmbedder(model, show_progress_bar=False) as tok:
        assert tok.mteb_model_meta.modalities == ["text", "image"]
        kw = {"task_metadata": meta, "hf_split": "test", "hf_subset": "default"}
        got = [*tok.encode(text_loader(queries), **kw), *tok.encode([{"image": images}], **kw)]
        tokenizer, reference = AutoTokenizer.from_pretrained(model), load_tiny_colmodernvbert_reference(model)
        pixels = Idefics3ImageProcessor.from_pretrained(model)
        config = json.loads((tmp_path / "tiny-colmodernvbert" / "config.json").read_text())
        vision = config["vision_config"]
        n_image = (vision["image_size"] // vision["patch_size"] // config["pixel_shuffle_factor"]) ** 2
        image_id = tokenizer.convert_tokens_to_ids("<image>")
        inputs = [{"input_ids": tokenizer(q + "<end_of_utterance>" * 10)["input_ids"]} for q in queries] + [
            {"input_ids": [image_id] * n_image, **pixels(images=[im], do_image_splitting=False, return_tensors="pt")}
            for im in images
        ]
        for vectors, x in zip(got, inputs, strict=True):
            ids = torch.tensor([x.pop("input_ids")])
            with torch.no_grad():
                want = reference(input_ids=ids, attention_mask=torch.ones_like(ids), **x).embeddings[0].numpy()
            assert vectors.shape == want.shape and row_cosines(vectors, want).min() >= 0.99999
        assert not np.allclose(got[2], got[3], atol=1e-3)  # other images, other vectors
        out = tmp_path / "run"  # the same engine options, so the command shares the engine
        code, err = cli_in_process(
            "run", "--model", model, "--tasks", "DigitsTextToImageRetrieval", "--output-dir", str(out), "--no-cache"
        )
        assert code == 0, err
        (score,) = json.loads((out / "summary.json").read_text())["scores"]
        print("\nColModernVBERT DigitsTextToImageRetrieval nDCG@10:", score["main_score"])
        assert score["status"] == "computed" and score["inputs"] == 310 and 0 < score["main_score"] <= 1
