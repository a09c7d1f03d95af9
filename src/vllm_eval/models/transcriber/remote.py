"""``RemoteTranscriber``: a speech-to-text model served by ``vllm serve`` (``/v1/audio/transcriptions`` and
``/v1/audio/translations``, OpenAI's multipart upload)."""

from __future__ import annotations

import io
from typing import Any, ClassVar

import numpy as np

from ..http import HttpClient, HttpOptions, RemoteBackend, expect
from .base import SAMPLE_RATE, TranscriberBase, check_max_tokens

#: The route of each task.
ROUTES = {"transcribe": "/v1/audio/transcriptions", "translate": "/v1/audio/translations"}


class RemoteTranscriber(RemoteBackend, TranscriberBase):
    """Transcripts from vLLM's ``/v1/audio/transcriptions`` (translations from ``/v1/audio/translations``): one
    upload per audio, ``max_concurrency`` at once over the endpoints, with retries and failover
    (:mod:`vllm_eval.models.http`).

    Each audio is sent as the samples every backend gets (float32 WAV, mono, 16 kHz), so the server decodes what the
    offline backends decode; ``language`` is sent where known (the server detects it otherwise), ``temperature`` 0.
    The server decodes by its own rules (no Whisper token suppression: ``--server-decoding`` of the vllm backend
    gives the same).

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        max_tokens: at most this many tokens per audio (sent as ``max_completion_tokens``); default the server's.
        chunk_size, show_progress_bar, model_name: as for the other transcriber backends.

    Raises:
        EndpointError: no endpoint answers, a server refuses an audio (named), or a reply is malformed.
    """

    route: ClassVar[str] = ROUTES["transcribe"]

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        max_tokens: int | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        self.max_tokens = check_max_tokens(max_tokens)
        served, _ = self._connect(http, model)
        with self.closed_on_error():
            self.served = served
            self.name = model_name or served
            self.server_version = self.http.server_version()
            super().__init__(model=served, chunk_size=chunk_size, show_progress_bar=show_progress_bar)

    def identity(self) -> dict[str, Any]:
        """The base identity plus the server's version."""
        return {**super().identity(), "server_version": self.server_version, "max_tokens": self.max_tokens}

    def _transcribe_chunk(self, audios: list[np.ndarray], languages: list[str | None], task: str) -> list[dict]:
        client: HttpClient = self.http
        items = list(zip(range(len(audios)), audios, languages, strict=True))

        def one(item: tuple[int, np.ndarray, str | None]) -> dict:
            _, audio, language = item
            fields = {"model": self.served, "response_format": "json", "temperature": "0"}
            if language:
                fields["language"] = language
            if self.max_tokens is not None:
                fields["max_completion_tokens"] = str(self.max_tokens)
            text = client.request(
                "POST",
                ROUTES[task],
                fields,
                parse=_text,
                files={"file": ("audio.wav", _wav(audio), "audio/wav")},
            )
            return {"text": text, "language": language, "detected": language is None}

        return client.map(one, items)


def _text(body: Any) -> str:
    expect(isinstance(body, dict) and isinstance(body.get("text"), str), "no 'text' in the reply")
    return body["text"]


def _wav(audio: np.ndarray) -> bytes:
    """``audio`` (float32, 16 kHz) as WAV bytes of the same float32 samples."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, audio, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()
