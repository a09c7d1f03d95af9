"""``vllm_eval.transcribe``: a speech-to-text model on recordings with reference texts, from Python.

Runs its tasks (the offline suite, or your own recordings) through one backend and writes ``results.json`` and
``samples.jsonl`` per task, as ``vllm-eval transcribe`` does (the command parses its flags and calls this).
"""

from __future__ import annotations

import os
from typing import Any

from ..tasks.asr_normalizers import check_normalizer
from ..utils.errors import UsageError
from .checks import check_model_argument
from .classify import TaskResults, _run_tasks
from .command_sweep import sweepable


@sweepable("transcribe")
def transcribe(
    model: str | os.PathLike | None,
    tasks: list[str] | str | None = None,
    *,
    data: str | os.PathLike | None = None,
    task: str = "transcribe",
    limit: int | None = None,
    backend: str = "vllm",
    output_dir: str | os.PathLike | None = None,
    warmup: int = 0,
    normalizer: str = "leaderboard",
    **common: Any,
) -> TaskResults:
    """Transcribe (or translate into English) recordings and score them: WER and CER on normalised texts (named
    with source and version in each result), the raw WER, substitutions, deletions and insertions, RTFx; BLEU
    and chrF for translation.

    Args:
        model: a model directory or hub id (Whisper, or any architecture vLLM transcribes); for a served model the
            served name (optional).
        tasks: offline suite names (``AsteriskPrompts.en`` ... ``.ru``; default ``AsteriskPrompts.en``), or ``data``:
            your own ``.jsonl``/``.csv``/``.parquet`` file (``audio``, ``text``, [``language``]) or a folder of audio
            files with a ``.txt`` transcript each.
        task: ``transcribe`` or ``translate`` (for ``data``; the named tasks carry their own).
        limit: the first N recordings of each task only.
        backend: ``vllm`` (default), ``hf`` (transformers' ``generate``, the reference) or ``remote`` (``vllm serve``
            instances' ``/v1/audio/*``: ``endpoint=``).
        output_dir: ``<output_dir>`` for one task, ``<output_dir>/<task>`` for several; default
            ``results/transcribe/<task>``.
        warmup: before the first task's timed pass, transcribe its first N recordings once, untimed (the Open ASR
            Leaderboard's warm-up; RTFx then leaves out first-call costs).
        normalizer: ``leaderboard`` (the Open ASR Leaderboard's normalisers: its English one for English, its
            multilingual one otherwise), ``openai`` (OpenAI's originals: ``EnglishTextNormalizer``,
            ``BasicTextNormalizer``) or ``basic`` (``BasicTextNormalizer`` for all); see
            :mod:`vllm_eval.tasks.asr_normalizers`.
        **common: ``show_progress``, ``verbose``, ``started``, the backend options ``server_decoding`` (vllm:
            decode exactly as vLLM's server does), ``batch_size`` (hf) and ``max_tokens`` (tokens decoded per
            recording at most), and vLLM ``EngineArgs``, as :func:`vllm_eval.evaluate` takes them.

    Returns:
        A :class:`~vllm_eval.api.classify.TaskResults`.

    Raises:
        UsageError: both ``tasks`` and ``data``, an unknown ``task`` or ``normalizer``, a bad option; a bad file
            (named with its line); ``translate`` with a model that cannot translate (an English-only Whisper).
        DataUnavailableError: the offline suite's recordings are not unpacked (``make speech-data``).
        EngineError: a failure while running.
    """
    check_model_argument(model)
    from ..tasks.speech import run_transcription, start_decoding

    check_normalizer(normalizer)
    if task not in ("transcribe", "translate"):
        raise UsageError(f"--task must be transcribe or translate, got {task!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise UsageError(f"--warmup must be a whole number of recordings >= 0, got {warmup!r}")

    def selected() -> list[Any]:
        from ..models.kinds import get_kind
        from ..tasks import split_names
        from ..tasks.registry import load_task
        from ..tasks.speech import load_speech_file

        if data and tasks:
            raise UsageError("give --data FILE or --tasks, not both")
        if data:
            loaded[:] = [load_speech_file(os.fspath(data), task)]
        else:
            names = split_names(tasks or list(get_kind("transcriber").default_tasks))
            loaded[:] = [load_task("transcribe", n) for n in names]
        start_decoding(loaded[0], limit)  # while the model loads
        return loaded

    def run(transcriber: Any, one: Any, out: str) -> dict[str, Any]:
        at = next(i for i, t in enumerate(loaded) if t is one)
        if at + 1 < len(loaded):  # the next task's audio while this one is transcribed
            start_decoding(loaded[at + 1], limit)
        first = warmup if at == 0 else 0
        return run_transcription(transcriber, one, limit=limit, output_dir=out, warmup=first, normalizer=normalizer)

    def check(resolved: Any, selected: list[Any]) -> None:
        from ..models.transcriber.base import check_can_translate

        if any(t.task == "translate" for t in selected):
            check_can_translate(resolved)

    loaded: list[Any] = []

    return _run_tasks(
        "transcribe",
        model,
        selected,
        run,
        backend=backend,
        output_dir=output_dir,
        kind="transcriber",
        backend_options=("server_decoding", "batch_size", "max_tokens"),
        check=check,
        **{**common, "no_cache": True},  # transcripts are not cached
    )
