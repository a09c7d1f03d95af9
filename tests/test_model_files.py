"""A model folder's own files (``config.json``, sentence-transformers' ``modules.json`` and module configs) read by
the checked readers: whatever bytes a damaged folder holds, one ``UsageError`` naming the file, or the parsed
object; and a model argument of the wrong type refused in one line by every library function."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vllm_eval
from vllm_eval.utils.errors import UsageError
from vllm_eval.utils.modelinfo import embedding_dim, max_tokens, model_json, model_modules

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_in_a_model_config_are_an_object_or_one_line_naming_the_file(tmp_path, raw):
    (tmp_path / "config.json").write_bytes(raw)
    (tmp_path / "modules.json").write_bytes(raw)
    for read in (lambda: model_json(tmp_path / "config.json"), lambda: model_modules(tmp_path)):
        try:
            value = read()
        except UsageError as exc:
            text = str(exc)
            assert "\n" not in text and str(tmp_path) in text, text
            continue
        assert isinstance(value, dict | list)
    try:  # what model metadata reads from the folder: a value, or the same one-line error
        embedding_dim(tmp_path, {})
        max_tokens(tmp_path, {})
    except UsageError as exc:
        assert "\n" not in str(exc)
    from vllm_eval.models.encoder.vllm import _st_normalizes
    from vllm_eval.models.sparse_encoder.base import sparse_flavour
    from vllm_eval.utils.modelinfo import ModelRef

    for read in (lambda: _st_normalizes(str(tmp_path)), lambda: sparse_flavour(ModelRef(path=str(tmp_path)))):
        try:  # the backends' own reads of modules.json: a value or the same one-line error
            assert read() in (True, False, None, "splade")
        except UsageError as exc:
            assert "\n" not in str(exc) and str(tmp_path) in str(exc)


def test_a_missing_file_is_empty_and_a_list_of_modules_is_checked(tmp_path):
    assert model_json(tmp_path / "config.json") == {} and model_modules(tmp_path) == []
    (tmp_path / "modules.json").write_text('[{"idx": 0, "path": 3, "type": "x"}]')
    with pytest.raises(UsageError, match=r"modules.json: module 0: field 'path' must be"):
        model_modules(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"config.json: a model's configuration must be a JSON object, got list"):
        model_json(tmp_path / "config.json")


@pytest.mark.parametrize(
    "call",
    [
        lambda: vllm_eval.evaluate(model=123),
        lambda: vllm_eval.generate(model=["a", 2], tasks="PangLeePolarity"),  # a list is a sweep: each model checked
        lambda: vllm_eval.classify(model=1.5),
        lambda: vllm_eval.rerank(model={"m": 1}),
        lambda: vllm_eval.bench(model=7),
    ],
)
def test_a_model_of_the_wrong_type_is_one_line(call):
    with pytest.raises(UsageError, match=r"^model must be a model directory or a hub id \(a str or a path\), got "):
        call()
