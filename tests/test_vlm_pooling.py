"""Vision-language models pooled: a tiny random Idefics3 (SmolVLM's architecture, whose image processor needs no
torchvision) through vLLM's CPU build as an image-text embedder (last token, prompts per input kind) against
transformers, on texts, images and fused image+text inputs as mteb sends them."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from vllm_eval.models.images import ImageInput
from vllm_eval.models.presets import ImagePrompts

PROMPTS = ImagePrompts(
    text="<|im_start|>user\n{text}<|im_end|>\n",
    image="<|im_start|>user\n{image}What digit is this?<|im_end|>\n",
    text_image="<|im_start|>user\n{image}{text}<|im_end|>\n",
)


def _digits(n: int, offset: int = 0) -> list:
    from PIL import Image
    from sklearn.datasets import load_digits

    images = load_digits().images[offset : offset + n]
    return [Image.fromarray((im * 255 / 16).astype(np.uint8)).convert("RGB").resize((56, 56)) for im in images]


@pytest.fixture(scope="module")
def vlm_embedder(tmp_path_factory):
    from vllm_eval import VllmEncoder
    from vllm_eval.testing import build_tiny_idefics3

    model_dir = build_tiny_idefics3(tmp_path_factory.mktemp("models") / "tiny-idefics3")
    enc = VllmEncoder(str(model_dir), image_prompts=PROMPTS, max_model_len=512, show_progress_bar=False)
    yield model_dir, enc
    enc.close()


def _reference_embeddings(model_dir, prompts: list[str], images: list) -> np.ndarray:
    """transformers' Idefics3 last hidden state at the last position, L2-normalised (vLLM's embed pooler for a
    converted generative model: LAST, normalised)."""
    from transformers import AutoProcessor, Idefics3Model

    processor = AutoProcessor.from_pretrained(model_dir)
    model = Idefics3Model.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for prompt, image in zip(prompts, images, strict=True):
        enc = processor(text=prompt, images=[image] if image is not None else None, return_tensors="pt")
        with torch.no_grad():
            out.append(torch.nn.functional.normalize(model(**enc).last_hidden_state[0, -1], dim=-1).numpy())
    return np.stack(out)


def test_vlm_embedder_texts_images_and_fused_inputs_match_transformers(vlm_embedder):
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import row_cosines

    model_dir, enc = vlm_embedder
    assert enc.mteb_model_meta.modalities == ["text", "image"]
    meta = get_tasks(["WordSim353"])[0].metadata  # any task: only its prompts are read
    images, texts = _digits(4), ["zero", "a handwritten one", "two", "three"]

    def encode(batch):
        return enc.encode([batch], task_metadata=meta, hf_split="test", hf_subset="default")

    got = np.concatenate([encode({"text": texts}), encode({"image": images}), encode({"image": images, "text": texts})])
    prompts = (
        [PROMPTS.text.format(text=t) for t in texts]
        + [PROMPTS.image.format(image="<image>")] * 4
        + [PROMPTS.text_image.format(image="<image>", text=t) for t in texts]
    )
    ref = _reference_embeddings(model_dir, prompts, [None] * 4 + images + images)
    assert got.shape == (12, 128)
    assert row_cosines(got, ref).min() >= 0.99999
    unit = got / np.linalg.norm(got, axis=1, keepdims=True)
    sim = unit @ unit.T
    assert sim[~np.eye(12, dtype=bool)].max() < 0.9999  # other images or other texts: other vectors
    # An image's prompt is part of its identity: the same pixels with another text are another input.
    assert ImageInput(images[0], "a") != ImageInput(images[0], "b")
    assert ImageInput(images[0], "a").cache_form() == {"image": ImageInput(images[0]).digest, "prompt": "a"}
    assert enc.identity()["image_prompts"]["text_image"] == PROMPTS.text_image


def test_vlm_embedder_runs_mteb_image_tasks(vlm_embedder):
    import mteb

    from vllm_eval.tasks import get_tasks

    _, enc = vlm_embedder
    tasks = get_tasks(["DigitsZeroShot", "DigitsTextToImageRetrieval"])
    result = mteb.evaluate(enc, tasks, cache=None, show_progress_bar=False)
    scores = {r.task_name: r.get_score() for r in result.task_results}
    assert set(scores) == {"DigitsZeroShot", "DigitsTextToImageRetrieval"}
    assert all(0.0 <= s <= 1.0 for s in scores.values())


def test_transformers_reference_backend_and_compare_agree_with_vllm(vlm_embedder, cli_in_process, tmp_path):
    """`--backend hf` (transformers' last hidden state, the same prompts and placeholder) gives vLLM's vectors for
    texts, images and fused inputs, and `compare --backends vllm hf` checks the model per task and per input."""
    import json

    from vllm_eval.models.encoder.hf import TransformersEncoder
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import row_cosines

    model_dir, enc = vlm_embedder
    meta = get_tasks(["WordSim353"])[0].metadata
    images, texts = _digits(3, offset=50), ["five", "a six", "seven"]
    with TransformersEncoder(str(model_dir), image_prompts=PROMPTS, show_progress_bar=False) as hf:
        assert hf.mteb_model_meta.modalities == ["text", "image"] and hf._placeholder == "<image>"
        for batch in ({"text": texts}, {"image": images}, {"image": images, "text": texts}):
            kw = {"task_metadata": meta, "hf_split": "test", "hf_subset": "default"}
            ours, theirs = (m.encode([batch], **kw) for m in (enc, hf))
            assert row_cosines(ours, theirs).min() >= 0.99999
    out = tmp_path / "cmp"
    args = ["--tasks", "DigitsTextToImageRetrieval", "--sample", "16", "--max-model-len", "512", "--no-progress"]
    code, err = cli_in_process("compare", "--model", str(model_dir), "--backends", "vllm", "hf", *args,
                               "--output-dir", str(out))  # fmt: skip
    assert code == 0, err
    report = json.loads((out / "compare.json").read_text())
    print("\ncompare vllm/hf:", report["rows"], report["agreement"])
    assert report["passed"] and all(r["delta"] <= 1e-4 for r in report["rows"])


def test_image_prompts_need_their_fields():
    from vllm_eval.utils.errors import UsageError

    with pytest.raises(UsageError, match="'image' must contain \\{image\\}"):
        ImagePrompts(image="an image")
    with pytest.raises(UsageError, match="unknown image prompt keys \\['query'\\]"):
        ImagePrompts.coerce({"query": "{text}"})
    with pytest.raises(UsageError, match="not both in one input"):
        ImagePrompts(text_image=None).format("x", True, "<image>")
    assert ImagePrompts.coerce({"image_token": "<|image_pad|>"}).format(None, True, "<image>") == "<|image_pad|>"


@pytest.fixture(scope="module")
def vlm_reranker(tmp_path_factory):
    from vllm_eval import VllmReranker
    from vllm_eval.models.presets import ScoreTemplate
    from vllm_eval.testing import build_tiny_idefics3

    # A one-label head = the LM head's "yes" row minus its "no" row: the score is P(yes), as Qwen3-VL's reranker.
    model_dir = build_tiny_idefics3(tmp_path_factory.mktemp("models") / "reranker", score_tokens=("no", "yes"))
    template = ScoreTemplate(
        query_template="<|im_start|>user\nQuery: {query}\n",
        document_template="Document: {document}<|im_end|>\n<|im_start|>assistant\n",
    )
    rr = VllmReranker(str(model_dir), score_template=template, max_model_len=512, show_progress_bar=False)
    yield model_dir, template, rr
    rr.close()


def _reference_p_yes(model_dir, prompts: list[str], images: list) -> np.ndarray:
    """softmax(logit_no, logit_yes)[yes] at the last position, from transformers' Idefics3."""
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(model_dir)
    model = Idefics3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    no, yes = processor.tokenizer.convert_tokens_to_ids(["no", "yes"])
    out = []
    for prompt, image in zip(prompts, images, strict=True):
        enc = processor(text=prompt, images=[image] if image is not None else None, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0, -1]
        out.append(torch.softmax(logits[[no, yes]], dim=-1)[1].item())
    return np.asarray(out)


def test_vlm_reranker_scores_image_documents_like_transformers(vlm_reranker):
    from vllm_eval.tasks import get_tasks

    model_dir, template, rr = vlm_reranker
    assert rr.mteb_model_meta.modalities == ["text", "image"]
    meta = get_tasks(["WordSim353"])[0].metadata
    images = _digits(4, offset=10)
    queries = ["zero", "one", "a seven", "nine"]
    docs = [{"image": images[:2]}, {"image": images[2:], "text": ["caption a", "caption b"]}]  # alone, then fused
    got = rr.predict([{"text": queries}], docs, task_metadata=meta, hf_split="test", hf_subset="default")
    doc_texts = ["<image>", "<image>", "<image>caption a", "<image>caption b"]
    head, tail = template.document_parts()
    prompts = [template.query(q) + head + d + tail for q, d in zip(queries, doc_texts)]
    ref = _reference_p_yes(model_dir, prompts, images)
    assert got.shape == (4,)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert np.ptp(got) > 1e-4  # other images, other scores
    text_only = rr.score_pairs(["zero"], ["a plain document"])  # a text document on the same engine
    ref_text = _reference_p_yes(model_dir, [template.query("zero") + head + "a plain document" + tail], [None])
    np.testing.assert_allclose(text_only, ref_text, atol=1e-5)


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="33 s of CI's 30 minutes: a served reranker runs in CI in tests/test_remote.py, this VLM reranker in "
    "process in this module; VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_a_served_vlm_reranker_scores_image_documents_as_in_process(vlm_reranker, tmp_path):
    """A real `vllm serve` of the same reranker, its judge prompt as the server's score template (--chat-template,
    as vLLM's Qwen3-VL reranker example): image documents as ScoreMultiModalParam through /score and /rerank give
    the in-process scores; a score template applied on our side cannot place an image and says so."""
    from vllm_eval.models.http import HttpOptions
    from vllm_eval.models.reranker.remote import RemoteReranker
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import serve_model
    from vllm_eval.utils.errors import UsageError

    model_dir, template, rr = vlm_reranker
    meta = get_tasks(["WordSim353"])[0].metadata
    images = _digits(3, offset=40)
    queries = ["zero", "a seven", "nine", "one"]
    docs = [{"image": images[:2]}, {"image": images[2:], "text": ["a caption"]}, {"text": ["a plain document"]}]

    def predict(model):
        return model.predict([{"text": queries}], docs, task_metadata=meta, hf_split="test", hf_subset="default")

    want = predict(rr)
    jinja = tmp_path / "score.jinja"
    head, tail = template.document_parts()
    text = template.query("{{ messages[0].content }}") + head + "{{ messages[1].content }}" + tail
    jinja.write_text(text.removesuffix("\n") + "{{ '\\n' }}")  # Jinja drops a template's last newline
    flags = ("--runner", "pooling", "--convert", "classify", "--max-model-len", "512", "--chat-template", str(jinja))
    with serve_model(model_dir, *flags, timeout=240) as url:
        for api in ("score", "rerank"):
            with RemoteReranker(HttpOptions((url,), batch_size=2), api=api, show_progress_bar=False) as remote:
                assert remote.mteb_model_meta.modalities == ["text", "image"]
                np.testing.assert_allclose(predict(remote), want, atol=1e-5)
        with RemoteReranker(HttpOptions((url,)), score_template=template, show_progress_bar=False) as remote:
            with pytest.raises(UsageError, match="cannot place an image"):
                predict(remote)
