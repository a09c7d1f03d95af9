"""Real `vllm serve` processes of the kinds served through /classify, /pooling and chat messages (a classifier, a
token classifier, a ColBERT-style token embedder, a CLIP) against the in-process engine or transformers. The four
servers start side by side once for the module: most of a start is one interpreter importing, on one core."""

from __future__ import annotations

import os

import numpy as np
import pytest

from vllm_eval.utils.errors import UsageError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
        reason="four `vllm serve` starts, 63-76 s of setup: the CI's 30 minutes; the HTTP path is tested on served "
        "embedders, rerankers and generators (test_remote). VLLMEVAL_FULL_TESTS=1 runs it",
    ),
]


@pytest.fixture(scope="module")
def served(test_models, colbert, clip):
    """Base URLs by kind: "classifier", "token_classifier", "token_embedder", "clip"."""
    from vllm_eval.testing import serve_models

    kinds = ("classifier", "token_classifier", "token_embedder", "clip")
    specs = (
        (str(test_models["classifier"]),),
        (str(test_models["token_classifier"]), "--runner", "pooling"),
        (colbert, "--runner", "pooling"),
        (clip[0], "--runner", "pooling"),
    )
    with serve_models(*specs, timeout=240) as urls:
        yield dict(zip(kinds, urls))


def test_remote_classifier_matches_in_process(served, vllm_classifier):
    """/classify gives the in-process probabilities."""
    from vllm_eval.models.classifier.remote import RemoteClassifier
    from vllm_eval.models.http import HttpOptions
    from vllm_eval.tasks.classification import get_classification_data

    texts = get_classification_data("PangLeePolarity").texts[:40]
    ref = vllm_classifier.classify(texts)
    with RemoteClassifier(HttpOptions(endpoints=(served["classifier"],), batch_size=16), show_progress_bar=False) as rc:
        assert rc.labels == ["negative", "positive"]
        got = rc.classify(texts)
    print(f"\nremote /classify vs in-process: max |delta| {np.abs(got - ref).max():.2e}")
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_remote_token_classify_through_pooling_matches_transformers(served, test_models):
    """/pooling (task token_classify) on our token ids gives the transformers probabilities, word by word."""
    from vllm_eval.models.http import HttpOptions
    from vllm_eval.models.token_classifier.hf import TransformersTokenClassifier
    from vllm_eval.models.token_classifier.remote import RemoteTokenClassifier
    from vllm_eval.tasks.data import lee_documents

    sentences = [d.split()[:40] for d in lee_documents()[:8]] + [["word"] * 700]
    with TransformersTokenClassifier(str(test_models["token_classifier"]), show_progress_bar=False) as h:
        ref = h.word_probs(sentences)
    options = HttpOptions(endpoints=(served["token_classifier"],), batch_size=4)
    with RemoteTokenClassifier(options, show_progress_bar=False) as r:
        assert r.labels == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
        got = r.word_probs(sentences)
        assert r.counters.truncated == 1
    delta = max(float(np.abs(x - y).max()) for x, y in zip(got, ref))
    print(f"\nremote /pooling token_classify vs transformers: max |delta prob| {delta:.2e}")
    assert [x.shape for x in got] == [x.shape for x in ref] and delta <= 1e-4


def test_remote_pooling_token_embed_matches_in_process(served, colbert):
    """/pooling (task token_embed) gives transformers' per-token vectors; a storage dtype it cannot keep is refused."""
    from vllm_eval.models.http import HttpOptions
    from vllm_eval.models.token_embedder.hf import TransformersTokenEmbedder
    from vllm_eval.models.token_embedder.remote import RemoteTokenEmbedder

    texts = ["the cat sat on the mat", "rain is expected tomorrow in Sydney", "a"]
    with TransformersTokenEmbedder(colbert, show_progress_bar=False) as h:
        ref = h.encode_texts(texts)
    url = served["token_embedder"]
    with RemoteTokenEmbedder(HttpOptions(endpoints=(url,), batch_size=2), show_progress_bar=False) as r:
        got = r.encode_texts(texts)
        with pytest.raises(UsageError, match="store_dtype must be one of"):
            RemoteTokenEmbedder(HttpOptions(endpoints=(url,)), store_dtype="int8")
    delta = max(float(np.abs(x - y).max()) for x, y in zip(got, ref))
    print(f"\nremote /pooling token_embed vs transformers: max |delta| {delta:.2e}")
    assert [x.shape for x in got] == [x.shape for x in ref] and delta <= 1e-4


def test_a_served_clip_embeds_images_through_chat_messages_as_in_process(served, clip):
    """The tiny CLIP: texts as `input`, images as chat messages with PNG data URLs, many per request and (as an older
    server takes them) one per request: the in-process vectors, raw as asked."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from vllm_eval.models.encoder.remote import RemoteEncoder
    from vllm_eval.models.http import HttpOptions
    from vllm_eval.models.images import ImageInput
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import row_cosines

    _, enc = clip
    digits = load_digits().images[30:35]
    images = [Image.fromarray((im * 255 / 16).astype(np.uint8)).convert("RGB").resize((28, 28)) for im in digits]
    items = ["a handwritten three", *[ImageInput(im) for im in images], "the digit eight"]
    want = enc.encode_texts(items)
    meta = get_tasks(["WordSim353"])[0].metadata
    with RemoteEncoder(
        HttpOptions((served["clip"],), batch_size=4), normalize=False, show_progress_bar=False
    ) as remote:
        assert remote.mteb_model_meta.modalities == ["text", "image"] and remote._image_batches is True
        got = remote.encode_texts(items)
        assert got.shape == want.shape and row_cosines(got, want).min() >= 0.99999
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-4)
        remote._image_batches = False  # one conversation per request
        one = remote.encode([{"image": images}], task_metadata=meta, hf_split="test", hf_subset="default")
        assert row_cosines(one, want[1:6]).min() >= 0.99999
