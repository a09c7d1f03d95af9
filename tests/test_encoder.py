"""VllmEncoder against the real vLLM CPU engine on the packaged all-MiniLM-L6-v2."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from mteb.types import PromptType
from torch.utils.data import DataLoader

from vllm_eval.engine.build import live_engines
from vllm_eval.models.prompts import PromptResolver
from vllm_eval.models.streaming import TruncationWarning
from vllm_eval.tasks.offline import LeeDocSimilarity, LeeKnownItemRetrieval

TEXTS = ["The cat sat on the mat.", "Stocks fell sharply on Monday.", "A dog barked at the postman."]
RETRIEVAL = LeeKnownItemRetrieval.metadata
STS = LeeDocSimilarity.metadata


def loader(texts: list, batch_size: int = 2) -> DataLoader:
    """The shape mteb hands to encode(): batches of {"text": [...]} (any item type, to test checks)."""
    return DataLoader(
        [{"text": t} for t in texts], batch_size=batch_size, collate_fn=lambda b: {"text": [x["text"] for x in b]}
    )


def encode(enc, texts, task=RETRIEVAL, prompt_type=None):
    return enc.encode(loader(texts), task_metadata=task, hf_split="test", hf_subset="default", prompt_type=prompt_type)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_output_dtype_shape_and_normalisation(vllm_encoder):
    emb = vllm_encoder.encode_texts(TEXTS)
    assert emb.dtype == np.float32
    assert emb.shape == (3, 384)
    # all-MiniLM-L6-v2 ships a Normalize module, so vLLM's pooler normalises.
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert vllm_encoder.mteb_model_meta.embed_dim == 384
    assert vllm_encoder.mteb_model_meta.n_parameters == 22_713_216


def test_normalize_false_gives_raw_pooled_vectors(vllm_encoder):
    from vllm_eval import VllmEncoder

    raw = VllmEncoder(normalize=False, show_progress_bar=False)
    try:
        assert raw.llm is vllm_encoder.llm  # normalisation is per request: same engine
        out = raw.encode_texts(TEXTS)
    finally:
        raw.close()
    norms = np.linalg.norm(out, axis=1)
    assert np.all(np.abs(norms - 1.0) > 1e-2)
    np.testing.assert_allclose(unit(out), vllm_encoder.encode_texts(TEXTS), atol=1e-5)


def test_static_prompt_reaches_the_model(vllm_encoder):
    from vllm_eval import VllmEncoder

    enc = VllmEncoder(prompts={"query": "query: ", "document": "passage: "}, show_progress_bar=False)
    try:
        q = encode(enc, TEXTS, prompt_type=PromptType.query)
        d = encode(enc, TEXTS, prompt_type=PromptType.document)
        sts = encode(enc, TEXTS, task=STS)  # no key matches an STS task without prompt type
    finally:
        enc.close()
    np.testing.assert_allclose(q, vllm_encoder.encode_texts(["query: " + t for t in TEXTS]), atol=1e-6)
    np.testing.assert_allclose(d, vllm_encoder.encode_texts(["passage: " + t for t in TEXTS]), atol=1e-6)
    np.testing.assert_allclose(sts, vllm_encoder.encode_texts(TEXTS), atol=1e-6)
    assert np.max(np.abs(q - vllm_encoder.encode_texts(TEXTS))) > 1e-2


def test_e5_preset_prompts_reach_the_model_on_every_local_backend(vllm_encoder, st_encoder):
    """The e5 preset's 'query: ' / 'passage: ' reach vLLM and sentence-transformers alike; explicit prompts win."""
    from vllm_eval import SentenceTransformerEncoder, VllmEncoder

    with VllmEncoder(preset="e5", show_progress_bar=False) as enc:
        assert enc.preset.name == "e5" and enc.llm is vllm_encoder.llm  # prompts are per request: same engine
        q = encode(enc, TEXTS, prompt_type=PromptType.query)
        d = encode(enc, TEXTS, prompt_type=PromptType.document)
    np.testing.assert_allclose(q, vllm_encoder.encode_texts(["query: " + t for t in TEXTS]), atol=1e-6)
    np.testing.assert_allclose(d, vllm_encoder.encode_texts(["passage: " + t for t in TEXTS]), atol=1e-6)
    assert np.max(np.abs(q - vllm_encoder.encode_texts(TEXTS))) > 1e-2
    with SentenceTransformerEncoder(preset="e5", device="cpu", show_progress_bar=False) as st:
        st_q = encode(st, TEXTS, prompt_type=PromptType.query)
    np.testing.assert_allclose(st_q, st_encoder.encode_texts(["query: " + t for t in TEXTS]), atol=1e-6)
    with VllmEncoder(preset="e5", prompts={"query": "q: "}, show_progress_bar=False) as own:
        mine = encode(own, TEXTS, prompt_type=PromptType.query)
    np.testing.assert_allclose(mine, vllm_encoder.encode_texts(["q: " + t for t in TEXTS]), atol=1e-6)


def test_prompt_keys_follow_mteb_priority():
    p = PromptResolver(prompts={"LeeKnownItemRetrieval-query": "A: ", "Retrieval": "B: ", "query": "C: ", "STS": "D: "})
    assert p.prefix(RETRIEVAL, PromptType.query) == "A: "
    assert p.prefix(RETRIEVAL, PromptType.document) == "B: "
    assert p.prefix(STS, None) == "D: "


def test_instruction_template_from_task_metadata(vllm_encoder):
    from vllm_eval import VllmEncoder

    p = PromptResolver(instruction_template="Instruct: {instruction}\nQuery: ")
    q = p.prefix(RETRIEVAL, PromptType.query)
    assert q.startswith("Instruct: ") and q.endswith("\nQuery: ") and len(q) > len("Instruct: \nQuery: ")
    assert p.prefix(RETRIEVAL, PromptType.document) == ""  # documents untouched by default
    both = PromptResolver(instruction_template="Instruct: {instruction}\n", apply_instruction_to_documents=True)
    assert both.prefix(RETRIEVAL, PromptType.document).startswith("Instruct: ")
    own = PromptResolver(
        instruction_template=lambda inst, pt: f"<{pt.value if pt else 'none'}>{inst}|",
        instructions={"LeeKnownItemRetrieval": "find the article"},
    )
    assert own.prefix(RETRIEVAL, PromptType.query) == "<query>find the article|"
    with pytest.raises(ValueError, match="instruction"):
        PromptResolver(instruction_template="no placeholder")

    enc = VllmEncoder(instruction_template="Instruct: {instruction}\nQuery: ", show_progress_bar=False)
    try:
        got = encode(enc, TEXTS, prompt_type=PromptType.query)
    finally:
        enc.close()
    np.testing.assert_allclose(got, vllm_encoder.encode_texts([q + t for t in TEXTS]), atol=1e-6)


def test_matryoshka_dimensions_unsupported_is_a_clear_error(vllm_encoder):
    from vllm_eval import VllmEncoder

    before = live_engines()
    with pytest.raises(ValueError, match="does not support matryoshka"):
        VllmEncoder(dimensions=128, show_progress_bar=False)
    assert live_engines() == before  # the shared engine survives the failed constructor
    assert vllm_encoder.encode_texts(TEXTS[:1]).shape == (1, 384)


def test_matryoshka_dimensions_when_declared(vllm_encoder):
    from vllm_eval import VllmEncoder
    from vllm_eval.engine.build import _in_process

    overrides = {"matryoshka_dimensions": [128, 384]}
    enc = VllmEncoder(dimensions=128, hf_overrides=overrides, show_progress_bar=False)
    raw = VllmEncoder(normalize=False, hf_overrides=overrides, show_progress_bar=False)
    try:
        assert enc.llm is raw.llm and _in_process(raw.llm) and _in_process(vllm_encoder.llm)
        small = enc.encode_texts(TEXTS)
        full = raw.encode_texts(TEXTS)
        assert enc.mteb_model_meta.embed_dim == 128
        with pytest.raises(ValueError, match="supports dimensions"):
            VllmEncoder(dimensions=100, hf_overrides=overrides, show_progress_bar=False)
    finally:
        enc.close()
        raw.close()
    assert small.shape == (3, 128)
    np.testing.assert_allclose(small, unit(full[:, :128]), atol=1e-5)
    # That was a second in-process engine next to the session's; closing it left the session's working.
    assert vllm_encoder.encode_texts(TEXTS[:1]).shape == (1, 384)


def test_truncation_counted_with_one_warning_per_call(vllm_encoder):
    long = "word " * 600
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        emb = vllm_encoder.encode_texts([long, "short text", long + "x"])
    trunc = [w for w in caught if issubclass(w.category, TruncationWarning)]
    assert len(trunc) == 1
    assert "2 of 3 distinct inputs exceeded 256 tokens" in str(trunc[0].message)
    assert emb.shape == (3, 384) and np.all(np.isfinite(emb))
    ids, n = vllm_encoder.tokenizer([long])
    assert n == 1 and len(ids[0]) == 256 and ids[0][0] == 101 and ids[0][-1] == 102  # [CLS] ... [SEP]


def test_look_ahead_tokenizer_is_private_to_the_backend(st_encoder):
    """Our look-ahead thread tokenizes chunk k+1 while sentence-transformers tokenizes chunk k with
    its own settings; on one shared fast tokenizer the two threads set each other's truncation and
    padding (a long text once came out of the sentence-transformers backend at cosine 0.9907)."""
    import threading

    from vllm_eval.tasks import data

    own = st_encoder.st.tokenizer
    assert st_encoder.tokenizer.tokenizer is not own
    before = own.backend_tokenizer.truncation
    long_texts = [t for t in data.mini_newsgroups().texts if len(t) > 3000][:32]
    st_encoder.tokenizer(long_texts)
    assert own.backend_tokenizer.truncation == before
    stop = threading.Event()

    def look_ahead() -> None:
        while not stop.is_set():
            st_encoder.tokenizer(long_texts[:8])

    worker = threading.Thread(target=look_ahead)
    worker.start()
    try:
        shapes = {
            own(long_texts, padding=True, truncation=True, max_length=256, return_tensors="np")["input_ids"].shape
            for _ in range(20)
        }
    finally:
        stop.set()
        worker.join()
    assert shapes == {(len(long_texts), 256)}


def test_token_ids_match_vllm_text_path(vllm_encoder):
    texts = TEXTS + ["", "word " * 600, "Ünïcödé and emoji 🙂"]
    ours, _ = vllm_encoder.tokenizer(texts)
    outs = vllm_encoder.llm.embed(texts, tokenization_kwargs={"truncate_prompt_tokens": -1}, use_tqdm=False)
    assert ours == [list(o.prompt_token_ids) for o in outs]
    np.testing.assert_allclose(
        vllm_encoder.encode_texts(texts), np.array([o.outputs.embedding for o in outs]), atol=1e-6
    )


def test_empty_string_and_duplicates(vllm_encoder, st_encoder):
    emb = vllm_encoder.encode_texts(["", "same", "", "same"])
    np.testing.assert_allclose(emb[0], emb[2])
    np.testing.assert_allclose(emb[1], emb[3])
    assert np.isclose(np.linalg.norm(emb[0]), 1.0, atol=1e-5)
    ref = st_encoder.encode_texts([""])
    assert float(emb[0] @ ref[0]) >= 0.9999


def test_non_string_input_names_the_item(vllm_encoder):
    with pytest.raises(TypeError, match=r"input 1 is NoneType"):
        vllm_encoder.encode_texts(["ok", None])
    with pytest.raises(TypeError, match=r"input 3 is int"):
        encode(vllm_encoder, ["a", "b", "c", 5], task=STS)
    with pytest.raises(TypeError, match="single str"):
        vllm_encoder.encode_texts("not a list")


def test_empty_input_gives_empty_matrix(vllm_encoder):
    out = vllm_encoder.encode_texts([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_engine_is_shared_and_released(vllm_encoder):
    from vllm_eval import VllmEncoder

    n = live_engines()
    with VllmEncoder(show_progress_bar=False) as other:
        assert other.llm is vllm_encoder.llm
        assert live_engines() == n
    assert other.llm is None
    assert vllm_encoder.encode_texts(TEXTS[:1]).shape == (1, 384)  # still alive after the other closed


def test_bad_options_and_paths_fail_before_the_engine():
    from vllm_eval import VllmEncoder

    with pytest.raises(TypeError, match="max_model_len"):
        VllmEncoder(max_len=128)
    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        VllmEncoder("/no/such/model")
    with pytest.raises(ValueError, match="positive int"):
        VllmEncoder(dimensions=0)


def test_engine_starts_in_process_with_numba_loaded(vllm_encoder):
    import sys

    import numba

    from vllm_eval import VllmEncoder
    from vllm_eval.engine.build import _in_process
    from vllm_eval.engine.procenv import modules_breaking_kernel_scan

    # numba loads llvmlite, whose library wrapper breaks vLLM's in-process kernel walk; it is left out
    # of sys.modules while an engine starts, so a new engine's core still runs in this process.
    lib = sys.modules["llvmlite.binding.ffi"]
    assert modules_breaking_kernel_scan() == ["llvmlite.binding.ffi"]
    with VllmEncoder(max_model_len=128, show_progress_bar=False) as enc:
        assert enc.llm is not vllm_encoder.llm and _in_process(enc.llm)
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert enc.encode_texts(["a cat", "a dog"]).shape == (2, 384)
    assert sys.modules["llvmlite.binding.ffi"] is lib and numba.njit(lambda x: x + 1)(1) == 2
    assert vllm_encoder.encode_texts(TEXTS[:1]).shape == (1, 384)


def test_in_process_chunks_are_pipelined(vllm_encoder, monkeypatch):
    """The next chunk's requests are in the engine before this one's outputs are collected (vllm_eval.engine.pipeline),
    with the rows of the synchronous path (one LLM.embed per chunk)."""
    from vllm_eval import VllmEncoder

    texts = [f"sentence {i} about {w}" for i, w in enumerate(["cats", "stocks", "rain", "music", "ships"] * 5)]
    engine = vllm_encoder.llm.llm_engine
    step, in_engine = engine.step, []

    def counted_step():
        in_engine.append(engine.get_num_unfinished_requests())
        return step()

    monkeypatch.setattr(engine, "step", counted_step)
    with VllmEncoder(chunk_size=4, show_progress_bar=False) as enc:
        assert enc.llm is vllm_encoder.llm
        pipelined = enc.encode_texts(texts)
        assert enc.max_in_flight == 1 and max(in_engine) > 4  # two chunks of 4 in the engine at once
        in_engine.clear()
        monkeypatch.setenv("VLLMEVAL_PIPELINE", "0")
        synchronous = enc.encode_texts(texts)
        assert max(in_engine) <= 4
    assert pipelined.dtype == np.float32 and pipelined.shape == (len(texts), 384)
    np.testing.assert_allclose(pipelined, synchronous, atol=1e-6)


def test_pipelined_refusal_leaves_nothing_in_the_engine(vllm_encoder):
    from vllm_eval.engine.jobs import embed_job, submit_embed
    from vllm_eval.utils.errors import UsageError

    ids = [[101, 2000, 102], [101, 999_999, 102]]  # the second is refused after the first was added
    future = vllm_encoder.submit_split(embed_job, 2, lambda lo, hi: (ids[lo:hi], None, None), pipelined=submit_embed)
    with pytest.raises(UsageError, match="vLLM refused an input: Token id 999999 is out of vocabulary"):
        future.result()
    assert not vllm_encoder.llm.llm_engine.has_unfinished_requests()
    assert vllm_encoder.encode_texts(TEXTS).shape == (3, 384)


def test_an_interrupt_between_steps_leaves_nothing_in_the_engine(vllm_encoder, monkeypatch):
    """An exception raised in the stream between engine steps (a signal: the stall watchdog's, Ctrl-C) with chunks in
    flight aborts their requests, so the engine stays usable."""
    from vllm_eval import VllmEncoder

    engine = vllm_encoder.llm.llm_engine
    has_unfinished, calls = engine.has_unfinished_requests, []

    def interrupted() -> bool:
        calls.append(engine.get_num_unfinished_requests())
        if len(calls) == 3:
            raise KeyboardInterrupt
        return has_unfinished()

    texts = [f"sentence {i}" for i in range(24)]
    with VllmEncoder(chunk_size=4, show_progress_bar=False) as enc:
        enc.encode_texts(texts[:8])  # the stream pipelines from its second call on
        monkeypatch.setattr(engine, "has_unfinished_requests", interrupted)
        with pytest.raises(KeyboardInterrupt):
            enc.encode_texts(texts)
        monkeypatch.undo()
        assert calls[-1] > 0 and not engine.has_unfinished_requests()
        assert enc.encode_texts(texts).shape == (24, 384)


def test_a_big_pooling_model_on_a_gpu_runs_its_engine_core_in_this_process(tmp_path):
    """The rule, read off the safetensors headers only (a header that claims 4.3 B parameters, no tensor data)."""
    import json
    import struct

    from vllm_eval.engine.procenv import GPU_IN_PROCESS_MIN_PARAMS, big_pooling_model

    def model(name: str, shape: list[int], config: dict | None = None) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config or {"architectures": ["Qwen3ForCausalLM"]}))
        header = json.dumps({"w": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 2 * shape[0] * shape[1]]}})
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
        return str(folder)

    big, small = model("big", [65536, 65536]), model("small", [1024, 1024])
    assert 65536 * 65536 >= GPU_IN_PROCESS_MIN_PARAMS
    assert big_pooling_model(big, {"runner": "pooling"})
    assert not big_pooling_model(small, {"runner": "pooling"})
    assert not big_pooling_model(big, {"runner": "generate"})  # decoding: vLLM's core process overlaps host work
    assert not big_pooling_model(big, {"runner": "pooling", "tensor_parallel_size": 2})
    assert not big_pooling_model("org/hub-id", {"runner": "pooling"})
    vlm = model("vlm", [65536, 65536], {"architectures": ["Qwen2VLForConditionalGeneration"], "vision_config": {}})
    assert not big_pooling_model(vlm, {"runner": "pooling"})  # measured on text only
