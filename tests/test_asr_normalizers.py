"""The speech normalisers, case by case.

Each expected text is what the Open ASR Leaderboard's own ``normalizer/normalizer.py`` (huggingface/
open_asr_leaderboard at d1e99b2) returns for the input: its rules, not ours. The leaderboard's code is not a
package, so it cannot run here; ``scripts/asr_normalizer_check.py`` runs it against ours on real and generated
text where a checkout of it is at hand.
"""

from __future__ import annotations

import pytest

from vllm_eval.tasks.asr_normalizers import (
    LeaderboardEnglishNormalizer,
    LeaderboardMultilingualNormalizer,
    check_normalizer,
    normalizer_for,
)
from vllm_eval.utils.errors import UsageError

# (rule, input, the leaderboard's output, OpenAI's original output)
ENGLISH = [
    ("ellipsis inside", "Wait... what?", "wait what", "wait what"),
    ("ellipsis at the end: both leave one '.'", "And then...", "and then .", "and then ."),
    ("acronym with periods", "The B.B.C. said it.", "the bbc said it", "the b b c said it"),
    ("acronym holding 'a': three letters", "A.B.C.", "abc", "a b c"),
    ("possessive acronym", "the U.S.A.'s flag", "the usas flag", "the u s a is flag"),
    ("a lone 'a' stays", "a big cat", "a big cat", "a big cat"),
    ("digit and letter", "the 5 G network", "the 5g network", "the 5 g network"),
    ("letters and digits", "C3PO and R2 D2", "c3 po and r2d2", "c 3 po and r 2 d 2"),
    ("fillers", "Uh, ah, I think, hmm, huh, that's it, umm.", "i think that is it", "ah i think huh that is it umm"),
    (
        "'s after a name is not 'is'",
        "John's here and it's fine",
        "john s here and it is fine",
        "john is here and it is fine",
    ),
    ("title and possessive", "Mr. Smith's car", "mister smith s car", "mister smith is car"),
    (
        "contractions",
        "I won't go, we're gonna try, y'all wanna come?",
        "i will not go we are going to try you all want to come",
        "i will not go we are going to try you all want to come",
    ),
    ("numbers", "ten of clubs", "10 of clubs", "10 of clubs"),
    ("digits spoken one by one", "two nine three four zero", "29340", "29340"),
    ("currency and multiplier", "$20 million", "$20000000", "$20000000"),
    ("dollars and cents", "It costs twenty dollars and five cents", "it costs $20.05", "it costs $20.05"),
    ("percent", "five percent", "5%", "5%"),
    ("British spellings", "Colour and flavour", "color and flavor", "color and flavor"),
    ("okay", "ok, kay", "okay okay", "ok kay"),
    ("the leaderboard's spelling changes", "a flyer", "a flier", "a flyer"),
    ("OpenAI's table has a stray tag", "archaeology", "archeology", "archeology</span>"),
    ("names", "Jon and Micheal met Stephen", "john and michael met steven", "jon and micheal met stephen"),
    ("hyphenated compounds", "the wi-fi e-mail", "the wifi email", "the wi fi e mail"),
    ("spaced compounds", "all right, alright", "alright alright", "all right alright"),
    ("times", "at 7 a.m. or 5 p m", "at 7 am or 5 pm", "at 7 a m or 5 p m"),
    ("brackets", "[noise] hello (aside) there", "hello there", "hello there"),
]


@pytest.mark.parametrize("rule, text, leaderboard, openai", ENGLISH, ids=[c[0] for c in ENGLISH])
def test_english_normalisers_follow_their_sources(rule, text, leaderboard, openai):
    ours, name = normalizer_for("en")
    assert ours(text) == leaderboard, rule
    assert name.startswith("huggingface/open_asr_leaderboard@d1e99b2 ") and "transformers " in name
    original, name = normalizer_for("en", "openai")
    assert original(text) == openai, rule
    assert "EnglishTextNormalizer" in name and "whisper-normalizer " in name


def test_multilingual_and_basic_normalisers():
    # the leaderboard's: punctuation gone, accents kept, digits spelled out in the language ("10 000" is one number)
    assert LeaderboardMultilingualNormalizer("es")("¿Qué tal? Tengo 10 000 euros.") == "qué tal tengo diez mil euros"
    assert LeaderboardMultilingualNormalizer("nl")("Één, twee: 3!") == "één twee drie"
    assert LeaderboardMultilingualNormalizer("xx")("Item 7.") == "item 7"  # a language num2words lacks keeps digits
    assert LeaderboardMultilingualNormalizer(None)("Item 7.") == "item 7"
    _, name = normalizer_for("es")
    assert "MultilingualNormalizer(lang=es)" in name and "num2words " in name
    # OpenAI's basic one, for every language under "basic" and for other languages under "openai"
    for family, language in (("basic", "en"), ("basic", "es"), ("openai", "es")):
        basic, name = normalizer_for(language, family)
        assert basic("Ten of clubs, ¿qué?") == "ten of clubs qué ", (family, language)
        assert name.endswith("BasicTextNormalizer")


def test_normalizer_names_are_checked_in_one_line():
    assert check_normalizer("openai") == "openai"
    with pytest.raises(UsageError, match="--normalizer whisper: that normaliser is now called 'openai'"):
        check_normalizer("whisper")
    with pytest.raises(UsageError, match=r"must be one of leaderboard, openai, basic, got 'nfkc'"):
        normalizer_for("en", "nfkc")


def test_the_leaderboard_normaliser_is_idempotent_on_real_sentences():
    """Normalising twice changes nothing on the offline suite's kind of text (references are normalised once, but a
    user may feed normalised text back)."""
    ours = LeaderboardEnglishNormalizer()
    for text in ("Please enter your number, followed by the pound key.", "You have 2 new messages.", "ten of clubs"):
        once = ours(text)
        assert ours(once) == once, text
