"""The output cache: exact round trips, damaged entries, several processes, and keys that change with identity."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from mteb.types import PromptType

from vllm_eval.models.cache import OutputCache, identity_digest, input_key, weights_fingerprint
from vllm_eval.tasks.offline import LeeKnownItemRetrieval
from vllm_eval.testing import text_loader
from vllm_eval.utils.modelinfo import packaged_model_path

TEXTS = ["The cat sat on the mat.", "Stocks fell sharply on Monday.", "A dog barked.", "The cat sat on the mat."]


def test_values_round_trip_bit_identical(tmp_path):
    cache = OutputCache(tmp_path)
    rng = np.random.default_rng(0)
    rows = {bytes([i]) * 20: rng.standard_normal(384).astype(np.float32) for i in range(5)}
    cache.put_many(rows.items())
    cache.put_many([(b"g" * 20, {"prompt": "p", "output": "o", "prompt_tokens": 3, "output_tokens": 1})])
    got = cache.get_many([*rows, b"g" * 20, b"missing" * 3])
    assert set(got) == {*rows, b"g" * 20}
    for key, row in rows.items():
        assert got[key].dtype == np.float32 and got[key].tobytes() == row.tobytes()
    assert got[b"g" * 20]["output"] == "o"
    assert cache.stats.as_dict() == {"hits": 6, "misses": 6, "damaged": 0}
    assert cache.entries() == 6 and cache.size_bytes() > 6 * 384 * 4


def test_a_damaged_entry_is_recomputed_never_returned(tmp_path):
    cache = OutputCache(tmp_path)
    cache.put_many([(b"a" * 20, np.ones(4, np.float32)), (b"b" * 20, np.ones(4, np.float32))])
    with sqlite3.connect(cache.path) as db:  # flip bytes behind the cache's back
        db.execute("UPDATE outputs SET data = ? WHERE key = ?", (np.zeros(4, np.float32).tobytes(), b"a" * 20))
    got = cache.get_many([b"a" * 20, b"b" * 20])
    assert list(got) == [b"b" * 20] and cache.stats.damaged == 1
    assert cache.entries() == 1  # the damaged entry is gone, so it will be computed again


_WRITER = """
import sys
import numpy as np
from vllm_eval.models.cache import OutputCache
cache = OutputCache(sys.argv[1])
worker = int(sys.argv[2])
for batch in range(40):
    # half the keys are this worker's own, half are shared with the other worker
    items = [(f"w{worker}-{batch}-{i}".encode(), np.full(64, worker * 1000 + batch, np.float32)) for i in range(10)]
    items += [(f"shared-{batch}-{i}".encode(), np.full(64, batch, np.float32)) for i in range(10)]
    cache.put_many(items)
    cache.get_many([k for k, _ in items])
print("ok", cache.stats.misses)
"""


def test_two_processes_fill_one_cache_at_once(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(w)], stdout=subprocess.PIPE, text=True)
        for w in (1, 2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    cache = OutputCache(tmp_path)
    assert cache.entries() == 2 * 40 * 10 + 40 * 10
    keys = {f"shared-{b}-{i}".encode(): b for b in range(40) for i in range(10)}
    shared = cache.get_many(list(keys))
    assert len(shared) == 400 and all(float(shared[k][0]) == b for k, b in keys.items())


def test_keys_depend_on_identity_and_exact_input():
    ident = {"model": "m", "dtype": "float32", "dimensions": None}
    base = identity_digest(ident)
    assert identity_digest(dict(reversed(list(ident.items())))) == base  # key order does not matter
    for field, value in (("model", "m2"), ("dtype", "bfloat16"), ("dimensions", 128), ("revision", "abc")):
        assert identity_digest({**ident, field: value}) != base, field
    assert input_key(base, [101, 7, 102]) != input_key(base, [101, 7, 7, 102])
    assert input_key(base, "query: a") != input_key(base, "passage: a")
    assert input_key(base, [1, 2]) != input_key(base, "[1, 2]")


def test_weights_fingerprint_reads_the_files(tmp_path):
    model = packaged_model_path()
    assert weights_fingerprint(model) == weights_fingerprint(model)
    (tmp_path / "model.safetensors").write_bytes(b"x" * 300_000)
    first = weights_fingerprint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x" * 150_000 + b"y" + b"x" * 149_999)  # one byte, mid-file
    assert weights_fingerprint(tmp_path) != first and weights_fingerprint(tmp_path / "none") is None


# --- through the backends (real engines) --------------------------------------------------------


def _query_docs(enc, texts):
    meta = LeeKnownItemRetrieval.metadata
    q = enc.encode(
        text_loader(texts), task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=PromptType.query
    )
    d = enc.encode(
        text_loader(texts), task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=PromptType.document
    )
    return q, d


def test_encoder_cache_hits_are_bit_identical_and_prompts_never_share(tmp_path, vllm_encoder):
    from vllm_eval import VllmEncoder

    cache = OutputCache(tmp_path)
    with VllmEncoder(prompts={"query": "query: ", "document": "passage: "}, show_progress_bar=False) as enc:
        enc.use_cache(cache)
        q1, d1 = _query_docs(enc, TEXTS)
        assert cache.stats.misses == 6 and cache.stats.hits == 0  # 3 distinct texts, as query and as document
        q2, d2 = _query_docs(enc, TEXTS)
        assert cache.stats.hits == 6 and cache.stats.misses == 6
        fresh = VllmEncoder(prompts={"query": "query: "}, show_progress_bar=False)
        try:
            q3, _ = _query_docs(fresh, TEXTS)
        finally:
            fresh.close()
    assert q2.tobytes() == q1.tobytes() and d2.tobytes() == d1.tobytes()
    assert q3.tobytes() == q1.tobytes()  # cached == computed without a cache
    assert not np.allclose(q1, d1)


def test_each_identity_field_changed_alone_is_a_miss(tmp_path, vllm_encoder, st_encoder):
    from vllm_eval import SentenceTransformerEncoder, VllmEncoder

    cache = OutputCache(tmp_path)
    texts = ["one text", "another text"]

    def misses(enc) -> int:
        enc.use_cache(cache)
        before = cache.stats.misses
        enc.encode_texts(texts)
        return cache.stats.misses - before

    assert misses(vllm_encoder) == 2 and misses(vllm_encoder) == 0
    assert misses(st_encoder) == 2 and misses(st_encoder) == 0  # backend
    with SentenceTransformerEncoder(dtype="bfloat16", device="cpu", show_progress_bar=False) as bf16:
        assert misses(bf16) == 2  # dtype
    with SentenceTransformerEncoder(dimensions=128, device="cpu", show_progress_bar=False) as small:
        assert misses(small) == 2  # dimensions
    with SentenceTransformerEncoder(revision="another", device="cpu", show_progress_bar=False) as rev:
        assert rev.identity()["revision"] == "another" and misses(rev) == 2  # revision
    with VllmEncoder(max_model_len=128, show_progress_bar=False) as short:
        assert short.identity()["max_length"] == 128 and misses(short) == 2  # max_model_len
    vllm_encoder.use_cache(None)
    st_encoder.use_cache(None)


def test_reranker_and_generator_cache(tmp_path, vllm_cross, generator):
    cache = OutputCache(tmp_path)
    vllm_cross.use_cache(cache)
    generator.use_cache(cache)
    try:
        first = vllm_cross.score_pairs(["q", "q", "r"], ["d1", "d2", "d1"])
        again = vllm_cross.score_pairs(["q", "r"], ["d2", "d1"])
        assert cache.stats.misses == 3 and cache.stats.hits == 2
        assert again.tobytes() == first[[1, 2]].tobytes()
        gens = generator.generate([("Say yes.", ()), ("Say no.", ())])
        assert generator.generate([("Say no.", ())])[0] == gens[1] and cache.stats.hits == 3
        ll = generator.loglikelihoods(["Is it?", "Is it?"], ["yes", "no"])
        assert generator.loglikelihoods(["Is it?"], ["no"]).tobytes() == ll[1:].tobytes()
    finally:
        vllm_cross.use_cache(None)
        generator.use_cache(None)


def test_st_and_vllm_results_in_one_output_dir_stay_apart(tmp_path, vllm_encoder, st_encoder):
    from vllm_eval.evaluation.results import evaluate, results_dir
    from vllm_eval.tasks import get_tasks

    out = tmp_path / "res"
    rows_v = evaluate(vllm_encoder, get_tasks(["WordSim353"]), output_dir=out, show_progress_bar=False)
    rows_s = evaluate(st_encoder, get_tasks(["WordSim353"]), output_dir=out, show_progress_bar=False)
    assert rows_v[0].status == rows_s[0].status == "computed"  # the st run did not reuse the vllm result
    dirs = {results_dir(out, e.mteb_model_meta) for e in (vllm_encoder, st_encoder)}
    assert len(dirs) == 2 and all((d / "WordSim353.json").is_file() for d in dirs)
    assert {d.name for d in dirs} == {"backend_vllm__dtype_float32", "backend_st__dtype_float32"}
    again = evaluate(vllm_encoder, get_tasks(["WordSim353"]), output_dir=out, show_progress_bar=False)
    # Read back from mteb's result file, which stores scores rounded to 6 digits.
    assert again[0].status == "reused" and again[0].main_score == round(rows_v[0].main_score, 6)


@pytest.mark.parametrize("bad", ["/dev/null/x"])
def test_an_unusable_cache_dir_is_named(bad):
    from vllm_eval.utils.errors import UsageError

    with pytest.raises(UsageError, match="cache-dir"):
        OutputCache(bad)
