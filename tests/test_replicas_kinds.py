"""Every pooling kind splits its chunks over engine replicas (two, one core each on this machine) and gives
one engine's outputs in input order: classifier, reward model (a per-token head read at the last token),
token classifier and token embedder. (Encoder and reranker: tests/test_replicas.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from vllm_eval.utils.errors import UsageError

pytestmark = pytest.mark.slow


def _texts() -> list[str]:
    from vllm_eval.tasks.data import lee_documents

    return [d[:400] for d in lee_documents()[:24]] + ["", "Ünïcödé", "short"]


def _same(one, two, rows_one, rows_two, what: str) -> None:
    """Outputs equal within 5e-5 (float32 over other batches: 1.14e-5 seen once), both replicas used, the same
    identity, a recorded start."""
    if isinstance(rows_one, list):
        assert [r.shape for r in rows_one] == [r.shape for r in rows_two]
        delta = max(float(np.abs(a - b).max()) for a, b in zip(rows_one, rows_two) if a.size)
    else:
        assert rows_one.shape == rows_two.shape
        delta = float(np.abs(rows_one - rows_two).max())
    print(f"\n{what}: 2 replicas vs 1 engine max |delta| {delta:.2e}; jobs {two.pool.jobs_done}")
    assert delta <= 5e-5
    assert all(n > 0 for n in two.pool.jobs_done.values())
    assert one.identity() == two.identity()
    assert two.counters.engine_start_seconds == two.pool.start_seconds > 0


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="33 s of CI's 30 minutes: the replica pool runs in CI for the encoder and the generator"
    " (tests/test_replicas.py); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_classifier_on_two_replicas(test_models, vllm_classifier):
    from vllm_eval.models.classifier.vllm import VllmClassifier

    texts = _texts()
    with VllmClassifier(
        str(test_models["classifier"]), data_parallel_size=2, chunk_size=8, show_progress_bar=False
    ) as two:
        _same(vllm_classifier, two, vllm_classifier.classify(texts), two.classify(texts), "classifier")


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="45 s of CI's 30 minutes: the replica pool runs in CI for the encoder and the generator"
    " (tests/test_replicas.py), and the reward model in one engine (tests/test_reward.py);"
    " VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_reward_model_on_two_replicas(tmp_path):
    from vllm_eval.models.classifier.vllm import VllmClassifier
    from vllm_eval.testing import build_tiny_reward_model

    reward = str(build_tiny_reward_model(tmp_path / "rm", architecture="qwen2-reward"))
    kwargs = {"use_activation": False, "labels": ["reward"], "show_progress_bar": False}
    texts = [t for t in _texts() if t]  # a decoder refuses an empty prompt (conversations never are)
    with VllmClassifier(reward, **kwargs) as one:
        with pytest.raises(UsageError, match="vLLM refused an input: The decoder prompt cannot be empty"):
            one.classify([""])
        with VllmClassifier(reward, data_parallel_size=2, chunk_size=8, **kwargs) as two:
            assert one.pooling_task == two.pooling_task == "token_classify"  # the per-token head's last token
            _same(one, two, one.classify(texts), two.classify(texts), "reward model")
            with pytest.raises(UsageError, match="vLLM refused an input: The decoder prompt cannot be empty"):
                two.classify(["", "text"])  # from a replica, the same one-line error


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="38 s of CI's 30 minutes: the replica pool runs in CI for the encoder and "
    "generator (tests/test_replicas.py); VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_token_classifier_and_token_embedder_on_two_replicas(test_models, tmp_path):
    from vllm_eval.models.token_classifier.vllm import VllmTokenClassifier
    from vllm_eval.models.token_embedder.vllm import VllmTokenEmbedder
    from vllm_eval.testing import build_minilm_colbert

    texts = _texts()
    sentences = [t.split()[:40] or ["empty"] for t in texts]
    path = str(test_models["token_classifier"])
    with VllmTokenClassifier(path, show_progress_bar=False) as one:
        ref = one.word_probs(sentences)
        with VllmTokenClassifier(path, data_parallel_size=2, chunk_size=8, show_progress_bar=False) as two:
            _same(one, two, ref, two.word_probs(sentences), "token classifier")
    colbert = str(build_minilm_colbert(tmp_path / "colbert"))
    with VllmTokenEmbedder(colbert, show_progress_bar=False) as one:
        ref = one.encode_texts(texts)
        with VllmTokenEmbedder(colbert, data_parallel_size=2, chunk_size=8, show_progress_bar=False) as two:
            _same(one, two, ref, two.encode_texts(texts), "token embedder")


def test_the_generator_records_its_engine_start(generator):
    # Its base is built before the engine starts; the start time still reaches its counters.
    assert generator.counters.engine_start_seconds > 0
