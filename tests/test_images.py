"""Images in embedding: a tiny random CLIP through vLLM (CPU build) against transformers, image batches as mteb
sends them, repeats embedded once, cache keys that carry the pixels."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_eval.models.images import ImageInput
from vllm_eval.utils.errors import UsageError


def _digits(n: int, offset: int = 0) -> list:
    from PIL import Image
    from sklearn.datasets import load_digits

    images = load_digits().images[offset : offset + n]
    return [Image.fromarray((im * 255 / 16).astype(np.uint8)).convert("RGB").resize((28, 28)) for im in images]


def _reference(model_dir, texts, images) -> tuple[np.ndarray, np.ndarray]:
    """transformers' CLIP features, L2-normalised (compared by cosine)."""
    import torch
    from transformers import AutoProcessor, CLIPModel

    model = CLIPModel.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    with torch.no_grad():
        text = model.get_text_features(**processor(text=texts, padding=True, return_tensors="pt"))
        image = model.get_image_features(**processor(images=images, return_tensors="pt"))
    text, image = (getattr(x, "pooler_output", x) for x in (text, image))
    return (torch.nn.functional.normalize(x, dim=-1).numpy() for x in (text, image))


def test_clip_texts_and_images_match_transformers(clip):
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import row_cosines

    model_dir, enc = clip
    assert enc.mteb_model_meta.modalities == ["text", "image"]  # mteb lets it run image tasks
    images = _digits(12)
    texts = ["a photo of the digit zero", "the number one", "two", "a handwritten seven"]
    ref_text, ref_image = _reference(model_dir, texts, images)
    meta = get_tasks(["WordSim353"])[0].metadata  # any task: only its prompts are read
    batches = [{"image": images[:5]}, {"image": images[5:]}]  # as mteb's image dataloaders yield them
    got_image = enc.encode(batches, task_metadata=meta, hf_split="test", hf_subset="default")
    got_text = enc.encode_texts(texts)
    assert got_image.shape == (12, 64) and got_text.shape == (4, 64)
    assert row_cosines(got_image, ref_image).min() >= 0.99999 and row_cosines(got_text, ref_text).min() >= 0.99999
    unit = got_image / np.linalg.norm(got_image, axis=1, keepdims=True)
    similarity = unit @ unit.T
    assert similarity[~np.eye(12, dtype=bool)].max() < 0.9999  # other images, other vectors
    # Raw projections, as transformers gives them (not L2-normalised: no sentence-transformers Normalize).
    assert np.linalg.norm(got_image, axis=1).min() > 1.5


def test_images_reach_vllm_with_their_digest_so_its_front_end_does_not_hash_the_pixels(clip, monkeypatch):
    from vllm.multimodal.hasher import MultiModalHasher

    _, enc = clip
    hashed = []
    original = MultiModalHasher.hash_kwargs
    monkeypatch.setattr(
        MultiModalHasher, "hash_kwargs", classmethod(lambda cls, *a, **k: hashed.append(k) or original(*a, **k))
    )
    images = [ImageInput(im) for im in _digits(6, offset=40)]
    ours = enc.encode_texts(images)
    assert hashed == []  # the digest went as the image's multi_modal_uuids entry
    plain = [{"prompt": "", "multi_modal_data": {"image": x.image}} for x in images]
    theirs = np.asarray([o.outputs.embedding for o in enc.llm.embed(plain, use_tqdm=False)])
    assert len(hashed) == 6  # without it vLLM hashes every image itself: the counter sees its calls
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cos.min() >= 0.99999  # the same vectors either way


def test_an_image_with_its_text_is_the_sum_of_their_raw_vectors_as_mtebs_clip_wrapper(clip, st_encoder):
    """A fused input (mteb's VisionCentricQA tasks): the text's plus the image's raw vectors, as mteb's CLIPModel
    sums get_text_features and get_image_features; a text-only model refuses one in one line."""
    from datasets import Dataset
    from mteb.models.model_implementations.clip_models import CLIPModel
    from torch.utils.data import DataLoader

    from vllm_eval.tasks import get_tasks

    model_dir, enc = clip
    meta = get_tasks(["WordSim353"])[0].metadata
    images, texts = _digits(4, offset=50), ["the digit two", "a handwritten five", "two", "nine"]
    loader = DataLoader(  # as mteb hands a fused split over: a dataset with both columns, in batches
        Dataset.from_dict({"text": texts, "image": images}),
        batch_size=3,
        collate_fn=lambda rows: {key: [r[key] for r in rows] for key in ("text", "image")},
    )
    fused = enc.encode(loader, task_metadata=meta, hf_split="test", hf_subset="default")
    alone = enc.encode_texts([*texts, *(ImageInput(im) for im in images)])
    assert fused.shape == (4, 64) and fused.dtype == np.float32
    np.testing.assert_allclose(fused, alone[:4] + alone[4:], rtol=1e-5, atol=1e-5)
    reference = CLIPModel(str(model_dir), revision=None, device="cpu")
    theirs = reference.encode(loader, task_metadata=meta, hf_split="test", hf_subset="default", show_progress_bar=False)
    np.testing.assert_allclose(fused, theirs.numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(UsageError, match=r"embeds a text or an image, not both in one input \(a fused"):
        st_encoder.encode(loader, task_metadata=meta, hf_split="test", hf_subset="default")


def test_images_repeat_once_and_are_cached_by_their_pixels(clip, tmp_path):
    from vllm_eval.models.cache import OutputCache
    from vllm_eval.tasks import get_tasks

    _, enc = clip
    meta = get_tasks(["WordSim353"])[0].metadata
    images = _digits(3, offset=20)

    def encode(batch):
        return enc.encode([{"image": batch}], task_metadata=meta, hf_split="test", hf_subset="default")

    enc.use_cache(OutputCache(tmp_path))
    try:
        before = enc.counters.distinct
        first = encode([images[0], images[1], images[0].copy()])  # a copy: the same pixels
        assert enc.counters.distinct - before == 2
        np.testing.assert_array_equal(first[0], first[2])
        hits = enc.counters.cache_hits
        again = encode(images[:2])
        assert enc.counters.cache_hits - hits == 2
        np.testing.assert_array_equal(again, first[:2])
        changed = np.asarray(images[0]).copy()
        changed[0, 0, 0] ^= 1  # one pixel, one bit
        hits = enc.counters.cache_hits
        encode([changed])
        assert enc.counters.cache_hits == hits  # other pixels, another key
    finally:
        enc.use_cache(None)


def test_digit_image_tasks_score_as_mtebs_own_clip(clip, cli_in_process, tmp_path):
    """The three offline digit tasks through `vllm-eval run` and through mteb's own CLIP wrapper (transformers)."""
    import json

    from mteb.models.model_implementations.clip_models import CLIPModel

    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks.images import IMAGE_TASKS

    model_dir, enc = clip
    names = [cls.metadata.name for cls in IMAGE_TASKS]
    out = ["--no-cache", "--no-progress", "--output-dir", str(tmp_path)]
    code, err = cli_in_process("run", "--model", str(model_dir), "--tasks", *names, *out)
    assert code == 0, err
    ours = {s["task"]: s["main_score"] for s in json.loads((tmp_path / "summary.json").read_text())["scores"]}
    reference = CLIPModel(str(model_dir), revision=None, device="cpu")
    reference.mteb_model_meta = enc.mteb_model_meta.model_copy(update={"name": "local/mteb-clip-wrapper"})
    theirs = {
        r.task: r.main_score for r in evaluate(reference, [cls() for cls in IMAGE_TASKS], show_progress_bar=False)
    }
    print("\ndigit tasks, ours vs mteb's CLIP wrapper:", {n: (ours[n], theirs[n]) for n in names})
    assert abs(ours["DigitsZeroShot"] - theirs["DigitsZeroShot"]) < 1e-6
    assert abs(ours["DigitsTextToImageRetrieval"] - theirs["DigitsTextToImageRetrieval"]) < 1e-6
    # A logistic regression on a random model's nearly collinear vectors: a few of 3,000 predictions may flip.
    assert abs(ours["DigitsImageClassification"] - theirs["DigitsImageClassification"]) < 5e-3


def test_sentence_transformers_reference_takes_images_and_compare_agrees(clip, cli_in_process, tmp_path):
    """sentence-transformers loads the same CLIP (its image modality), and `compare` checks vLLM against it on the
    image tasks, per task and per input."""
    import json

    from vllm_eval.models.encoder.st import SentenceTransformerEncoder
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing import row_cosines

    model_dir, enc = clip
    st = SentenceTransformerEncoder(str(model_dir), show_progress_bar=False)
    assert st.mteb_model_meta.modalities == ["text", "image"]
    meta = get_tasks(["WordSim353"])[0].metadata
    batches = [{"image": _digits(6, offset=40)}]
    ours, theirs = (m.encode(batches, task_metadata=meta, hf_split="test", hf_subset="default") for m in (enc, st))
    assert row_cosines(ours, theirs).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), np.linalg.norm(theirs, axis=1), rtol=1e-4)
    fused = [{"text": ["seven", "a handwritten three"], "image": _digits(2, offset=60)}]  # text + image, both
    ours, theirs = (m.encode(fused, task_metadata=meta, hf_split="test", hf_subset="default") for m in (enc, st))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    out = tmp_path / "cmp"
    args = ["--tasks", "DigitsZeroShot", "DigitsTextToImageRetrieval", "--sample", "32", "--no-progress"]
    code, err = cli_in_process("compare", "--model", str(model_dir), "--backends", "vllm", "st", *args,
                               "--output-dir", str(out))  # fmt: skip
    assert code == 0, err
    report = json.loads((out / "compare.json").read_text())
    assert report["passed"] and all(r["delta"] <= 1e-4 for r in report["rows"])
    assert report["agreement"]["vllm default"]["min_cosine"] >= 0.99999


def test_siglip_texts_padded_as_trained_and_images_match_transformers(tmp_path):
    """SigLIP's text tower pools the last of 64 positions without an attention mask: its texts must go padded
    (unpadded, these text vectors were at cosine 0.12-0.48 of transformers')."""
    import torch
    from transformers import AutoProcessor, SiglipModel

    from vllm_eval import VllmEncoder
    from vllm_eval.testing import build_tiny_siglip, row_cosines

    model_dir = str(build_tiny_siglip(tmp_path / "siglip"))
    texts = ["a photo of the digit three", "seven", "the government said on tuesday that it would act quickly"]
    images = _digits(4, offset=40)
    model, processor = SiglipModel.from_pretrained(model_dir).eval(), AutoProcessor.from_pretrained(model_dir)
    with torch.no_grad():
        ref_text = model.get_text_features(**processor(text=texts, padding="max_length", return_tensors="pt"))
        ref_image = model.get_image_features(**processor(images=images, return_tensors="pt"))
    ref_text, ref_image = (getattr(x, "pooler_output", x).numpy() for x in (ref_text, ref_image))
    enc = VllmEncoder(model_dir, show_progress_bar=False, pretokenize=False)  # padding overrides text prompts
    try:
        assert enc.mteb_model_meta.modalities == ["text", "image"]
        got_text = enc.encode_texts(texts)
        got_image = enc.encode_texts([ImageInput(x) for x in images])
    finally:
        enc.close()
    assert row_cosines(got_text, ref_text).min() >= 0.99999
    assert row_cosines(got_image, ref_image).min() >= 0.99999
    assert np.abs(row_cosines(got_text[:1], got_text[1:2])).max() < 0.9999  # other texts, other vectors


def test_an_image_task_for_a_text_only_model_is_refused_before_its_engine(cli_in_process, monkeypatch):
    from vllm_eval.engine import build as engine

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine started")

    monkeypatch.setattr(engine, "acquire_engine", no_engine)
    code, err = cli_in_process("run", "--tasks", "DigitsZeroShot", "--no-progress", "--no-cache")
    assert code == 2, err
    assert "task DigitsZeroShot needs a model that takes images" in err and "(BertModel, no vision tower" in err
    assert "Traceback" not in err


def test_evaluate_refuses_image_tasks_for_a_text_only_model_in_one_line():
    """Any backend (a served model too, whose config is not read before it starts): before mteb's traceback."""
    from types import SimpleNamespace

    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks import get_tasks

    text_only = SimpleNamespace(mteb_model_meta=SimpleNamespace(modalities=["text"], name="served"))
    with pytest.raises(UsageError, match="task DigitsZeroShot has image and text inputs; the model takes text only"):
        evaluate(text_only, get_tasks(["WordSim353", "DigitsZeroShot"]), show_progress_bar=False)


def _write_digit_files(root, n_classify: int = 40):
    """The digit retrieval task's images, queries and qrels as files (BEIR layout, PNG paths), and an image
    classification file: what a user's own image data looks like."""
    import json

    from vllm_eval.tasks.images import TEST, TRAIN, digits, prompt

    images, labels = digits(TRAIN, TRAIN + TEST)
    (root / "imgs").mkdir(parents=True)
    for i, im in enumerate(images):
        im.save(root / "imgs" / f"{i}.png")
    beir = root / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"digit-{i}", "image": f"../imgs/{i}.png"}) + "\n"
                                               for i in range(len(images))))  # fmt: skip
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{k}", "text": prompt(k)}) + "\n" for k in range(10))
    )
    (beir / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{label}\tdigit-{i}\t1\n" for i, label in enumerate(labels)))  # fmt: skip
    rows = [{"image": f"imgs/{i}.png", "label": prompt(labels[i])} for i in range(n_classify)]
    (root / "mydigits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return beir, root / "mydigits.jsonl"


def test_own_image_files_as_mteb_tasks(clip, cli_in_process, tmp_path):
    """A BEIR directory whose corpus names image files scores as the built-in digit retrieval task on the same
    images; an (image, label) file runs as image classification; a missing image is named by file and line."""
    import json

    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks.images import DigitsTextToImageRetrieval
    from vllm_eval.tasks.owntasks import own_mteb_task

    model_dir, enc = clip
    beir, labelled = _write_digit_files(tmp_path / "data")
    own = own_mteb_task(beir)
    assert (own.metadata.type, own.metadata.category, own.metadata.modalities) == (
        "Any2AnyRetrieval",
        "t2i",
        ["text", "image"],
    )
    rows = evaluate(enc, [own, DigitsTextToImageRetrieval()], show_progress_bar=False)
    assert rows[0].status == "computed" and rows[0].main_score == rows[1].main_score
    out = tmp_path / "run"
    code, err = cli_in_process("run", "--model", str(model_dir), "--data", str(labelled), "--no-cache", "--no-progress",
                               "--output-dir", str(out))  # fmt: skip
    assert code == 0, err
    (score,) = json.loads((out / "summary.json").read_text())["scores"]
    assert score["task"] == "mydigits" and 0.0 <= score["main_score"] <= 1.0
    labelled.write_text(labelled.read_text() + json.dumps({"image": "imgs/missing.png", "label": "x"}) + "\n")
    code, err = cli_in_process("run", "--model", str(model_dir), "--data", str(labelled), "--no-cache")
    assert code == 2 and "mydigits.jsonl:41: field 'image' 'imgs/missing.png': no such file" in err


def test_chunks_hold_one_kind_of_input():
    """The pooled stream's chunks break where texts give way to images, so a backend gets one kind per chunk."""
    from vllm_eval.models.pooling import _is_image
    from vllm_eval.models.streaming import chunked

    image = ImageInput(np.zeros((4, 4), dtype=np.uint8))
    items = ["a", "b", image, image, image, "c"]
    assert list(chunked(items, 2, kind=_is_image)) == [["a", "b"], [image, image], [image], ["c"]]
    assert list(chunked(items, 4)) == [["a", "b", image, image], [image, "c"]]


def test_an_image_input_crosses_processes_as_its_pixels_with_the_same_digest():
    """What a replica receives is the pixel array (no PIL image in the pickle), equal in pixels, digest and prompt;
    the digest is the cache's key of earlier releases: blake2b of the RGB bytes, then the size."""
    import hashlib
    import pickle

    from PIL import Image

    rng = np.random.default_rng(0)
    gray = Image.fromarray(rng.integers(0, 256, (30, 20), dtype=np.uint8), "L")
    x = ImageInput(gray, "prompt {image}")
    rgb = np.asarray(gray.convert("RGB"))
    assert x.digest == hashlib.blake2b(rgb.tobytes(), digest_size=16).hexdigest() + ":20x30"
    state = x.__getstate__()
    assert isinstance(state[0], np.ndarray) and not any(isinstance(v, Image.Image) for v in state)
    y = pickle.loads(pickle.dumps(x, protocol=4))
    assert y == x and y.prompt == "prompt {image}" and y.image.mode == "RGB" and y.image.size == (20, 30)
    assert np.array_equal(np.asarray(y.image), rgb)
    assert not y.pixels.flags.writeable and y.with_prompt("").pixels is y.pixels
