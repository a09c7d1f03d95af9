"""``VllmTranscriber``: speech-to-text models through vLLM (``LLM.generate`` with the model class's own prompts)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs
from ...engine.speech import transcribe_job, transcriber_info
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef
from ..vllm_backend import VllmBackend
from .base import TranscriberBase, check_max_tokens

#: vLLM's logits processor that applies Whisper's token suppression (:class:`vllm_eval.engine.suppress.WhisperSuppress`,
#: for either model runner).
SUPPRESS_PROCESSOR = "vllm_eval.engine.suppress:WhisperSuppress"


class VllmTranscriber(VllmBackend, TranscriberBase):
    """Every architecture the installed vLLM lists for transcription (Whisper; Voxtral, Granite Speech, Qwen3-ASR
    ... where installed), offline: each audio's prompts are built by the model class as vLLM's
    ``/v1/audio/transcriptions`` server builds them (:mod:`vllm_eval.engine.speech`), with the language and task
    tokens sent (but to English-only Whisper models, which have none in training), decoded greedily with the model's
    own token suppression.

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        server_decoding: decode exactly as vLLM's ``/v1/audio/transcriptions`` does; False (default): Whisper's own
            rules, as transformers and OpenAI's decoder apply them (the generation config's ``suppress_tokens`` and
            ``begin_suppress_tokens``; an English-only model's prompt without language and task tokens), see
            :func:`vllm_eval.engine.speech.transcribe_job`.
        max_tokens: at most this many tokens decoded per audio (per 30 s piece of a longer one); default the
            model's ``max_model_len`` (vLLM's ``SamplingParams.max_tokens``).
        chunk_size: audios handed to the engine at once (default 1024: vLLM's engine core schedules each request as
            it arrives, so the audio features of later requests are computed while earlier ones decode; every
            chunk ends in a tail where the batch drains).
        show_progress_bar, model_name, trust_remote_code: as for the other vLLM backends.
        data_parallel_size, replicas_per_gpu, ray_address: engine replicas; each chunk is split over them.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_num_seqs`` ...).

    Raises:
        UsageError: vLLM does not run the model for transcription.
        EngineError: vLLM failed to start (its reason in the message).
        ModelNotFoundError: a model path that does not exist.
    """

    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        server_decoding: bool = False,
        max_tokens: int | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        self.server_decoding = bool(server_decoding)
        self.max_tokens = check_max_tokens(max_tokens)
        self.engine_kwargs = backend_engine_kwargs(
            "generate",
            {"limit_mm_per_prompt": {"audio": 1}, "logits_processors": [SUPPRESS_PROCESSOR]},
            engine_kwargs,
            trust_remote_code=trust_remote_code,
            revision=revision,
        )
        with self.closed_on_error():
            info = self.start(ref, transcriber_info, data_parallel_size, replicas_per_gpu, ray_address)
            if not info["transcribes"]:
                raise UsageError(f"{ref.path}: vLLM runs {info['architecture']}, which does not transcribe speech")
            self.info = info
            self.name = model_name or ref.path
            super().__init__(model=ref.path, model_ref=ref, chunk_size=chunk_size, show_progress_bar=show_progress_bar)

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides, and the decoding rules."""
        return {
            **super().identity(),
            **self.engine_identity(),
            "server_decoding": self.server_decoding,
            "max_tokens": self.max_tokens,
        }

    def _transcribe_chunk(self, audios: list[np.ndarray], languages: list[str | None], task: str) -> list[dict]:
        options = {"server": self.server_decoding, "max_tokens": self.max_tokens}
        return self.run_split(
            transcribe_job,
            len(audios),
            lambda lo, hi: (audios[lo:hi], languages[lo:hi], task, options),
            lambda i: f"audio {i} ({len(audios[i]) / 16000:.1f} s)",
        )
