"""The reference transcriber: transformers' ``generate`` (``--backend hf``), greedy, batched."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.modelinfo import ModelRef
from ..base import torch_dtype_name
from .base import SAMPLE_RATE, TranscriberBase, check_max_tokens


class TransformersTranscriber(TranscriberBase):
    """``AutoModelForSpeechSeq2Seq`` with its processor, greedy ``generate`` (one beam, no sampling), the way the
    Open ASR Leaderboard runs transformers' models: the language and task given to ``generate`` (English-only
    models take neither), the generation config's token suppression applied by transformers.

    Audio longer than 30 s is transcribed by transformers' sequential long-form generation (the whole clip seen,
    with timestamps to move on), the reference chunked decoding is compared against.

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        device: torch device; None: CUDA when available, else CPU.
        dtype: ``float32`` (default), ``float16`` or ``bfloat16``.
        batch_size: audios per ``generate`` call.
        max_tokens: at most this many new tokens per audio (``generate``'s ``max_new_tokens``); default the
            generation config's ``max_length``.
        chunk_size, show_progress_bar, model_name, trust_remote_code: as for the vLLM backend.

    Raises:
        UsageError: an unknown dtype.
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 16,
        max_tokens: int | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

        ref = ModelRef.resolve(model, revision)
        self.dtype = torch_dtype_name(dtype)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.max_tokens = check_max_tokens(max_tokens)
        self.processor = AutoProcessor.from_pretrained(ref.path, revision=revision, trust_remote_code=trust_remote_code)
        self.hf_model = AutoModelForSpeechSeq2Seq.from_pretrained(
            ref.path, revision=revision, dtype=getattr(torch, self.dtype), trust_remote_code=trust_remote_code
        ).to(self.device)
        self.hf_model.eval()
        self.multilingual = bool(getattr(self.hf_model.generation_config, "is_multilingual", True))
        self.name = model_name or ref.path
        super().__init__(model=ref.path, model_ref=ref, chunk_size=chunk_size, show_progress_bar=show_progress_bar)

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "dtype": self.dtype, "max_tokens": self.max_tokens}

    def close(self) -> None:
        self.hf_model = None

    def _transcribe_chunk(self, audios: list[np.ndarray], languages: list[str | None], task: str) -> list[dict]:
        out: list[dict] = []
        for lo in range(0, len(audios), self.batch_size):
            batch = audios[lo : lo + self.batch_size]
            # One generate per language, and short-form apart from long-form (which decodes with timestamps)
            groups: dict[tuple[str | None, bool], list[int]] = {}
            for i, lang in enumerate(languages[lo : lo + self.batch_size]):
                groups.setdefault((lang, len(batch[i]) > 30 * SAMPLE_RATE), []).append(i)
            texts: dict[int, dict] = {}
            for (lang, _), idx in groups.items():
                for i, (text, capped) in zip(idx, self._generate([batch[i] for i in idx], lang, task), strict=True):
                    # an English-only model transcribes English whatever was asked (the vLLM backend says so too)
                    used = lang if lang or self.multilingual else "en"
                    texts[i] = {"text": text, "language": used, "detected": lang is None and self.multilingual}
                    texts[i]["hit_max_tokens"] = capped
            out += [texts[i] for i in range(len(batch))]
        return out

    def _generate(self, audios: list[np.ndarray], language: str | None, task: str) -> list[tuple[str, bool | None]]:
        """(text, whether generation stopped at the token cap: None for long-form, which decodes in windows) each."""
        import torch

        long = any(len(a) > 30 * SAMPLE_RATE for a in audios)
        kwargs: dict[str, Any] = {"sampling_rate": SAMPLE_RATE, "return_tensors": "pt"}
        if long:  # long-form: the whole clip's features, with the attention mask generate needs
            kwargs.update(truncation=False, padding="longest", return_attention_mask=True)
        else:  # the log-mel on the model's device, as the Open ASR Leaderboard's transformers runs compute it
            kwargs["device"] = str(self.device)
        features = self.processor(audios, **kwargs)
        inputs = {k: v.to(self.device) for k, v in features.items() if k in ("input_features", "attention_mask")}
        inputs["input_features"] = inputs["input_features"].to(getattr(torch, self.dtype))
        gen: dict[str, Any] = {"num_beams": 1, "do_sample": False}
        if self.max_tokens is not None:
            gen["max_new_tokens"] = self.max_tokens
        if self.multilingual:
            gen.update(task=task, language=language)
        if long:
            gen.update(return_timestamps=True, condition_on_prev_tokens=False)
        with torch.inference_mode():
            ids = self.hf_model.generate(**inputs, **gen)
        texts = self.processor.batch_decode(ids, skip_special_tokens=True)
        if long:
            return [(t, None) for t in texts]
        # Stopped by the cap: as many tokens as it allows. The rows hold the generated tokens without the decoder
        # prompt (start-of-transcript, no-timestamps, and language and task for a multilingual model), shorter rows
        # padded with end-of-text, and the longest not always ending in it; the model's own bound, max_length,
        # counts the prompt.
        eos = self.hf_model.generation_config.eos_token_id
        ends = {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        prompt = 4 if self.multilingual else 2
        cap = self.max_tokens or int(self.hf_model.generation_config.max_length) - prompt
        return [(t, sum(int(x) not in ends for x in row) >= cap) for t, row in zip(texts, ids, strict=True)]
