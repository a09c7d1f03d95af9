"""The model registry: one registry for every kind of model."""

from __future__ import annotations

import pytest

from vllm_eval.models.presets import ModelPreset, ScoreTemplate, find_preset, get_preset, list_presets, register_preset


def test_kinds_and_lookup():
    kinds = {p.kind for p in list_presets()}
    assert {"embedding", "reranker", "language", "multimodal"} <= kinds
    assert find_preset("Qwen/Qwen3-Reranker-4B", "reranker").name == "qwen3-reranker"
    assert find_preset("/models/qwen3-reranker-8b", "reranker").name == "qwen3-reranker"
    assert find_preset("Qwen/Qwen3-Reranker-4B", "language") is None
    assert find_preset("Qwen/Qwen2.5-VL-7B-Instruct").kind == "multimodal"
    qr = get_preset("qwen3-reranker")
    assert qr.engine_kwargs["hf_overrides"]["classifier_from_token"] == ["no", "yes"]
    assert qr.engine_kwargs["hf_overrides"]["architectures"] == ["Qwen3ForSequenceClassification"]


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):

        @register_preset("qwen3-reranker")
        def again() -> ModelPreset:
            return ModelPreset(name="qwen3-reranker", kind="reranker", model="x")

    with pytest.raises(KeyError, match="registered:"):
        get_preset("no-such-preset")


def test_score_template_validation():
    t = ScoreTemplate(
        query_template="<q>{instruction}|{query}", document_template="<d>{document}</d>", default_instruction="find"
    )
    assert t.query("a") == "<q>find|a" and t.query("a", "other") == "<q>other|a"
    assert t.document_parts() == ("<d>", "</d>")
    with pytest.raises(ValueError, match="query"):
        ScoreTemplate(query_template="no placeholder")
    with pytest.raises(ValueError, match="default_instruction"):
        ScoreTemplate(query_template="{instruction}{query}")


def test_preset_engine_options_merge_with_the_users():
    from vllm_eval.engine.args import merge_engine_kwargs

    preset = get_preset("qwen3-reranker").engine_kwargs
    merged = merge_engine_kwargs(preset, {"hf_overrides": {"head_dtype": "float32"}, "dtype": "bfloat16"})
    assert merged["hf_overrides"]["architectures"] == ["Qwen3ForSequenceClassification"]
    assert merged["hf_overrides"]["head_dtype"] == "float32" and merged["dtype"] == "bfloat16"
    assert "head_dtype" not in preset["hf_overrides"]  # the preset itself is untouched


def test_presets_resolve_per_kind_and_describe_what_they_set():
    from vllm_eval.models.presets import resolve_preset
    from vllm_eval.utils.errors import UnknownNameError, UsageError

    assert resolve_preset("intfloat/e5-large-v2", "encoder").name == "e5"
    assert resolve_preset("/models/Qwen3-Embedding-0.6B", "encoder").name == "qwen3-embedding"
    assert resolve_preset("/models/Qwen3-Embedding-0.6B", "reranker") is None
    assert resolve_preset("anything", "encoder", "e5").prompts == {"query": "query: ", "document": "passage: "}
    with pytest.raises(UsageError, match="is for rerankers, not encoders"):
        resolve_preset("x", "encoder", "qwen3-reranker")
    with pytest.raises(UnknownNameError, match=r"did you mean 'e5'"):
        resolve_preset("x", "encoder", "e6")
    assert get_preset("e5").settings() == {"prompts": {"query": "query: ", "document": "passage: "}}
    assert set(get_preset("qwen3-reranker").settings()) == {"engine_kwargs", "score_template"}
