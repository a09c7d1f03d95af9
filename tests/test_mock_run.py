"""mteb's own model check, ``mteb.mock_run`` (every mock task of each modality the model takes): each backend
passes at least the tasks mteb's equivalent wrapper passes on the same tiny model, compared by task name.

mteb's wrapper runs once per model here and its result is shared by the backends checked against it; the
engines are the session's (``conftest.py``), so this file adds mock runs, and one engine of its own (ColBERT).
"""

from __future__ import annotations

import pytest


def _passed(model) -> set[str]:
    """Names of the mock tasks ``mteb.mock_run`` ran on ``model`` without an error."""
    import mteb
    from mteb.results.task_result import TaskResult

    return {name for name, status in mteb.mock_run(model).items() if isinstance(status, TaskResult)}


def _check(label: str, ours: set[str], theirs: set[str]) -> None:
    print(f"\n{label}: ours pass {len(ours)}, mteb's wrapper {len(theirs)}")
    print(f"  ours: {sorted(ours)}\n  mteb's: {sorted(theirs)}")
    assert theirs, f"{label}: mteb's wrapper passed no mock task (a broken reference, not a check)"
    assert theirs <= ours, f"{label}: mteb's wrapper passes {sorted(theirs - ours)}, ours does not"


@pytest.fixture(scope="module")
def mteb_st_minilm() -> set[str]:
    """mteb's sentence-transformers wrapper on the packaged MiniLM."""
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper

    from vllm_eval.utils.modelinfo import packaged_model_path

    return _passed(SentenceTransformerEncoderWrapper(str(packaged_model_path()), device="cpu"))


@pytest.fixture(scope="module")
def mteb_clip(clip) -> set[str]:
    """mteb's own CLIP wrapper (transformers' get_text_features / get_image_features) on the tiny CLIP's files."""
    from mteb.models.model_implementations.clip_models import CLIPModel

    model_dir, enc = clip
    reference = CLIPModel(str(model_dir), revision=None, device="cpu")
    reference.mteb_model_meta = enc.mteb_model_meta.model_copy(update={"name": "local/mteb-clip-wrapper"})
    return _passed(reference)


@pytest.fixture(scope="module")
def mteb_cross(test_models) -> set[str]:
    """mteb's ``CrossEncoderWrapper`` (sentence-transformers' CrossEncoder) on the seeded MiniLM cross-encoder."""
    from mteb.models.sentence_transformer_wrapper import CrossEncoderWrapper

    return _passed(CrossEncoderWrapper(str(test_models["cross"]), device="cpu"))


@pytest.fixture(scope="module")
def mteb_colbert(colbert) -> set[str]:
    """mteb's ``MultiVectorWrapper`` (sentence-transformers' ``MultiVectorEncoder``) on the same ColBERT files;
    mteb's registered ColBERT wrappers need pylate, which the test environment does not hold."""
    from mteb.models.sentence_transformer_wrapper import MultiVectorWrapper

    return _passed(MultiVectorWrapper(colbert, device="cpu"))


@pytest.mark.parametrize("backend", ["vllm", "st"])
def test_text_encoder_passes_what_mtebs_sentence_transformers_wrapper_passes(backend, request, mteb_st_minilm):
    ours = _passed(request.getfixturevalue(f"{backend}_encoder"))
    _check(f"encoder {backend}, packaged MiniLM", ours, mteb_st_minilm)


@pytest.mark.parametrize("backend", ["vllm", "st"])
def test_clip_encoder_passes_what_mtebs_clip_wrapper_passes_fused_tasks_too(backend, clip, mteb_clip):
    """Text and image tasks, and the two fused image+text ones (VisionCentricQA), which mteb's CLIP wrapper
    embeds as the sum of the two towers' vectors; sentence-transformers' own wrapper refuses those two, so the
    st backend is held to mteb's CLIP wrapper, the model's own."""
    from vllm_eval import SentenceTransformerEncoder

    model_dir, enc = clip
    if backend == "vllm":
        ours = _passed(enc)
    else:
        with SentenceTransformerEncoder(str(model_dir), device="cpu", show_progress_bar=False) as st:
            ours = _passed(st)
    _check(f"encoder {backend}, tiny CLIP", ours, mteb_clip)
    assert {"MockVisionCentricQA", "MockMultilingualVisionCentricQA"} <= ours


@pytest.mark.parametrize("backend", ["vllm", "st"])
def test_reranker_passes_what_mtebs_cross_encoder_wrapper_passes(backend, request, mteb_cross):
    ours = _passed(request.getfixturevalue(f"{backend}_cross"))
    _check(f"reranker {backend}, MiniLM cross-encoder", ours, mteb_cross)


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_token_embedder_passes_what_mtebs_multi_vector_wrapper_passes(backend, colbert, mteb_colbert):
    from mteb.mocks.mock_run import get_compatible_mock_tasks
    from mteb.models.sentence_transformer_wrapper import MultiVectorWrapper

    from vllm_eval.models.backends import load_backend
    from vllm_eval.utils.errors import UsageError

    with load_backend("token_embedder", backend, colbert, show_progress_bar=False) as model:
        ours = _passed(model)
        offered = {t.metadata.name: t for t in get_compatible_mock_tasks(model)}
        other = next(t for t in mock_tasks() if t.metadata.type == "Classification")
        with pytest.raises(UsageError, match=r"is Classification: a token_embed \(multi-vector\) model ranks"):
            model.encode([], task_metadata=other.metadata, hf_split="test", hf_subset="default")
    _check(f"token_embedder {backend}, MiniLM ColBERT", ours, mteb_colbert)
    # offered what mteb offers its own multi-vector wrapper (search tasks), not all 28 text tasks
    theirs = {t.metadata.name for t in get_compatible_mock_tasks(MultiVectorWrapper(colbert, device="cpu"))}
    assert set(offered) == theirs and ours <= set(offered)


def mock_tasks():
    from mteb.mocks.mock_run import ALL_MOCK_TASK_TEST_GRID

    return ALL_MOCK_TASK_TEST_GRID
