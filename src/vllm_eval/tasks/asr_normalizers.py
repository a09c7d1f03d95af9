"""The text normalisers speech scores are computed on, each named with its source and version.

``--normalizer`` picks one family; the language of a recording picks its member:

* ``leaderboard`` (default): the Open ASR Leaderboard's, as its ``normalizer/normalizer.py`` (huggingface/
  open_asr_leaderboard, commit d1e99b2, 2026-06-22) scores: for English OpenAI's English normaliser with the
  leaderboard's changes (:class:`LeaderboardEnglishNormalizer`); for any other language its multilingual one
  (:class:`LeaderboardMultilingualNormalizer`).
* ``openai``: OpenAI's original normalisers of the Whisper paper (Radford et al. 2022, appendix C), as transformers
  ships them (``transformers.models.whisper.english_normalizer``) with OpenAI's ``english.json`` spelling table:
  ``EnglishTextNormalizer`` for English, ``BasicTextNormalizer`` otherwise.
* ``basic``: OpenAI's ``BasicTextNormalizer`` for every language (lower case, no brackets, no symbols).

The leaderboard's changes to OpenAI's English normaliser, applied here on transformers' own parts (its number,
spelling and symbol code):

1. fillers: ``ah``, ``aha``, ``eh``, ``hm``, ``huh``, ``umm`` ... are removed as OpenAI's ``hmm``/``uh``/``um`` are;
2. ``'s`` becomes `` is`` only after ``it``, ``he``, ``she``, ``what``, ``that`` ... (``john's`` stays);
3. spaced compounds are joined after punctuation is removed (``wi-fi`` -> ``wifi``, ``e-mail`` -> ``email``,
   ``all right`` -> ``alright``, ``a m`` -> ``am``);
4. its spelling table (OpenAI's, with ``ok`` -> ``okay``, ``flyer`` -> ``flier`` ... and a few American spellings
   turned the other way), then one spelling for name variants (``jon`` -> ``john``, ``micheal`` -> ``michael``);
5. runs of single letters or digits are joined into one word (``b b c`` -> ``bbc``, ``5 g`` -> ``5g``); a run
   holding ``a`` or ``i`` must be three long (``a b c`` -> ``abc``, ``a big cat`` stays).

The tables are :mod:`vllm_eval.tasks.asr_leaderboard_tables`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from importlib.resources import files

from ..utils.errors import UsageError
from ..utils.telemetry import package_versions
from . import asr_leaderboard_tables as tables

__all__ = [
    "DEFAULT_NORMALIZER",
    "NORMALIZERS",
    "LeaderboardEnglishNormalizer",
    "LeaderboardMultilingualNormalizer",
    "check_normalizer",
    "normalizer_for",
]

#: ``--normalizer``'s choices, the default first
NORMALIZERS = ("leaderboard", "openai", "basic")
DEFAULT_NORMALIZER = "leaderboard"
#: the leaderboard's ``normalizer/normalizer.py`` these rules follow
LEADERBOARD_SOURCE = "huggingface/open_asr_leaderboard@d1e99b2 normalizer/normalizer.py"
#: names once written for the normalisers, and what replaced them
_RENAMED = {
    "whisper": "openai",
    "whisper-normalizer": "openai",
    "english": "openai",
    "open_asr_leaderboard": "leaderboard",
    "open-asr-leaderboard": "leaderboard",
}


def check_normalizer(name: str) -> str:
    """``name`` if it is one of :data:`NORMALIZERS`.

    Raises:
        UsageError: any other name, in one line (an older name gets what replaced it).
    """
    if name in NORMALIZERS:
        return name
    if name in _RENAMED:
        raise UsageError(
            f"--normalizer {name}: that normaliser is now called {_RENAMED[name]!r} (choices: {', '.join(NORMALIZERS)})"
        )
    raise UsageError(f"--normalizer must be one of {', '.join(NORMALIZERS)}, got {name!r}")


def _version(package: str) -> str:
    return package_versions((package,)).get(package, "unknown")


@cache
def openai_spellings() -> dict[str, str]:
    """OpenAI's British-to-American spelling table (``whisper/normalizers/english.json``, 1,739 words), as the
    ``whisper-normalizer`` package ships it byte for byte."""
    return json.loads((files("whisper_normalizer") / "normalizers" / "english.json").read_text(encoding="utf-8"))


def _join_single_characters(text: str) -> str:
    """Rule 5: each run of one-character alphanumeric words becomes one word when it is 2 long, or 3 long if it
    holds ``a`` or ``i`` (common words on their own)."""
    out: list[str] = []
    run: list[str] = []
    for word in [*text.split(), ""]:
        if len(word) == 1 and word.isalnum():
            run.append(word)
            continue
        if run:
            needed = 3 if any(c in ("a", "i") for c in run) else 2
            out.extend(["".join(run)] if len(run) >= needed else run)
            run = []
        if word:
            out.append(word)
    return " ".join(out)


class LeaderboardEnglishNormalizer:
    """The Open ASR Leaderboard's English normaliser (:data:`LEADERBOARD_SOURCE`): OpenAI's
    ``EnglishTextNormalizer`` (transformers' copy) with the module's five changes.

    Call with a text (``str``); returns the normalised text, words separated by single spaces (a space may lead
    or trail, as OpenAI's does).
    """

    def __init__(self) -> None:
        from transformers.models.whisper import english_normalizer as openai

        base = openai.EnglishTextNormalizer(openai_spellings())
        # rule 2: the general "'s" -> " is" gives way to the leaderboard's, at the same place in the order
        self.replacers = [
            tables.IS_CONTRACTION if pattern == r"'s\b" else (pattern, replacement)
            for pattern, replacement in base.replacers.items()
        ]
        spellings = {**openai_spellings(), **{k: v for k, v in tables.SPELLING_CHANGES.items() if v is not None}}
        for word in [k for k, v in tables.SPELLING_CHANGES.items() if v is None]:
            del spellings[word]
        self.spellings = spellings
        self.numbers = openai.EnglishNumberNormalizer()
        self.remove_symbols = openai.remove_symbols_and_diacritics

    def __call__(self, text: str) -> str:
        s = text.lower()
        s = re.sub(r"[<\[][^>\]]*[>\]]", "", s)  # words between brackets
        s = re.sub(r"\(([^)]+?)\)", "", s)  # and between parentheses
        s = re.sub(tables.FILLERS, "", s)
        s = re.sub(r"\s+'", "'", s)
        for pattern, replacement in self.replacers:
            s = re.sub(pattern, replacement, s)
        s = re.sub(r"(\d),(\d)", r"\1\2", s)
        s = re.sub(r"\.([^0-9]|$)", r" \1", s)
        s = self.remove_symbols(s, keep=".%$¢€£")  # the number normaliser reads these
        for pattern, replacement in tables.COMPOUNDS.items():
            s = re.sub(pattern, replacement, s)
        s = self.numbers(s)
        s = " ".join(self.spellings.get(w, w) for w in s.split())
        s = " ".join(tables.NAMES.get(w, w) for w in s.split())  # a spelling may hold a space
        s = _join_single_characters(s)
        s = re.sub(r"[.$¢€£]([^0-9])", r" \1", s)  # symbols no number took
        s = re.sub(r"([^0-9])%", r"\1 ", s)
        return re.sub(r"\s+", " ", s)


class LeaderboardMultilingualNormalizer:
    """The Open ASR Leaderboard's normaliser for languages other than English (its ``MultilingualNormalizer`` with
    ``remove_diacritics=False``, as its scoring calls it): OpenAI's ``BasicTextNormalizer``, then every character
    that is neither a word character nor a space removed, then (with ``language``) each run of digits spelled out
    by ``num2words`` in that language (``10 000`` read as one number; a language num2words lacks keeps its digits).

    Args:
        language: ISO 639-1 code (``es``, ``de`` ...), or None for no number spelling.
    """

    def __init__(self, language: str | None) -> None:
        from transformers.models.whisper.english_normalizer import BasicTextNormalizer

        self.language = language
        self.basic = BasicTextNormalizer(remove_diacritics=False)

    def _spell(self, match: re.Match[str]) -> str:
        import num2words

        try:
            return num2words.num2words(int(match.group()), lang=self.language)
        except Exception:  # noqa: BLE001 - the leaderboard keeps the digits for any failure (an unknown language)
            return match.group()

    def __call__(self, text: str) -> str:
        s = re.sub(r"[^\w\s]", "", self.basic(text))
        s = re.sub(r"\s+", " ", s).strip()
        if self.language is None:
            return s
        s = re.sub(r"(\d)\s+(\d{3})\b", r"\1\2", s)
        return re.sub(r"\d+", self._spell, s)


def normalizer_for(language: str | None, name: str = DEFAULT_NORMALIZER) -> tuple[Callable[[str], str], str]:
    """(normalise(text) -> text, its name with source and version) for a recording in ``language`` (ISO 639-1,
    or None: unknown) under the family ``name`` (:data:`NORMALIZERS`).

    Raises:
        UsageError: an unknown ``name``.
    """
    check_normalizer(name)
    transformers = f"transformers {_version('transformers')}"
    if name == "leaderboard":
        if language == "en":
            return LeaderboardEnglishNormalizer(), f"{LEADERBOARD_SOURCE} EnglishTextNormalizer (on {transformers})"
        label = f"{LEADERBOARD_SOURCE} MultilingualNormalizer(lang={language})"
        return LeaderboardMultilingualNormalizer(language), f"{label} (num2words {_version('num2words')})"
    if name == "openai" and language == "en":
        from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

        table = f"OpenAI's english.json, whisper-normalizer {_version('whisper-normalizer')}"
        return EnglishTextNormalizer(openai_spellings()), f"{transformers} EnglishTextNormalizer ({table})"
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer

    return BasicTextNormalizer(), f"{transformers} BasicTextNormalizer"
