"""Speech-to-text tasks: recordings with reference texts, decoded to 16 kHz mono, transcribed by any transcriber
backend and scored as the ASR field scores (:mod:`vllm_eval.tasks.speech_scores`).

Data is a :class:`SpeechTask`:

* the offline suite ``AsteriskPrompts.<lang>`` (en, es, fr, it, ru): Asterisk's core sound prompts, one
  professional speaker per language, 8 kHz 16-bit WAV with their official texts, from Debian's
  ``asterisk-core-sounds-<lang>-wav`` and ``asterisk-core-sounds-<lang>`` packages (CC-BY-SA-3.0: en, es, fr;
  CC-BY-3.0: it, ru); ``AsteriskLongForm.<lang>``: the same prompts joined into clips of a minute or more (long
  audio, cut by the model's splitter). ``make speech-data`` unpacks them into ``~/.cache/vllm-eval/speech``
  (``apt-get download``, no root needed); an ``apt-get install`` of the same packages works too. Prompts of at least
  :data:`MIN_WORDS` words are kept; bracketed non-speech (``[beep]``) and texts with a ``?`` inside a word (three
  Italian lines lost their accents so) are left out;
* your own file (``--data``): JSONL, CSV or Parquet rows with ``audio`` (a path relative to the file, or the
  bytes) and ``text``, optionally ``language`` and ``id`` (schema ``transcription`` of
  :mod:`vllm_eval.tasks.owndata`), or a folder of audio files each with its transcript in a ``.txt`` of the same
  stem.

Audio is decoded with soundfile and resampled with soxr (its default high quality), the same samples whatever the
``datasets`` version, on threads while the model is loaded or runs.
"""

from __future__ import annotations

import gzip
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.speech import SAMPLE_RATE
from ..models.ranked import worker_threads
from ..utils.errors import DataUnavailableError, UsageError

#: Audio file extensions a folder of your own is read for (what libsndfile decodes).
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".aiff", ".aif")
#: Prompts shorter than this many words are left out of the offline suite (WER on one or two words is noise).
MIN_WORDS = 4
#: The offline suite's languages -> the voice folder of Asterisk's sounds.
ASTERISK_VOICES = {
    "en": "en_US_f_Allison",
    "es": "es_MX_f_Allison",
    "fr": "fr_CA_f_June",
    "it": "it_IT_m_Carlo",
    "ru": "ru_RU_f_IvrvoiceRU",
}
#: Long-form clips: at least this many seconds each, the prompts joined with this much silence between them.
LONG_FORM_S = 60.0
LONG_FORM_GAP_S = 0.5
_LICENCES = {"en": "CC-BY-SA-3.0", "es": "CC-BY-SA-3.0", "fr": "CC-BY-SA-3.0", "it": "CC-BY-3.0", "ru": "CC-BY-3.0"}


@dataclass
class SpeechSample:
    """One recording: ``id``, ``audio`` (a file path, or the file's bytes), its reference ``text``, its spoken
    ``language`` (ISO 639-1, or None: unknown), and ``raw`` for headerless PCM."""

    id: str
    audio: str | bytes
    text: str
    language: str | None = None
    #: headerless PCM's (sample rate in Hz, channels, soundfile subtype); None: the file's header says
    raw: tuple[int, int, str] | None = None


@dataclass
class SpeechTask:
    """Recordings with references, run as one task.

    Attributes:
        name: what ``--tasks`` takes.
        task: ``transcribe``, or ``translate`` (the references are English translations).
        language: the speech's language where the task has one (ISO 639-1), else None.
        samples: the recordings.
        source: where the data comes from (a package, a file).
        description: one line.
    """

    name: str
    task: str
    language: str | None
    samples: list[SpeechSample] = field(default_factory=list)
    source: str = ""
    description: str = ""
    #: (limit, future of :func:`decode_all` of the first ``limit`` samples) once :func:`start_decoding` ran.
    decoding: Any = field(default=None, repr=False, compare=False)


def speech_data_roots() -> list[Path]:
    """Where the offline suite's Debian packages may be unpacked, in order: ``$VLLM_EVAL_SPEECH_DIR``,
    ``~/.cache/vllm-eval/speech`` (``make speech-data``), ``/`` (the packages installed)."""
    roots = [os.environ.get("VLLM_EVAL_SPEECH_DIR"), str(Path.home() / ".cache" / "vllm-eval" / "speech"), "/"]
    return [Path(r) for r in roots if r]


def _asterisk_files(language: str) -> tuple[Path, Path]:
    """(the voice's sound folder, its gzipped text file) of the first root that has both.

    Raises:
        DataUnavailableError: none has them (the command that fetches them named).
    """
    voice = ASTERISK_VOICES[language]
    for root in speech_data_roots():
        sounds = root / "usr/share/asterisk/sounds" / voice
        texts = root / f"usr/share/doc/asterisk-core-sounds-{language}/core-sounds-{language}.txt.gz"
        if sounds.is_dir() and texts.is_file():
            return sounds, texts
    raise DataUnavailableError(
        f"AsteriskPrompts.{language}: Debian's asterisk-core-sounds-{language}-wav and asterisk-core-sounds-{language} "
        f"are not unpacked here: run `make speech-data` (or set VLLM_EVAL_SPEECH_DIR to where they are unpacked)"
    )


_INNER_QUESTION = re.compile(r"\w\?\w")


def parse_prompt_texts(text: str, where: str = "texts") -> list[tuple[str, str]]:
    """Asterisk's ``core-sounds-<lang>.txt``: ``name: text`` per line (``name`` may hold a subfolder, as
    ``digits/1``), ``;`` comments and blank lines skipped. Returns (name, text) pairs in file order, the first of
    a repeated name kept.

    Raises:
        UsageError: a line that is neither a comment nor ``name: text`` (file and line named).
    """
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        name, sep, value = line.partition(":")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            raise UsageError(f"{where}, line {number}: expected 'name: text', got {line!r:.80}")
        out.setdefault(name, value.strip())
    return list(out.items())


def _keep(text: str) -> bool:
    return len(text.split()) >= MIN_WORDS and "[" not in text and "]" not in text and not _INNER_QUESTION.search(text)


def asterisk_task(language: str) -> SpeechTask:
    """The offline suite's task for ``language`` (a key of :data:`ASTERISK_VOICES`).

    Raises:
        DataUnavailableError: the packages are not unpacked here.
        UsageError: a damaged text file (line named).
    """
    from ..utils.files import decode

    sounds, texts = _asterisk_files(language)
    pairs = parse_prompt_texts(decode(texts, gzip.decompress(texts.read_bytes())), str(texts))
    samples = [
        SpeechSample(name, str(sounds / f"{name}.wav"), value, language)
        for name, value in sorted(pairs)
        if _keep(value) and (sounds / f"{name}.wav").is_file()
    ]
    return SpeechTask(
        f"AsteriskPrompts.{language}",
        "transcribe",
        language,
        samples,
        f"Debian asterisk-core-sounds-{language}-wav 1.6.1 ({_LICENCES[language]})",
        f"Asterisk's phone prompts ({ASTERISK_VOICES[language]}, 8 kHz), at least {MIN_WORDS} words each",
    )


def asterisk_long_task(language: str, seconds: float = LONG_FORM_S) -> SpeechTask:
    """Long-form clips of the offline suite: :func:`asterisk_task`'s prompts in order, joined with
    :data:`LONG_FORM_GAP_S` of silence into clips of at least ``seconds`` (the last one may be shorter), their texts
    joined with spaces. Each clip is WAV bytes (16-bit, the prompts' 8 kHz)."""
    import io

    import soundfile

    base = asterisk_task(language)
    silence = np.zeros(int(LONG_FORM_GAP_S * 8000), dtype=np.int16)
    clips, parts, texts = [], [], []
    for sample in base.samples:
        data, rate = soundfile.read(sample.audio, dtype="int16")
        if rate != 8000 or data.ndim != 1:  # the suite is 8 kHz mono; anything else stays out of the joins
            continue
        parts += [data, silence]
        texts.append(sample.text)
        if sum(len(p) for p in parts) >= seconds * 8000:
            clips.append((parts, texts))
            parts, texts = [], []
    if parts:
        clips.append((parts, texts))
    samples = []
    for i, (pieces, words) in enumerate(clips):
        buffer = io.BytesIO()
        soundfile.write(buffer, np.concatenate(pieces[:-1]), 8000, format="WAV", subtype="PCM_16")
        samples.append(SpeechSample(f"long-{i:03d}", buffer.getvalue(), " ".join(words), language))
    return SpeechTask(
        f"AsteriskLongForm.{language}",
        "transcribe",
        language,
        samples,
        base.source,
        f"the AsteriskPrompts.{language} prompts joined into clips of at least {seconds:g} s (long-form)",
    )


#: The offline suite: task name -> loader.
SPEECH_TASKS = {
    **{f"AsteriskPrompts.{lang}": (lambda lang=lang: asterisk_task(lang)) for lang in ASTERISK_VOICES},
    **{f"AsteriskLongForm.{lang}": (lambda lang=lang: asterisk_long_task(lang)) for lang in ASTERISK_VOICES},
}


def load_speech_file(path: str | Path, task: str = "transcribe") -> SpeechTask:
    """Your own recordings: a ``transcription`` data file (see the module doc), or a folder of audio files with a
    ``.txt`` transcript of the same stem each.

    Raises:
        DataUnavailableError: no such file or folder.
        UsageError: a bad row (file, line and field named), a missing audio file, a folder without audio or an
            audio file without its transcript.
    """
    from .owndata import image_path, read_rows

    path = Path(path)
    if path.is_dir():
        return _load_folder(path, task)
    from .tables import where

    rows = read_rows(path, "transcription")
    samples = []
    for i, row in enumerate(rows):
        audio = row["audio"] if isinstance(row["audio"], bytes) else str(image_path(path, i, row["audio"], "audio"))
        named = f"{where(path, i)}: field 'audio'" + ("" if isinstance(audio, bytes) else f" {row['audio']!r:.60}")
        raw = _raw_format(row, where(path, i))
        check_audio(audio, named, raw)
        samples.append(SpeechSample(str(row.get("id", i)), audio, row["text"], row.get("language"), raw))
    languages = {s.language for s in samples}
    return SpeechTask(path.stem, task, languages.pop() if len(languages) == 1 else None, samples, str(path))


def _load_folder(folder: Path, task: str) -> SpeechTask:
    from ..utils.files import read_text

    audios = sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    if not audios:
        raise UsageError(f"--data {str(folder)!r}: no audio files ({', '.join(AUDIO_SUFFIXES)}) in the folder")
    samples = []
    for audio in audios:
        transcript = audio.with_suffix(".txt")
        if not transcript.is_file():
            raise UsageError(f"--data {str(folder)!r}: {audio.name} has no transcript {transcript.name}")
        text = " ".join(read_text(transcript).split())
        if not text:
            raise UsageError(f"{transcript}: the transcript is empty")
        check_audio(str(audio), str(audio))
        samples.append(SpeechSample(audio.stem, str(audio), text))
    return SpeechTask(folder.name, task, None, samples, str(folder))


def _raw_format(row: dict[str, Any], where: str) -> tuple[int, int, str] | None:
    """A row's headerless-PCM format from its ``sample_rate``, ``channels`` and ``subtype`` fields, None without
    ``sample_rate``.

    Raises:
        UsageError: ``channels`` or ``subtype`` without ``sample_rate``, a rate or channel count below 1, a subtype
            soundfile's RAW format does not know (``where`` names the row).
    """
    import soundfile

    rate, channels, subtype = row.get("sample_rate"), row.get("channels"), row.get("subtype")
    if rate is None:
        if channels is not None or subtype is not None:
            raise UsageError(f"{where}: 'channels' and 'subtype' describe headerless PCM: give 'sample_rate' too")
        return None
    if rate < 1 or (channels is not None and channels < 1):
        raise UsageError(f"{where}: 'sample_rate' and 'channels' must be >= 1, got {rate} and {channels}")
    subtype = subtype or "PCM_16"
    known = soundfile.available_subtypes("RAW")
    if subtype not in known:
        raise UsageError(
            f"{where}: 'subtype' {subtype!r:.30} is not one of soundfile's RAW subtypes: {', '.join(known)}"
        )
    return int(rate), int(channels or 1), subtype


def _sound_source(audio: str | bytes) -> Any:
    import io

    return io.BytesIO(audio) if isinstance(audio, bytes) else audio


def _raw_args(raw: tuple[int, int, str] | None) -> dict[str, Any]:
    return {} if raw is None else {"format": "RAW", "samplerate": raw[0], "channels": raw[1], "subtype": raw[2]}


def _unreadable(audio: str | bytes, where: str, raw: tuple[int, int, str] | None, exc: Exception) -> UsageError:
    """soundfile's refusal as our one line; headerless PCM without a ``sample_rate`` is told which fields to add."""
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    hint = ""
    if raw is None and ("samplerate" in reason or str(audio).lower().endswith((".raw", ".pcm"))):
        hint = "; headerless PCM: give the row 'sample_rate' (and 'channels', 'subtype' where not 1 and PCM_16)"
    return UsageError(f"{where}: not an audio file soundfile reads ({reason}){hint}")


def check_audio(audio: str | bytes, where: str, raw: tuple[int, int, str] | None = None) -> None:
    """A recording's header read (a ``soundfile.SoundFile`` opened: no samples decoded), before any engine starts.

    Raises:
        UsageError: a file that is not audio soundfile reads, or has no samples (``where`` names it: the data
            file, line and field); headerless PCM without a ``sample_rate`` is told which fields to add.
    """
    import soundfile

    try:
        with soundfile.SoundFile(_sound_source(audio), **_raw_args(raw)) as opened:  # the header alone
            frames = opened.frames
    except Exception as exc:  # libsndfile's errors come as several types
        raise _unreadable(audio, where, raw, exc) from None
    if frames == 0:
        raise UsageError(f"{where}: the audio has no samples")


def decode_audio(audio: str | bytes, where: str | None = None, raw: tuple[int, int, str] | None = None) -> np.ndarray:
    """A recording as float32 mono at :data:`SAMPLE_RATE` Hz (channels averaged; resampled by soxr, its default
    high quality), shape (n_samples,); ``raw``: headerless PCM's (sample rate, channels, subtype).

    Raises:
        UsageError: a file libsndfile cannot decode, or one without samples (``where``, else the path, named
            with the reason).
    """
    where = where or (audio if isinstance(audio, str) else "audio")
    import soundfile
    import soxr

    try:
        data, rate = soundfile.read(_sound_source(audio), dtype="float32", **_raw_args(raw))
    except Exception as exc:  # libsndfile's errors come as several types
        raise _unreadable(audio, where, raw, exc) from None
    if data.ndim == 2:
        data = data.mean(axis=1, dtype=np.float32)
    if data.size == 0:
        raise UsageError(f"{where}: the audio has no samples")
    if rate != SAMPLE_RATE:
        data = soxr.resample(data, rate, SAMPLE_RATE).astype(np.float32, copy=False)
    return np.ascontiguousarray(data, dtype=np.float32)


def decode_all(samples: list[SpeechSample], threads: int | None = None) -> list[np.ndarray]:
    """:func:`decode_audio` of every sample, in order, on threads (libsndfile and soxr release the GIL)."""
    names = [s.audio if isinstance(s.audio, str) else f"sample {s.id}" for s in samples]
    workers = threads or worker_threads()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(decode_audio, [s.audio for s in samples], names, [s.raw for s in samples]))


def start_decoding(task: SpeechTask, limit: int | None = None) -> None:
    """Decode ``task``'s first ``limit`` recordings on a background thread (while a model loads, or the task before
    runs); :func:`run_transcription` takes them from there."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-eval-audio")
    task.decoding = (limit, pool.submit(decode_all, task.samples[:limit]))
    pool.shutdown(wait=False)


def run_transcription(
    transcriber: Any,
    task: SpeechTask,
    *,
    limit: int | None = None,
    output_dir: str | Path | None = None,
    warmup: int = 0,
    normalizer: str = "leaderboard",
) -> dict[str, Any]:
    """Transcribe ``task``'s recordings with ``transcriber`` and score them (:func:`speech_scores.score`, on the
    ``normalizer`` family's normalisers).
    ``warmup``: the first N recordings are transcribed once before the timed pass, their transcripts dropped (the
    Open ASR Leaderboard's warm-up: ``transcribe_seconds`` and ``rtfx`` then leave out first-call costs such as
    kernel selection).

    Returns:
        The results dict (``task``, ``metrics``, ``model``, ``seconds`` ...), also written to
        ``output_dir/results.json`` with one line per recording in ``samples.jsonl`` (the Open ASR Leaderboard's
        manifest fields ``audio_filepath``, ``duration``, ``text``, ``pred_text``, and ours).

    Raises:
        UsageError: a task without recordings; an audio file that does not decode.
    """
    from ..evaluation.results import task_record, write_task_results
    from .speech_scores import score, scoring_languages

    samples = task.samples[:limit]
    if not samples:
        raise UsageError(f"{task.name}: no recordings to transcribe")
    pending = task.decoding
    audios = pending[1].result() if pending is not None and pending[0] == limit else decode_all(samples)
    task.decoding = None  # the audio is not kept with the task
    durations = [len(a) / SAMPLE_RATE for a in audios]
    languages = [s.language or task.language for s in samples]
    warmup = min(max(int(warmup), 0), len(audios))
    if warmup:
        transcriber.transcribe(audios[:warmup], languages[:warmup], task.task, show_progress_bar=False)
    start, before = time.perf_counter(), transcriber.counters.copy()
    out = transcriber.transcribe(audios, languages, task.task)
    seconds = time.perf_counter() - start
    scored, sources = scoring_languages(task, [s.language for s in samples], out)
    metrics, rows = score([s.text for s in samples], [o["text"] for o in out], task, scored, normalizer)
    metrics.update(
        audio_seconds=round(sum(durations), 3),
        transcribe_seconds=round(seconds, 3),
        rtfx=round(sum(durations) / seconds, 2) if seconds > 0 else None,
        language_detected=sum(bool(o.get("detected")) for o in out),
        chunked=sum(o.get("chunks", 1) > 1 for o in out),
        # the cap on decoded tokens (None: the model's length) and the recordings that reached it (None: the
        # backend cannot tell, as a server's reply does not say)
        max_tokens=getattr(transcriber, "max_tokens", None),
        hit_max_tokens=(
            None if any(o.get("hit_max_tokens") is None for o in out) else sum(bool(o["hit_max_tokens"]) for o in out)
        ),
    )
    records = [
        {
            "id": s.id,
            "audio_filepath": s.audio if isinstance(s.audio, str) else None,
            "duration": round(d, 3),
            "text": s.text,
            "pred_text": o["text"],
            "language": o.get("language"),
            "language_detected": bool(o.get("detected")),
            "hit_max_tokens": o.get("hit_max_tokens"),
            "normalizer_language": lang,
            "normalizer_language_from": source,
            **row,
        }
        for s, d, o, row, lang, source in zip(samples, durations, out, rows, scored, sources, strict=True)
    ]
    args = {"limit": limit, "task": task.task, "warmup": warmup, "normalizer": normalizer}
    results = task_record(transcriber, task, metrics, before, seconds, args)
    if output_dir:
        write_task_results(output_dir, results, records)
    results["samples"] = records
    return results
