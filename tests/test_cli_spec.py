"""Options reach a backend by what it accepts: its constructor's signature, or a declared capability.

No model loads here: the spec is resolved from the classes in the backend table.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from vllm_eval.api.spec import capability, resolve_spec
from vllm_eval.models.backends import BACKENDS
from vllm_eval.models.encoder.base import EncoderBase
from vllm_eval.utils.errors import UsageError


class _LocalEncoder(EncoderBase):
    """A reference-style backend with its own few options (never built here)."""

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype"})

    def __init__(self, model=None, *, prompts=None, device=None, dtype="float32", show_progress_bar=True):
        raise AssertionError("not built in these tests")


def test_capabilities_come_from_the_classes():
    assert [capability("encoder", b) for b in ("vllm", "st", "remote")] == ["engine", "reference", "remote"]
    assert capability("token_embedder", "hf") == "reference"


def test_signature_options_pass_and_are_refused_by_name():
    spec = resolve_spec("encoder", "st", {"prompts": {"query": "q: "}, "device": "cpu", "dimensions": None}, {})
    assert spec.options == {"prompts": {"query": "q: "}, "device": "cpu"} and spec.capability == "reference"
    with pytest.raises(UsageError, match=r"--pretokenize needs --backend vllm, not st"):
        resolve_spec("encoder", "st", {"pretokenize": True}, {})
    with pytest.raises(UsageError, match=r"--io-processor-plugin is not an option of a reranker \(no backend"):
        resolve_spec("reranker", "st", {"io_processor_plugin": "x"}, {})
    with pytest.raises(UsageError, match=r"--image-position needs --backend vllm or remote, not hf"):
        resolve_spec("generator", "hf", {"image_position": "after"}, {})


def test_capability_options_follow_the_capability():
    with pytest.raises(UsageError, match=r"--device is for a reference backend \(st, hf: a torch device\), not vllm"):
        resolve_spec("encoder", "vllm", {"device": "cpu"}, {})  # VllmEncoder's own device= is mteb's, unused
    with pytest.raises(UsageError, match="need --backend vllm"):
        resolve_spec("classifier", "hf", {"data_parallel_size": 2}, {})
    with pytest.raises(UsageError, match=r"--api is for --backend remote \(a served model\), not vllm"):
        resolve_spec("reranker", "vllm", {"api": "rerank"}, {})
    with pytest.raises(UsageError, match="--backend remote needs at least one --endpoint URL"):
        resolve_spec("encoder", "remote", {}, {})
    spec = resolve_spec("encoder", "remote", {"endpoint": ["http://127.0.0.1:9"], "max_concurrency": 3}, {})
    assert spec.http.endpoints == ("http://127.0.0.1:9",) and spec.http.max_concurrency == 3 and not spec.options


def test_engine_options_reach_engines_all_and_references_their_own():
    engine = {"dtype": "float32", "max_num_seqs": 8}
    assert resolve_spec("encoder", "vllm", {}, engine).engine is engine
    with pytest.raises(UsageError, match="--backend st does not take vLLM engine options: --max-num-seqs"):
        resolve_spec("encoder", "st", {}, engine)
    assert resolve_spec("encoder", "st", {}, {"dtype": "float16"}).engine == {"dtype": "float16"}
    with pytest.raises(UsageError, match="--backend remote does not take vLLM engine options: --dtype"):
        resolve_spec("encoder", "remote", {"endpoint": ["http://127.0.0.1:9"]}, {"dtype": "float16"})


def test_a_backend_added_to_the_table_gets_options_by_its_signature(monkeypatch):
    monkeypatch.setitem(BACKENDS, ("encoder", "mine"), f"{__name__}:_LocalEncoder")
    spec = resolve_spec("encoder", "mine", {"prompts": {"query": "q: "}, "device": "cpu"}, {"dtype": "float16"})
    assert spec.options == {"prompts": {"query": "q: "}, "device": "cpu"} and spec.engine == {"dtype": "float16"}
    with pytest.raises(UsageError, match=r"--preset needs --backend vllm or st or hf or remote, not mine"):
        resolve_spec("encoder", "mine", {"preset": "e5"}, {})


def test_listed_engine_flags_are_engine_args_names():
    """The listed flags skip the name check (which imports vLLM): each must be an EngineArgs field."""
    from vllm_eval.cli.options import ENGINE_BOOLS, ENGINE_FLAGS
    from vllm_eval.engine.args import LISTED_ENGINE_ARGS, OWN_ENGINE_OPTIONS, engine_arg_names

    listed = {entry[0] for entry in ENGINE_FLAGS} | {entry[0] for entry in ENGINE_BOOLS}
    assert listed == LISTED_ENGINE_ARGS  # the library skips the same names' check
    assert listed - OWN_ENGINE_OPTIONS <= engine_arg_names()
    assert not OWN_ENGINE_OPTIONS & engine_arg_names()  # a vLLM option of the same name would be shadowed
