"""What runs on a speech-to-text engine: its setup ``transcriber_info(llm)`` and the job ``transcribe_job(llm,
payload)``, as :mod:`vllm_eval.engine.jobs` holds the other kinds' (the same code in-process and in replicas);
Whisper's token suppression, the logits processor :class:`~vllm_eval.engine.suppress.WhisperSuppress`, is applied to
its requests.

Prompts are the model class's own (``get_generation_prompt``, ``get_language_detection_prompt``), built as vLLM's
``/v1/audio/transcriptions`` server builds them (``vllm/entrypoints/speech_to_text/base/serving.py``): the
language validated by the class, detected with one constrained token first where the class can and none was given,
audio longer than the class's clip (30 s for Whisper) cut by vLLM's own ``split_audio`` at the quietest window and
the chunks' texts joined with the server's separator, at most ``max_model_len`` tokens decoded greedily.

Whisper's generation config suppresses some tokens at every step (``suppress_tokens``: non-speech symbols) and
the blank and end-of-text at the first (``begin_suppress_tokens``), as OpenAI's decoder and transformers' generate
do; vLLM's Whisper applies neither (on an 8 kHz phone prompt, tiny.en then ends at once, an empty transcript).
Requests of this module carry ``extra_args[SUPPRESS_KEY]`` and the engine runs :class:`WhisperSuppress`
(:mod:`vllm_eval.engine.suppress`, for both of vLLM's model runners), so greedy decoding is transformers'.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .suppress import SUPPRESS_KEY, WhisperSuppress

__all__ = ["SUPPRESS_KEY", "WhisperSuppress", "transcribe_job", "transcriber_info"]

#: Sampling rate every audio is resampled to before it reaches the engine (Whisper's and vLLM's speech models').
SAMPLE_RATE = 16000


def _model_class(llm: Any) -> Any:
    from vllm.model_executor.model_loader import get_model_cls

    return get_model_cls(llm.model_config)


def transcriber_info(llm: Any) -> dict[str, Any]:
    """What a transcriber needs from an engine (picklable): whether the model transcribes, its languages, whether
    it detects the language, its clip length and sampling rate, ``max_model_len``, dtype."""
    cls = _model_class(llm)
    config = llm.model_config
    info: dict[str, Any] = {
        "architecture": cls.__name__,
        "transcribes": bool(getattr(cls, "supports_transcription", False)),
        "transcription_only": bool(getattr(cls, "supports_transcription_only", False)),
        "languages": dict(getattr(cls, "supported_languages", {}) or {}),
        "detects_language": bool(getattr(cls, "supports_explicit_language_detection", False)),
        "max_model_len": int(config.max_model_len),
        "dtype": str(config.dtype),
        "quantization": config.quantization,
    }
    if info["transcribes"]:
        stt = cls.get_speech_to_text_config(config, "transcribe")
        info["sample_rate"] = int(stt.sample_rate)
        info["max_audio_clip_s"] = stt.max_audio_clip_s
    return info


def _generation_config(config: Any) -> dict[str, Any]:
    """The model's generation config (``generation_config.json``), {} where there is none to read."""
    try:
        return config.try_get_generation_config() or {}
    except Exception:  # no generation config to read (a hub model offline): none
        return {}


def _suppressed(config: Any, generation: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The model's (``suppress_tokens``, ``begin_suppress_tokens``): its generation config's, else its config's."""
    hf = config.hf_config
    return tuple(  # type: ignore[return-value]
        [int(t) for t in (generation.get(key) or getattr(hf, key, None) or [])]
        for key in ("suppress_tokens", "begin_suppress_tokens")
    )


def _generation_prompt(cls: Any, audio: np.ndarray, stt: Any, config: Any, language: str | None, task: str) -> Any:
    """The class's ``get_generation_prompt``: vLLM 0.32 takes one ``SpeechToTextParams``, earlier releases its
    fields as keywords."""
    params = dict(audio=audio, stt_config=stt, model_config=config, language=language, task_type=task)
    try:
        from vllm.config.speech_to_text import SpeechToTextParams
    except ImportError:
        accepted = inspect.signature(cls.get_generation_prompt).parameters
        extra = {"request_prompt": "", "to_language": None}
        return cls.get_generation_prompt(**params, **{k: v for k, v in extra.items() if k in accepted})
    return cls.get_generation_prompt(SpeechToTextParams(**params))


def _chunks(audio: np.ndarray, stt: Any) -> list[np.ndarray]:
    """``audio`` cut as vLLM's server cuts it: whole up to the class's clip length, else by ``split_audio``."""
    from vllm.multimodal.audio import split_audio

    limit = stt.max_audio_clip_s
    if not getattr(stt, "allow_audio_chunking", True) or limit is None or len(audio) / stt.sample_rate <= limit:
        return [audio]
    return split_audio(
        audio_data=audio,
        sample_rate=int(stt.sample_rate),
        max_clip_duration_s=limit,
        overlap_duration_s=stt.overlap_chunk_second,
        min_energy_window_size=stt.min_energy_split_window_size,
    )


def _detect(llm: Any, cls: Any, stt: Any, audios: list[np.ndarray]) -> list[str]:
    """Each audio's language by the class's own detection (one token among its language tokens, greedy)."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=1, temperature=0.0, allowed_token_ids=cls.get_language_token_ids(tokenizer))
    prompts = [cls.get_language_detection_prompt(a, stt) for a in audios]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [cls.parse_language_detection_output(list(o.outputs[0].token_ids), tokenizer) for o in outputs]


def transcribe_job(llm: Any, payload: tuple[list[np.ndarray], list[str | None], str, dict[str, Any]]) -> list[dict]:
    """Transcribe (``task`` ``"transcribe"``) or translate (``"translate"``) float32 mono 16 kHz audios, one
    language code (or None: detected where the model can) each, with greedy decoding, at most
    ``options["max_tokens"]`` tokens per piece (default ``max_model_len``). ``options["server"]``: True
    decodes exactly as vLLM's server does; False (default) keeps Whisper's own rules: its token suppression
    (:class:`WhisperSuppress`) and, for an English-only model, the decoder prompt it was trained with
    (``<|startoftranscript|><|notimestamps|>``: vLLM's adds language and task tokens the ``.en`` models never saw).

    Returns:
        One dict per audio: ``text`` (the chunks' texts joined), ``tokens`` (generated, all chunks), ``chunks``,
        ``language`` (the one used), ``detected`` (whether it was detected here), ``hit_max_tokens`` (whether a
        piece stopped at the token cap rather than at end-of-text: a repetition loop, or a cut transcript).

    Raises:
        ValueError: a language the model refuses (vLLM's message).
    """
    from vllm import SamplingParams

    audios, languages, task, options = payload
    server = bool(options.get("server", False))
    cls, config = _model_class(llm), llm.model_config
    stt = cls.get_speech_to_text_config(config, task)
    generation = _generation_config(config)
    # Whisper's English-only (.en) models: is_multilingual False in their generation config
    english_only = generation.get("is_multilingual") is False
    if english_only:  # nothing to detect (and its language tokens are not the multilingual ones)
        languages = [lang or "en" for lang in languages]
    languages = [cls.validate_language(lang) for lang in languages]
    undetected = [i for i, lang in enumerate(languages) if lang is None]
    detected = set()
    if undetected and getattr(cls, "supports_explicit_language_detection", False):
        found = _detect(llm, cls, stt, [_chunks(audios[i], stt)[0] for i in undetected])
        for i, lang in zip(undetected, found, strict=True):
            languages[i] = lang
            detected.add(i)
    prompts, owner = [], []
    for i, audio in enumerate(audios):
        for chunk in _chunks(audio, stt):
            prompt = _generation_prompt(cls, chunk, stt, config, languages[i], task)
            prompts.append(prompt if server or not english_only else _english_prompt(prompt, languages[i], task))
            owner.append(i)
    suppress = _suppressed(config, generation)
    extra = {SUPPRESS_KEY: suppress} if not server and any(suppress) else None
    limit = int(config.max_model_len)
    limit = min(int(options["max_tokens"]), limit) if options.get("max_tokens") else limit
    params = SamplingParams(temperature=0.0, max_tokens=limit, extra_args=extra)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    texts: list[list[str]] = [[] for _ in audios]
    tokens = [0] * len(audios)
    capped = [False] * len(audios)
    for i, out in zip(owner, outputs, strict=True):
        texts[i].append(out.outputs[0].text)
        tokens[i] += len(out.outputs[0].token_ids)
        capped[i] |= out.outputs[0].finish_reason == "length"  # stopped by max_tokens, not by end-of-text
    no_space = getattr(cls, "no_space_languages", {"ja", "zh"})
    return [
        {
            "text": _joined(texts[i], "" if languages[i] in no_space else " "),
            "tokens": tokens[i],
            "hit_max_tokens": capped[i],
            "chunks": len(texts[i]),
            "language": languages[i],
            "detected": i in detected,
        }
        for i in range(len(audios))
    ]


def _joined(texts: list[str], separator: str) -> str:
    """One audio's text: its only chunk's as is, else the chunks' stripped texts joined (vLLM's server's way)."""
    return texts[0] if len(texts) == 1 else separator.join(t.strip() for t in texts)


def _english_prompt(prompt: Any, language: str | None, task: str) -> Any:
    """``prompt`` (the class's encoder-decoder prompt) with its decoder prompt's language and task tokens taken
    out: what an English-only Whisper was trained with (OpenAI's tokenizer gives ``.en`` models no such tokens)."""
    decoder = prompt.get("decoder_prompt") if isinstance(prompt, dict) else None
    if not isinstance(decoder, dict) or not isinstance(decoder.get("prompt"), str):
        return prompt
    text = decoder["prompt"].replace(f"<|{language}|><|{task}|>", "")
    return {**prompt, "decoder_prompt": {**decoder, "prompt": text}}
