"""Speech-to-text: real Whisper weights (the packaged CTranslate2 copies, converted), real recorded speech (Debian's
Asterisk prompts, `make speech-data`), vLLM's CPU build against transformers' generate, and the field's scoring."""

from __future__ import annotations

import io
import json
import os
import struct
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_eval.testing import RAY_KV_BYTES
from vllm_eval.utils.errors import UsageError


def _has_speech() -> bool:
    from vllm_eval.tasks.speech import _asterisk_files

    try:
        _asterisk_files("en")
        return True
    except Exception:
        return False


needs_speech = pytest.mark.skipif(not _has_speech(), reason="Asterisk's prompts not unpacked (make speech-data)")


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """The packaged Whisper models as transformers folders: {"base": path, "tiny.en": path}."""
    from vllm_eval.testing.whisper import build_packaged_whisper

    root = tmp_path_factory.mktemp("whisper")
    return {name: build_packaged_whisper(name, root / name) for name in ("base", "tiny.en")}


@pytest.fixture(scope="module")
def vllm_base(whisper):
    from vllm_eval.models.transcriber.vllm import VllmTranscriber

    model = VllmTranscriber(whisper["base"], show_progress_bar=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def vllm_tiny(whisper):
    """tiny.en's engine, shared by the tests that need it (one start)."""
    from vllm_eval.models.transcriber.vllm import VllmTranscriber

    model = VllmTranscriber(whisper["tiny.en"], show_progress_bar=False)
    yield model
    model.close()


def _ct2(variables: dict[str, np.ndarray], aliases=(), version: int = 6) -> bytes:
    """A CTranslate2 model.bin as ctranslate2's ModelSpec.save writes it."""

    def string(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    out = struct.pack("<I", version) + string("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, value in variables.items():
        out += string(name) + struct.pack("<B", value.ndim) + b"".join(struct.pack("<I", d) for d in value.shape)
        out += struct.pack("<BI", codes[value.dtype], value.nbytes) + value.tobytes()
    out += struct.pack("<I", len(aliases)) + b"".join(string(a) + string(t) for a, t in aliases)
    return out


def test_ctranslate2_reader_reads_what_ctranslate2_writes_and_refuses_the_rest():
    from vllm_eval.testing.whisper import read_ctranslate2

    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    got = read_ctranslate2(io.BytesIO(_ct2({"a/weight": w, "a/num_heads": np.array(4, np.int16)}, [("b", "a/weight")])))
    np.testing.assert_array_equal(got["a/weight"], w)
    assert got["b"] is got["a/weight"] and int(got["a/num_heads"]) == 4
    with pytest.raises(ValueError, match="binary version 5, this reader knows version 6"):
        read_ctranslate2(io.BytesIO(_ct2({}, version=5)))
    with pytest.raises(ValueError, match="alias 'b' names no variable"):
        read_ctranslate2(io.BytesIO(_ct2({}, [("b", "x")])))
    with pytest.raises(ValueError, match="ends early"):
        read_ctranslate2(io.BytesIO(_ct2({"a": w})[:-20]))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 300))
def test_ctranslate2_reader_fuzzed(noise, cut):
    from vllm_eval.testing.whisper import read_ctranslate2

    valid = _ct2({"a": np.ones((2, 2), np.float16)})
    for data in (noise, valid[:cut] + noise, struct.pack("<I", 6) + noise):
        try:
            read_ctranslate2(io.BytesIO(data))
        except ValueError:
            pass


def test_prompt_texts_are_read_line_by_line():
    from vllm_eval.tasks.speech import parse_prompt_texts

    text = "; Core sounds\n\nagent-pass: Please enter your password.\ndigits/1: One.\nagent-pass: again\n"
    assert parse_prompt_texts(text) == [("agent-pass", "Please enter your password."), ("digits/1", "One.")]
    with pytest.raises(UsageError, match=r"core.txt, line 2: expected 'name: text', got 'no colon here'"):
        parse_prompt_texts("a: b\nno colon here\n", "core.txt")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_prompt_texts_fuzzed(text):
    from vllm_eval.tasks.speech import parse_prompt_texts

    try:
        pairs = parse_prompt_texts(text)
    except UsageError as exc:
        assert "line" in str(exc) and "\n" not in str(exc)
    else:
        assert all(name and not any(c.isspace() for c in name) for name, _ in pairs)


def test_audio_is_decoded_to_16khz_mono_float32(tmp_path):
    import soundfile

    from vllm_eval.tasks.speech import decode_audio

    t = np.arange(8000) / 8000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    soundfile.write(tmp_path / "mono8k.wav", tone, 8000, subtype="PCM_16")
    soundfile.write(tmp_path / "stereo.flac", np.stack([tone, -tone], axis=1), 8000)
    mono = decode_audio(str(tmp_path / "mono8k.wav"))
    assert mono.dtype == np.float32 and mono.shape == (16000,) and 0.45 < np.abs(mono).max() < 0.55
    assert np.abs(decode_audio(str(tmp_path / "stereo.flac"))).max() < 1e-3  # the channels cancel out
    assert np.array_equal(decode_audio((tmp_path / "mono8k.wav").read_bytes()), mono)
    (tmp_path / "bad.wav").write_bytes(b"RIFF not really")
    with pytest.raises(UsageError, match=r"bad.wav: not an audio file soundfile reads \("):
        decode_audio(str(tmp_path / "bad.wav"))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_audio_decoding_fuzzed(data):
    from vllm_eval.tasks.speech import decode_audio

    try:
        out = decode_audio(b"RIFF" + data)
    except UsageError as exc:
        assert "\n" not in str(exc)
    else:
        assert out.dtype == np.float32 and out.ndim == 1 and out.size > 0


def test_own_recordings_from_a_file_or_a_folder(tmp_path):
    import soundfile

    from vllm_eval.tasks.speech import load_speech_file

    (tmp_path / "clips").mkdir()
    soundfile.write(tmp_path / "clips" / "a.wav", np.zeros(1600, np.float32), 16000)
    soundfile.write(tmp_path / "clips" / "b.wav", np.zeros(1600, np.float32), 16000)
    (tmp_path / "clips" / "a.txt").write_text("hello there\n")
    data = tmp_path / "set.jsonl"
    data.write_text(
        json.dumps({"audio": "clips/a.wav", "text": "hello there", "language": "en"})
        + "\n"
        + json.dumps({"audio": "clips/b.wav", "text": "bye", "language": "en", "id": "x"})
        + "\n"
    )
    task = load_speech_file(data)
    assert task.name == "set" and task.language == "en" and [s.id for s in task.samples] == ["0", "x"]
    assert task.samples[0].audio == str((tmp_path / "clips" / "a.wav").resolve())
    data.write_text(
        json.dumps({"audio": "clips/a.wav", "text": "x"}) + "\n" + json.dumps({"audio": "no.wav", "text": "y"})
    )
    with pytest.raises(UsageError, match=r"set.jsonl:2: field .audio. .no.wav.: no such file"):
        load_speech_file(data)
    with pytest.raises(UsageError, match=r"b.wav has no transcript b.txt"):
        load_speech_file(tmp_path / "clips")
    (tmp_path / "clips" / "b.txt").write_text("bye")
    assert [s.text for s in load_speech_file(tmp_path / "clips", "translate").samples] == ["hello there", "bye"]


def test_audio_is_checked_when_the_data_file_is_read_and_headerless_pcm_takes_its_format(tmp_path):
    """Each recording's header is read as its data file is (before any model loads): a text file named .wav, an empty
    file, a WAV without samples and PCM with no header are named by data file, line and field."""
    import soundfile

    from vllm_eval.tasks.speech import decode_all, load_speech_file

    soundfile.write(tmp_path / "good.wav", np.zeros(1600, np.float32), 16000)
    soundfile.write(tmp_path / "silent.wav", np.zeros(0, np.float32), 16000)
    (tmp_path / "text.wav").write_text("not audio\n")
    (tmp_path / "empty.wav").write_bytes(b"")
    pcm = (np.sin(np.arange(8000) / 5) * 10000).astype("<i2")
    (tmp_path / "clip.raw").write_bytes(pcm.tobytes())
    data = tmp_path / "set.jsonl"

    def rows(*second):
        data.write_text("\n".join(json.dumps(r) for r in ({"audio": "good.wav", "text": "a"}, *second)) + "\n")
        return data

    for name, message in (
        ("text.wav", "set.jsonl:2: field 'audio' 'text.wav': not an audio file soundfile reads ("),
        ("empty.wav", "set.jsonl:2: field 'audio' 'empty.wav': not an audio file soundfile reads ("),
        ("silent.wav", "set.jsonl:2: field 'audio' 'silent.wav': the audio has no samples"),
        ("clip.raw", "headerless PCM: give the row 'sample_rate'"),
    ):
        with pytest.raises(UsageError) as info:
            load_speech_file(rows({"audio": name, "text": "b"}))
        assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    with pytest.raises(UsageError, match="set.jsonl:2: 'subtype' 'PCM_13' is not one of soundfile's RAW subtypes"):
        load_speech_file(rows({"audio": "clip.raw", "text": "b", "sample_rate": 8000, "subtype": "PCM_13"}))
    with pytest.raises(UsageError, match="set.jsonl:2: 'channels' and 'subtype' describe headerless PCM"):
        load_speech_file(rows({"audio": "good.wav", "text": "b", "channels": 1}))
    task = load_speech_file(rows({"audio": "clip.raw", "text": "b", "sample_rate": 8000}))
    assert task.samples[1].raw == (8000, 1, "PCM_16")
    good, clip = decode_all(task.samples)
    assert len(good) == 1600 and len(clip) == 16000  # one second at 8 kHz, resampled to 16 kHz
    assert np.corrcoef(clip[::2][100:-100], pcm[100:-100] / 32768)[0, 1] > 0.99
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "x.wav").write_text("not audio")
    (folder / "x.txt").write_text("words")
    with pytest.raises(UsageError, match=r"x.wav: not an audio file soundfile reads"):
        load_speech_file(folder)


def test_scores_count_substitutions_deletions_insertions_on_normalised_text():
    from vllm_eval.tasks.speech import SpeechTask
    from vllm_eval.tasks.speech_scores import score

    refs = ["Please enter your number, followed by the pound key.", "Mr. Smith's colour", "[beep]"]
    hyps = ["enter you number followed by the pound key now", "mister smith's color", "anything"]
    metrics, rows = score(refs, hyps, SpeechTask("t", "transcribe", "en"))
    # "please" dropped (D), "you" for "your" (S), "now" added (I); "[beep]" normalises to nothing: left out
    assert (metrics["substitutions"], metrics["deletions"], metrics["insertions"]) == (1, 1, 1)
    assert metrics["n_scored"] == 2 and metrics["reference_words"] == 13 and metrics["wer"] == pytest.approx(3 / 13)
    assert metrics["normalizer"].startswith("huggingface/open_asr_leaderboard@") and "English" in metrics["normalizer"]
    assert [r["errors"] for r in rows] == [3, 0, None] and metrics["wer_raw"] > metrics["wer"]
    m, _ = score(["¿Qué tal? Bien."], ["que tal bien"], SpeechTask("t", "transcribe", "es"))
    assert "MultilingualNormalizer(lang=es)" in m["normalizer"] and m["wer"] == pytest.approx(1 / 3)  # qué ≠ que
    assert "bleu" not in m
    m, _ = score(["¿Qué tal? Bien."], ["que tal bien"], SpeechTask("t", "transcribe", "es"), normalizer="basic")
    assert m["normalizer"].endswith(" BasicTextNormalizer") and m["wer"] == pytest.approx(1 / 3)
    # OpenAI's original reads "smith's" as "smith is"; the leaderboard's keeps it a possessive
    m, _ = score(["Mr. Smith's colour"], ["mister smith is color"], SpeechTask("t", "transcribe", "en"), None, "openai")
    assert m["wer"] == 0 and "OpenAI's english.json" in m["normalizer"]
    # a translation (Spanish speech, English references) is scored in English, with BLEU and chrF
    m, _ = score(["How are you? Fine."], ["how are you fine"], SpeechTask("t", "translate", "es"))
    assert "EnglishTextNormalizer" in m["normalizer"] and m["wer"] == 0 and 0 <= m["bleu"] < 100 < m["chrf"] + 60


@needs_speech
def test_vllm_and_transformers_give_the_same_transcripts_on_the_offline_suite(whisper, vllm_base, vllm_tiny):
    """CPU, fp32, greedy: whisper base in two languages and tiny.en, the same transcripts, so the same WER; the WER
    is the leaderboard's way (jiwer on Whisper-normalised texts, empty references dropped) on the same hypotheses."""
    import jiwer

    from vllm_eval.models.transcriber.hf import TransformersTranscriber
    from vllm_eval.tasks.speech import decode_all, run_transcription
    from vllm_eval.tasks.speech_hub import get_speech_task
    from vllm_eval.tasks.speech_scores import normalizer_for

    for name, languages in (("base", ("en", "es")), ("tiny.en", ("en",))):
        ours = vllm_base if name == "base" else vllm_tiny
        reference = TransformersTranscriber(whisper[name], show_progress_bar=False)
        try:
            for lang in languages:
                task = get_speech_task(f"AsteriskPrompts.{lang}")
                a, b = (run_transcription(m, task, limit=5) for m in (ours, reference))
                assert [s["pred_text"] for s in a["samples"]] == [s["pred_text"] for s in b["samples"]], (name, lang)
                assert a["metrics"]["wer"] == b["metrics"]["wer"] < 0.5, (name, lang)
                normalise, _ = normalizer_for(lang)
                pairs = [(normalise(s["text"]).strip(), normalise(s["pred_text"]).strip()) for s in a["samples"]]
                pairs = [(r, h) for r, h in pairs if r]
                assert a["metrics"]["wer"] == pytest.approx(jiwer.wer([r for r, _ in pairs], [h for _, h in pairs]))
                assert a["metrics"]["cer"] == pytest.approx(jiwer.cer([r for r, _ in pairs], [h for _, h in pairs]))
            if name == "base":  # --max-tokens: both backends stop at the same token
                audios = decode_all(get_speech_task("AsteriskPrompts.en").samples[:3])
                ours.max_tokens = reference.max_tokens = 3
                capped = ours.transcribe(audios, "en")
                assert [o["tokens"] for o in capped] == [3, 3, 3]
                assert [o["text"] for o in capped] == [o["text"] for o in reference.transcribe(audios, "en")]
                ours.max_tokens = None
                assert len(ours.transcribe(audios[:1], "en")[0]["text"]) > len(capped[0]["text"])
        finally:
            ours.max_tokens = None
            reference.close()


@needs_speech
def test_server_decoding_loses_tiny_en_transcripts_that_whispers_rules_keep(vllm_tiny, monkeypatch):
    """vLLM's server adds language and task tokens to an English-only model's prompt and suppresses no token: on
    these phone prompts tiny.en then often ends at once."""
    from vllm_eval.tasks.speech import decode_all
    from vllm_eval.tasks.speech_hub import get_speech_task

    audios = decode_all(get_speech_task("AsteriskPrompts.en").samples[:8])
    ours = vllm_tiny.transcribe(audios, "en")
    monkeypatch.setattr(vllm_tiny, "server_decoding", True)
    server = vllm_tiny.transcribe(audios, "en")
    assert all(o["text"].strip() for o in ours)
    assert sum(not o["text"].strip() for o in server) >= 4


@needs_speech
def test_an_english_only_models_recordings_are_scored_in_english(whisper, vllm_tiny, tmp_path):
    """A folder of recordings says no language; tiny.en transcribes English, so Whisper's English normaliser scores
    it (the basic one counted "ten of clubs" against "10 of clubs" as an error), on both backends; transcripts cut
    by the token cap are counted (``hit_max_tokens``)."""
    import shutil

    from vllm_eval.models.transcriber.hf import TransformersTranscriber
    from vllm_eval.tasks.speech import load_speech_file, run_transcription
    from vllm_eval.tasks.speech_hub import get_speech_task

    for s in get_speech_task("AsteriskPrompts.en").samples[:2]:
        shutil.copy(s.audio, tmp_path / f"{s.id}.wav")
        (tmp_path / f"{s.id}.txt").write_text(s.text)
    task = load_speech_file(tmp_path)
    assert task.language is None and all(s.language is None for s in task.samples)
    reference = TransformersTranscriber(whisper["tiny.en"], show_progress_bar=False)
    try:
        for model in (vllm_tiny, reference):
            result = run_transcription(model, task)
            assert "EnglishTextNormalizer" in result["metrics"]["normalizer"], result["metrics"]["normalizer"]
            assert {(r["normalizer_language"], r["normalizer_language_from"]) for r in result["samples"]} == {
                ("en", "model")
            }
            assert result["metrics"]["hit_max_tokens"] == 0 and result["metrics"]["max_tokens"] is None
            model.max_tokens = 3  # every transcript is cut: counted, and the cap recorded
            try:
                capped = run_transcription(model, task)
            finally:
                model.max_tokens = None
            assert capped["metrics"]["hit_max_tokens"] == 2 and capped["metrics"]["max_tokens"] == 3
            assert all(r["hit_max_tokens"] for r in capped["samples"])
    finally:
        reference.close()


@needs_speech
def test_language_is_detected_when_not_given_and_long_audio_is_cut(vllm_base):
    from vllm_eval.tasks.speech import decode_all
    from vllm_eval.tasks.speech_hub import get_speech_task

    samples = get_speech_task("AsteriskPrompts.es").samples[:2] + get_speech_task("AsteriskPrompts.en").samples[:1]
    audios = decode_all(samples)
    out = vllm_base.transcribe(audios, None)
    assert [(o["language"], o["detected"]) for o in out] == [("es", True), ("es", True), ("en", True)]
    long = np.concatenate([audios[2]] * int(np.ceil(40 * 16000 / len(audios[2]))))  # > 30 s: cut in two or more
    [whole] = vllm_base.transcribe([long], "en")
    assert whole["chunks"] >= 2 and whole["text"].lower().count("agent") >= 4


@needs_speech
def test_warmup_is_transcribed_before_the_timed_pass_and_bad_caps_are_refused(whisper, vllm_base, monkeypatch):
    from vllm_eval.models.transcriber.hf import TransformersTranscriber
    from vllm_eval.tasks.speech import run_transcription
    from vllm_eval.tasks.speech_hub import get_speech_task

    calls: list[int] = []
    chunk = vllm_base._transcribe_chunk
    monkeypatch.setattr(vllm_base, "_transcribe_chunk", lambda a, *rest: calls.append(len(a)) or chunk(a, *rest))
    result = run_transcription(vllm_base, get_speech_task("AsteriskPrompts.en"), limit=3, warmup=2)
    assert calls == [2, 3] and result["config"]["warmup"] == 2 and len(result["samples"]) == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(UsageError, match=f"max_tokens must be a whole number >= 1, got {bad!r}"):
            TransformersTranscriber(whisper["base"], max_tokens=bad)


@needs_speech
def test_transcribe_command_end_to_end_and_its_errors(whisper, vllm_base, cli_in_process, tmp_path):
    import shutil

    from vllm_eval.evaluation.scoring.units import sample_units
    from vllm_eval.tasks.speech_hub import get_speech_task

    folder = tmp_path / "mine"
    folder.mkdir()
    for s in get_speech_task("AsteriskPrompts.fr").samples[:3]:
        shutil.copy(s.audio, folder / f"{s.id}.wav")
        (folder / f"{s.id}.txt").write_text(s.text, encoding="utf-8")
    out = tmp_path / "out"
    code, err = cli_in_process(
        "transcribe", "--model", whisper["base"], "--data", str(folder), "--output-dir", str(out)
    )
    assert code == 0, err
    assert "mine (" in cli_in_process.stdout and "WER " in cli_in_process.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["n_samples"] == 3 and results["metrics"]["language_detected"] == 3
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {"audio_filepath", "duration", "text", "pred_text"} <= set(rows[0]) and rows[0]["language"] == "fr"
    assert rows[0]["normalizer_language"] == "fr" and rows[0]["normalizer_language_from"] == "detected"
    statistic, units = sample_units("wer", rows)  # what a sweep's bootstrap resamples: the WER on all of them
    assert statistic == "ratio" and units[:, 0].sum() / units[:, 1].sum() == pytest.approx(results["metrics"]["wer"])
    # an English-only model asked to translate: refused before any engine starts (it once wrote unrelated English)
    start = time.perf_counter()
    code, err = cli_in_process(
        "transcribe", "--model", whisper["tiny.en"], "--data", str(folder), "--task", "translate"
    )
    assert code == 2 and "is English-only (generation_config.json: is_multilingual false)" in err, err
    assert err.count("\n") == 1 and time.perf_counter() - start < 20
    code, err = cli_in_process("transcribe", "--model", whisper["base"], "--tasks", "AsteriskPrompts.de")
    assert code == 2 and "unknown speech task 'AsteriskPrompts.de'" in err and "Traceback" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"audio": "x.wav"}\n')
    code, err = cli_in_process("transcribe", "--model", whisper["base"], "--data", str(bad))
    assert code == 2 and "bad.jsonl" in err and "text" in err and "Traceback" not in err


def test_hub_sets_fail_at_once_offline_and_their_rows_read_as_recordings(tmp_path, monkeypatch):
    """Offline (as every test), a hub set is refused before anything loads; its rows, as `datasets` gives them with
    the audio column undecoded, become recordings (FLEURS translation: the English references joined on id)."""
    import datasets
    import soundfile

    from vllm_eval.tasks import speech_hub
    from vllm_eval.tasks.registry import own_tasks
    from vllm_eval.utils.errors import DataUnavailableError

    with pytest.raises(DataUnavailableError, match=r"LibriSpeech.test-clean needs dataset openslr/librispeech_asr"):
        speech_hub.get_speech_task("librispeech.test-clean")
    listed = {t.name: t for t in own_tasks("transcribe")}
    assert listed["FLEURS.de-en"].main_score == "bleu" and listed["ESB.ami"].source == speech_hub._ESB
    soundfile.write(tmp_path / "a.wav", np.zeros(800, np.float32), 16000)
    rows = {
        "de_de": {"id": [7, 8], "audio": [str(tmp_path / "a.wav")] * 2, "raw_transcription": ["Hallo", "Tschüss"]},
        "en_us": {"id": [8, 9], "audio": [str(tmp_path / "a.wav")] * 2, "raw_transcription": ["Bye", "Other"]},
    }

    def fake_rows(source, config):
        ds = datasets.Dataset.from_dict(rows[config]).cast_column("audio", datasets.Audio())
        return ds.cast_column("audio", datasets.Audio(decode=False))

    monkeypatch.setattr(speech_hub, "_rows", fake_rows)
    monkeypatch.setattr("vllm_eval.utils.hub.require_dataset", lambda *a, **k: None)
    task = speech_hub.get_speech_task("FLEURS.de")
    assert [(s.id, s.text, s.language) for s in task.samples] == [("7", "Hallo", "de"), ("8", "Tschüss", "de")]
    assert task.task == "transcribe" and isinstance(task.samples[0].audio, (bytes, str))
    translate = speech_hub.get_speech_task("FLEURS.de-en")
    assert translate.task == "translate" and [(s.id, s.text) for s in translate.samples] == [("8", "Bye")]


@needs_speech
@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="a `vllm serve` of whisper base, 45-63 s: the CI's 30 minutes; the server decoding is tested in process "
    "(test_server_decoding_loses_tiny_en_transcripts_that_whispers_rules_keep). VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_remote_backend_against_vllm_serve_matches_the_server_decoding_offline(whisper, vllm_base):
    """`vllm serve` of whisper base on loopback: its /v1/audio/transcriptions transcripts equal the offline backend's
    with --server-decoding (the same samples are uploaded, the same prompts built)."""
    from vllm_eval.models.http import HttpOptions
    from vllm_eval.models.transcriber.remote import RemoteTranscriber
    from vllm_eval.tasks.speech import decode_all
    from vllm_eval.tasks.speech_hub import get_speech_task
    from vllm_eval.testing import serve_model

    audios = decode_all(get_speech_task("AsteriskPrompts.es").samples[:4])
    vllm_base.server_decoding = True
    try:
        offline = vllm_base.transcribe(audios, "es")
    finally:
        vllm_base.server_decoding = False
    with serve_model(whisper["base"], "--max-model-len", "448") as url:
        with RemoteTranscriber(HttpOptions([url]), show_progress_bar=False) as served:
            remote = served.transcribe(audios, "es")
    assert [r["text"] for r in remote] == [o["text"] for o in offline] and all(r["text"].strip() for r in remote)


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="40 s of CI's 30 minutes: Ray replicas run in CI in tests/test_ray.py (the encoder's), the "
    "transcriber in this module; VLLMEVAL_FULL_TESTS=1 runs it",
)
@needs_speech
def test_replicas_on_ray_give_the_transcripts_of_one_engine(whisper, vllm_tiny):
    """Two replicas (`--data-parallel-size 2`) as Ray actors of a loopback cluster (`--ray-address`) split the
    recordings and return the in-process engine's transcripts, in order. (Replica processes here start the same
    jobs through another launcher: tests/test_replicas_kinds.py, for every other kind.)"""
    from vllm_eval.models.transcriber.vllm import VllmTranscriber
    from vllm_eval.tasks.speech import decode_all
    from vllm_eval.tasks.speech_hub import get_speech_task
    from vllm_eval.testing import ray_cluster

    pytest.importorskip("ray")
    audios = decode_all(get_speech_task("AsteriskPrompts.en").samples[:4])
    one = vllm_tiny.transcribe(audios, "en")
    with ray_cluster(num_cpus=2) as address:
        with VllmTranscriber(
            whisper["tiny.en"],
            data_parallel_size=2,
            ray_address=address,
            chunk_size=2,
            kv_cache_memory_bytes=RAY_KV_BYTES,
            show_progress_bar=False,
        ) as on_ray:
            assert on_ray.transcribe(audios, "en") == one
            state = on_ray.pool.state()
    assert state.where == f"ray {address}" and sorted(state.jobs_done) == [0, 1] and state.lost == {}
    assert sum(state.jobs_done.values()) >= 2
