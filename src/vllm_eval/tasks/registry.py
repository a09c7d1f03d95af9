"""One registry of the tasks that have runners of their own (not mteb's): multiple choice (``generate``),
labelled texts (``classify``), preference pairs (``reward``) and tagged sentences (``token-classify``).

Each command's tasks are loaded by name (:func:`load_task`) or from a user's file (:func:`load_file`)
through its :class:`Runner`; :func:`own_tasks` and :func:`task_rows` list every named one, offline or
from the hub, for ``vllm-eval tasks``. The tasks themselves are defined next to their runners
(:mod:`~vllm_eval.tasks.generative`, :mod:`~vllm_eval.tasks.classification`,
:mod:`~vllm_eval.tasks.preference`, :mod:`~vllm_eval.tasks.ner`); this module is the one index over them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..utils.errors import UnknownNameError, UsageError


@dataclass(frozen=True)
class OwnTask:
    """A named task with a runner of ours.

    Attributes:
        name: what ``--tasks`` takes.
        command: the ``vllm-eval`` command that runs it.
        kind: the kind of model that runs it (:mod:`vllm_eval.models.kinds`).
        task_type: e.g. ``multiple choice (image)``, ``classification``, ``preference``.
        main_score: the metric reported first.
        source: ``offline`` (packaged data) or the hub dataset id.
        description: one line.
    """

    name: str
    command: str
    kind: str
    task_type: str
    main_score: str
    source: str
    description: str

    @property
    def available(self) -> bool:
        """True when the task can be loaded here (offline data, or a hub dataset reachable or cached)."""
        if self.source == "offline":
            return True
        from ..utils.hub import missing_dataset

        return missing_dataset(self.source, self.name, "") is None


@dataclass(frozen=True)
class Runner:
    """How one command's tasks are listed and loaded."""

    command: str
    tasks: Callable[[], list[OwnTask]]
    load: Callable[[str], Any]
    load_file: Callable[[str], Any]


def _generative() -> list[OwnTask]:
    from .generative import GENERATIVE_TASKS

    return [
        OwnTask(
            t.name, "generate", "generator", f"multiple choice ({t.modality})", "accuracy", "offline", t.description
        )
        for t in GENERATIVE_TASKS.values()
    ]


def _classification() -> list[OwnTask]:
    from .classification import CLASSIFICATION_TASKS

    return [
        OwnTask(name, "classify", "classifier", "classification", "accuracy", "offline", (load.__doc__ or "").strip())
        for name, load in CLASSIFICATION_TASKS.items()
    ]


def _preference() -> list[OwnTask]:
    from .preference import PREFERENCE_TASKS, REWARD_BENCH

    sources = {"RewardBench": REWARD_BENCH[0]}
    return [
        OwnTask(
            name,
            "reward",
            "classifier",
            "preference",
            "accuracy",
            sources.get(name, "offline"),
            (load.__doc__ or "").strip().splitlines()[0],
        )
        for name, load in PREFERENCE_TASKS.items()
    ]


def _speech() -> list[OwnTask]:
    from .speech import ASTERISK_VOICES, LONG_FORM_S, MIN_WORDS
    from .speech_hub import HUB_SPEECH

    return (
        [
            OwnTask(
                f"AsteriskPrompts.{lang}",
                "transcribe",
                "transcriber",
                "transcription",
                "wer",
                "offline",
                f"Asterisk's phone prompts, {lang} ({voice}, 8 kHz), at least {MIN_WORDS} words each "
                "(`make speech-data`)",
            )
            for lang, voice in ASTERISK_VOICES.items()
        ]
        + [
            OwnTask(
                f"AsteriskLongForm.{lang}",
                "transcribe",
                "transcriber",
                "transcription (long-form)",
                "wer",
                "offline",
                f"AsteriskPrompts.{lang} joined into clips of {LONG_FORM_S:g} s or more (`make speech-data`)",
            )  # fmt: skip
            for lang in ASTERISK_VOICES
        ]
        + [
            OwnTask(
                name,
                "transcribe",
                "transcriber",
                f"speech {s.task}",
                "bleu" if s.task == "translate" else "wer",
                s.path,
                s.description,
            )  # fmt: skip
            for name, s in HUB_SPEECH.items()
        ]
    )


def _load_speech(name: str) -> Any:
    from .speech_hub import get_speech_task

    return get_speech_task(name)


def _load_generative(name: str) -> Any:
    from .generative import get_generative_task

    return get_generative_task(name)


def _load_classification(name: str) -> Any:
    from .classification import get_classification_data

    return get_classification_data(name)


def _load_preference(name: str) -> Any:
    from .preference import get_preference_data

    return get_preference_data(name)


def _no_named(command: str) -> Callable[[str], Any]:
    def load(name: str) -> Any:
        raise UsageError(f"`vllm-eval {command}` has no packaged task {name!r}; give --data FILE")

    return load


def _file(module: str, function: str) -> Callable[[str], Any]:
    def load(path: str) -> Any:
        import importlib

        return getattr(importlib.import_module(f"vllm_eval.tasks.{module}"), function)(path)

    return load


#: Every command with a runner of its own, by command name.
RUNNERS: dict[str, Runner] = {
    r.command: r
    for r in (
        Runner(
            "generate",
            _generative,
            _load_generative,
            _file("generative", "load_multiple_choice_file"),
        ),
        Runner(
            "classify",
            _classification,
            _load_classification,
            _file("classification", "load_classification_file"),
        ),
        Runner(
            "reward",
            _preference,
            _load_preference,
            _file("preference", "load_preference_file"),
        ),
        Runner(
            "transcribe",
            _speech,
            _load_speech,
            _file("speech", "load_speech_file"),
        ),
        Runner(
            "token-classify",
            list,
            _no_named("token-classify"),
            _file("ner", "load_ner_file"),
        ),
    )
}


def _runner(command: str) -> Runner:
    try:
        return RUNNERS[command]
    except KeyError:
        close = difflib.get_close_matches(command, list(RUNNERS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownNameError(f"no task runner for command {command!r}{hint}; runners: {', '.join(RUNNERS)}") from None


def own_tasks(command: str | None = None) -> list[OwnTask]:
    """The named tasks of ``command`` (every command's when None), in table order.

    Raises:
        UnknownNameError: a command without a runner of its own.
    """
    runners = [_runner(command)] if command else list(RUNNERS.values())
    return [t for r in runners for t in r.tasks()]


def load_task(command: str, name: str) -> Any:
    """``command``'s task called ``name`` (case-insensitive), as its runner takes it; a hub task's data is
    checked before any model loads.

    Raises:
        UnknownNameError: an unknown name (the known ones listed).
        DataUnavailableError: a hub task while the hub is offline and its dataset is not cached.
    """
    return _runner(command).load(name)


def load_file(command: str, path: str) -> Any:
    """``command``'s task from a user's file (each runner's schema: see :mod:`vllm_eval.tasks.owndata`).

    Raises:
        UsageError: a file that cannot be read or breaks the schema (file, line and reason named).
        DataUnavailableError: no such file.
    """
    return _runner(command).load_file(path)


def task_rows(command: str | None = None) -> list[dict[str, Any]]:
    """JSON-ready rows for ``vllm-eval tasks``: name, kind, command, type, main_score, source, available,
    description."""
    return [
        {
            "name": t.name,
            "kind": t.kind,
            "command": t.command,
            "type": t.task_type,
            "main_score": t.main_score,
            "source": t.source,
            "available": t.available,
            "description": t.description,
        }
        for t in own_tasks(command)
    ]
