"""Our speech normalisers against their sources' own code, on real text and on text hypothesis makes up.

Neither the Open ASR Leaderboard's normaliser nor OpenAI's Whisper package is installed with this project (the
leaderboard's is not a package), so the tests pin cases (tests/test_asr_normalizers.py) and this script compares
the whole behaviour where checkouts are at hand:

    git clone https://github.com/huggingface/open_asr_leaderboard /tmp/oal   # the commit asr_normalizers names
    git clone https://github.com/openai/whisper /tmp/whisper
    pip install kaldialign   # the leaderboard's normalizer package imports it
    .venv/bin/python scripts/asr_normalizer_check.py --leaderboard /tmp/oal --whisper /tmp/whisper [--examples N]

Real text: the offline suite's English prompts (`make speech-data`) and the packaged lm-eval data's strings
(`make lm-data`). Prints the counts compared and exits 1 on the first difference, naming the text.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_eval.tasks.asr_normalizers import normalizer_for
from vllm_eval.tasks.speech import speech_data_roots

WORDS = [
    "uh", "ah", "umm", "hmm", "it's", "john's", "won't", "b", "c", "a", "i", "5", "g", "wi-fi", "e-mail", "all right",
    "a.m.", "p m", "ok", "kay", "jon", "micheal", "colour", "archaeology", "flyer", "$", "20", "million", "dollars",
    "cents", "percent", "one", "oh", "two", "and a half", "...", ".", ",", "'", "(aside)", "[noise]", "mr.", "st.",
    "x-ray", "1,000", "3.5", "£", "€", "café", "naïve", "ß", "y'all", "gonna", "C3PO", "U.S.A.", "twenty", "first",
    "hundreds", "double", "point", "10 000", "¿Qué?", "één", "Straße",
]  # fmt: skip


def real_texts() -> list[str]:
    texts = []
    for root in speech_data_roots():
        for path in glob.glob(str(root / "usr/share/doc/asterisk-core-sounds-*/core-sounds-*.txt.gz")):
            with gzip.open(path, "rt", errors="replace") as f:
                texts += [line.split(":", 1)[1].strip() for line in f if ":" in line]
    for path in glob.glob(str(Path.home() / ".cache/vllm-eval/lm-data/**/*.jsonl"), recursive=True)[:40]:
        with open(path, encoding="utf-8") as f:
            for _, line in zip(range(400), f, strict=False):
                row = json.loads(line)
                texts += [v for v in row.values() if isinstance(v, str) and 3 < len(v) < 2000]
    return texts


def references(leaderboard: Path, whisper: Path) -> dict[tuple[str, str | None], object]:
    """(family, language) -> the source's own callable."""
    import types

    for name, folder in (("whisper", whisper / "whisper"), ("normalizer", leaderboard / "normalizer")):
        pkg = types.ModuleType(name)  # their __init__ import models (torch) and model lists we do not need
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg
    from normalizer import normalizer as lb  # noqa: E402

    pkg.EnglishTextNormalizer, pkg.BasicMultilingualTextNormalizer = (
        lb.EnglishTextNormalizer,
        lb.BasicMultilingualTextNormalizer,
    )
    from normalizer.data_utils import ml_normalizer
    from whisper.normalizers import BasicTextNormalizer, EnglishTextNormalizer

    refs: dict[tuple[str, str | None], object] = {("leaderboard", "en"): lb.EnglishTextNormalizer()}
    for lang in ("es", "nl", "de", "fr", "xx"):
        refs[("leaderboard", lang)] = lambda t, lang=lang: ml_normalizer(t, lang=lang)
    refs[("openai", "en")], refs[("basic", "en")] = EnglishTextNormalizer(), BasicTextNormalizer()
    return refs


def _generated(ours, ref, examples: int):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=4)), max_size=12), st.sampled_from(" \t"))
    def same(words: list[str], sep: str) -> None:
        text = sep.join(words)
        assert ours(text) == ref(text), (text, ours(text), ref(text))

    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--leaderboard", type=Path, required=True, help="a checkout of huggingface/open_asr_leaderboard"
    )
    parser.add_argument("--whisper", type=Path, required=True, help="a checkout of openai/whisper")
    parser.add_argument("--examples", type=int, default=20000, help="generated texts per normaliser")
    args = parser.parse_args()
    texts = real_texts()
    for (family, lang), ref in references(args.leaderboard, args.whisper).items():
        ours = normalizer_for(lang, family)[0]
        bad = next((t for t in texts if ours(t) != ref(t)), None)
        if bad is not None:
            print(f"{family}/{lang}: differs on {bad!r}: ours {ours(bad)!r}, source {ref(bad)!r}")
            return 1

        _generated(ours, ref, args.examples)()
        print(f"{family}/{lang}: equal on {len(texts)} real texts and {args.examples} generated ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
