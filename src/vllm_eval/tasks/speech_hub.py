"""Speech tasks by name (:func:`get_speech_task`): the offline suite's, and sets from the Hugging Face hub:
LibriSpeech, the Open ASR Leaderboard's English sets (ESB), FLEURS (transcription per language, and speech
translation into English), Common Voice.

Each is ``datasets.load_dataset(path, config, split=split)`` with its audio column cast to ``Audio(decode=False)``,
so the file bytes come back whatever the ``datasets`` version (4.x decodes with torchcodec otherwise, and gives other
samples than 3.x) and are decoded here as every recording is (:func:`vllm_eval.tasks.speech.decode_audio`). The
dataset's availability is checked before any model loads: offline and not cached, the task fails at once naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..utils.errors import UnknownNameError
from .speech import SPEECH_TASKS, SpeechSample, SpeechTask


@dataclass(frozen=True)
class HubSpeech:
    """Where a hub speech set lives and how its rows read: ``path``, ``config``, ``split``, the reference text's
    column, the speech's language (ISO 639-1), the task, and for translation the English config whose rows (joined
    on ``id``) hold the references."""

    path: str
    config: str | None
    split: str
    text: str
    language: str | None
    task: str = "transcribe"
    english_config: str | None = None
    description: str = ""


_ESB = "hf-audio/esb-datasets-test-only-sorted"
#: FLEURS configs of the languages named here (FLEURS has 102; any ``FLEURS.<config>`` is taken too).
_FLEURS = {"en": "en_us", "de": "de_de", "es": "es_419", "fr": "fr_fr", "it": "it_it", "ja": "ja_jp", "ru": "ru_ru",
           "zh": "cmn_hans_cn", "pt": "pt_br", "nl": "nl_nl", "pl": "pl_pl", "hi": "hi_in", "ar": "ar_eg"}  # fmt: skip

HUB_SPEECH: dict[str, HubSpeech] = {
    "LibriSpeech.test-clean": HubSpeech("openslr/librispeech_asr", "clean", "test", "text", "en",
                                        description="LibriSpeech test-clean: read audiobooks, 2,620 utterances, 5.4 h"),
    "LibriSpeech.test-other": HubSpeech("openslr/librispeech_asr", "other", "test", "text", "en",
                                        description="LibriSpeech test-other: harder speakers, 2,939 utterances"),
    **{
        f"ESB.{name}": HubSpeech(_ESB, config, split, "text", "en",
                                 description=f"Open ASR Leaderboard English set {config} ({split})")
        for name, config, split in (
            ("ami", "ami", "test"), ("earnings22", "earnings22", "test"), ("gigaspeech", "gigaspeech", "test"),
            ("librispeech-clean", "librispeech", "test.clean"), ("librispeech-other", "librispeech", "test.other"),
            ("spgispeech", "spgispeech", "test"), ("tedlium", "tedlium", "test"), ("voxpopuli", "voxpopuli", "test"),
        )
    },
    **{
        f"FLEURS.{lang}": HubSpeech("google/fleurs", config, "test", "raw_transcription", lang,
                                    description=f"FLEURS {config}: read Wikipedia sentences")
        for lang, config in _FLEURS.items()
    },
    **{
        f"FLEURS.{lang}-en": HubSpeech("google/fleurs", config, "test", "raw_transcription", lang, "translate",
                                       "en_us", f"FLEURS {config} speech translated into English (BLEU, chrF)")
        for lang, config in _FLEURS.items() if lang != "en"
    },
    **{
        f"CommonVoice.{lang}": HubSpeech("mozilla-foundation/common_voice_17_0", lang, "test", "sentence", lang,
                                         description=f"Common Voice 17.0 {lang} (gated: accept its terms on the hub)")
        for lang in ("en", "de", "es", "fr", "it", "ru")
    },
}  # fmt: skip


def hub_speech_source(name: str) -> HubSpeech | None:
    """The hub set called ``name`` (case-insensitive), None if there is none."""
    return next((s for key, s in HUB_SPEECH.items() if key.lower() == name.lower()), None)


def _rows(source: HubSpeech, config: str | None) -> Any:
    import datasets

    ds = datasets.load_dataset(source.path, config, split=source.split)
    return ds.cast_column("audio", datasets.Audio(decode=False)) if "audio" in ds.column_names else ds


def load_hub_speech(name: str) -> SpeechTask:
    """The hub speech task ``name`` (a key of :data:`HUB_SPEECH`): its recordings as file bytes (or paths), their
    references, the language.

    Raises:
        DataUnavailableError: the hub is offline and the dataset is not cached (checked before anything loads).
        KeyError: not a hub speech task.
    """
    from ..utils.hub import require_dataset

    source = hub_speech_source(name)
    if source is None:
        raise KeyError(name)
    key = next(k for k in HUB_SPEECH if k.lower() == name.lower())
    require_dataset(source.path, key, "use the offline suite (AsteriskPrompts.<lang>) or --data FILE")
    rows = _rows(source, source.config)
    english = None
    if source.english_config:  # FLEURS's sentences share their id across languages
        english = {r["id"]: r[source.text] for r in _rows(source, source.english_config).remove_columns("audio")}
    samples = []
    for i, row in enumerate(rows):
        rid = str(row.get("id", i))
        text = english.get(row["id"]) if english is not None else row[source.text]
        if not text:
            continue
        audio = row["audio"]
        samples.append(SpeechSample(rid, audio.get("bytes") or audio["path"], text, source.language))
    return SpeechTask(key, source.task, source.language, samples, f"{source.path} {source.config} {source.split}",
                      source.description)  # fmt: skip


def get_speech_task(name: str) -> SpeechTask:
    """The speech task called ``name`` (case-insensitive): the offline suite's, or a hub set's
    (:mod:`vllm_eval.tasks.speech_hub`).

    Raises:
        UnknownNameError: an unknown name (the known ones listed).
        DataUnavailableError: its data is not here (a hub set offline and not cached: before anything loads).
    """
    for key, load in SPEECH_TASKS.items():
        if key.lower() == name.lower():
            return load()
    if hub_speech_source(name) is not None:
        return load_hub_speech(name)
    raise UnknownNameError(f"unknown speech task {name!r}; known: {', '.join([*SPEECH_TASKS, *HUB_SPEECH])}")
