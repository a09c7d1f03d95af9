"""``TranscriberBase``: what every speech-to-text backend shares.

A backend implements :meth:`TranscriberBase._transcribe_chunk` (audios in, one transcript each out). The base
hands it chunks of :attr:`chunk_size` audios, shows progress in seconds of audio, and counts what a run's RTFx needs
(seconds of audio, seconds transcribing).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...engine.speech import SAMPLE_RATE
from ...utils.errors import UsageError
from ...utils.progress import input_bar
from ..base import BackendBase

#: The tasks a transcriber runs (vLLM's ``task_type``; OpenAI's ``/v1/audio/transcriptions`` and ``translations``).
SPEECH_TASKS = ("transcribe", "translate")


def check_max_tokens(value: int | None) -> int | None:
    """``max_tokens`` checked: None, or a whole number >= 1.

    Raises:
        UsageError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"max_tokens must be a whole number >= 1, got {value!r}")
    return value


def check_can_translate(ref: Any) -> None:
    """Refuses a model that cannot translate, from its ``generation_config.json`` (before any engine starts): an
    English-only Whisper (``is_multilingual: false``) or one whose ``task_to_id`` has no ``translate`` transcribes
    whatever it is asked (tiny.en wrote unrelated English for Spanish speech: BLEU 0.64, exit 0). A model whose files
    are not here, or whose generation config says neither, is let through.

    Raises:
        UsageError: naming the model and the field.
    """
    import json

    snapshot = getattr(ref, "snapshot", None)
    if snapshot is None:  # a served model's name, or a hub id not on this machine
        return
    path = Path(snapshot) / "generation_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    fix = "use --task transcribe, or a multilingual model"
    if config.get("is_multilingual") is False:
        raise UsageError(f"{ref.path} is English-only ({path.name}: is_multilingual false) and cannot translate: {fix}")
    tasks = config.get("task_to_id")
    if isinstance(tasks, dict) and "translate" not in tasks:
        raise UsageError(f"{ref.path} has no translate task ({path.name}: task_to_id has no 'translate'): {fix}")


class TranscriberBase(BackendBase, ABC):
    """Base of the transcriber backends: :meth:`transcribe` over one hook, :meth:`_transcribe_chunk`.

    Args:
        model, chunk_size, show_progress_bar, model_ref: as for :class:`~vllm_eval.models.base.BackendBase`
            (``chunk_size``: audios handed to the backend at once).

    Raises:
        UsageError: a bad ``chunk_size``.
    """

    kind: ClassVar[str] = "transcriber"
    #: The name results record for the model.
    name: str = ""

    def __init__(self, *, model: str, chunk_size: int = 256, show_progress_bar: bool = True, model_ref: Any = None):
        super().__init__(model=model, chunk_size=chunk_size, show_progress_bar=show_progress_bar, model_ref=model_ref)
        self.name = self.name or model

    @abstractmethod
    def _transcribe_chunk(self, audios: list[np.ndarray], languages: list[str | None], task: str) -> list[dict]:
        """One transcript per audio (float32 mono at :data:`SAMPLE_RATE`): dicts with ``text`` and, where the
        backend knows them, ``tokens`` (generated), ``chunks`` (pieces the audio was cut into), ``language`` (the one
        used) and ``detected`` (whether the language was detected)."""

    def transcribe(
        self,
        audios: Sequence[np.ndarray],
        languages: Sequence[str | None] | str | None = None,
        task: str = "transcribe",
        *,
        show_progress_bar: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Transcribe (or, ``task="translate"``, translate into English) each audio.

        Args:
            audios: float32 mono waveforms at :data:`SAMPLE_RATE` Hz, shape (n_samples,).
            languages: the spoken language of each (ISO 639-1 code), one code for all, or None: detected where the
                model can.
            task: ``transcribe`` or ``translate``.

        Returns:
            One dict per audio, in order (see :meth:`_transcribe_chunk`).

        Raises:
            UsageError: an unknown task; languages not one per audio.
        """
        if task not in SPEECH_TASKS:
            raise UsageError(f"task must be one of {', '.join(SPEECH_TASKS)}, got {task!r}")
        n = len(audios)
        langs = [languages] * n if languages is None or isinstance(languages, str) else list(languages)
        if len(langs) != n:
            raise UsageError(f"{len(langs)} languages for {n} audios: give one per audio, or one for all")
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        seconds = [len(a) / SAMPLE_RATE for a in audios]
        out: list[dict[str, Any]] = []
        with self._one_call() as counters:
            start = time.perf_counter()
            with input_bar("transcribe", round(sum(seconds)), "s of audio", enabled=show) as advance:
                for lo in range(0, n, self.chunk_size):
                    hi = min(lo + self.chunk_size, n)
                    out += self._transcribe_chunk(list(audios[lo:hi]), langs[lo:hi], task)
                    advance(round(sum(seconds[lo:hi])))
            counters.add_compute(time.perf_counter() - start)
        return out
