"""``vllm_eval.classify``, ``reward`` and ``token_classify``: the classifier kinds on labelled data, from Python.

Each runs its tasks (packaged ones, or your own file) through one backend and writes ``results.json`` and
``samples.jsonl`` per task, as ``vllm-eval classify`` / ``reward`` / ``token-classify`` do (those commands parse
their flags and call these). Keywords keep the flags' names; ``**options`` takes backend options and vLLM
``EngineArgs`` (``dtype=``, ``max_model_len=`` ...), checked before anything loads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import UsageError
from .checks import chat_template as read_chat_template
from .checks import check_model_argument, open_cache, require_model, resolve_model, task_output_dirs
from .command_sweep import sweepable
from .session import prepare, split_options


@dataclass
class TaskResults:
    """What :func:`classify`, :func:`reward` and :func:`token_classify` return.

    Attributes:
        results: one dict per task, in order: ``task`` (its name), ``output_dir`` (where ``results.json`` and
            ``samples.jsonl`` went), ``metrics`` (the task's metrics, as in ``results.json``), ``seconds``, and
            the rest of what the task's runner reports.
        model_name: the backend's model name.
        backend: the backend's table name.
        cache: the output cache (closed; ``cache.stats`` has its hits and misses), None with ``no_cache``.
    """

    results: list[dict[str, Any]]
    model_name: str
    backend: str
    cache: Any = None


@sweepable("classify")
def classify(
    model: str | os.PathLike | None,
    tasks: list[str] | str | None = None,
    *,
    data: str | os.PathLike | None = None,
    limit: int | None = None,
    backend: str = "vllm",
    output_dir: str | os.PathLike | None = None,
    **common: Any,
) -> TaskResults:
    """A sequence classifier (``*ForSequenceClassification``) on labelled texts: accuracy, macro-F1, per-class
    precision/recall/F1 and log-loss per task.

    Args:
        model: a model directory or hub id; for a served model the served name (optional).
        tasks: packaged task names (default ``PangLeePolarity``), or ``data``: your own ``.jsonl``/``.csv``/
            ``.parquet`` file with text and label fields.
        limit: the first N texts only.
        backend: ``vllm`` (default), ``hf`` (transformers, the reference), ``remote``.
        output_dir: ``<output_dir>`` for one task, ``<output_dir>/<task>`` for several; default
            ``results/classify/<task>``.
        **common: ``cache_dir``, ``no_cache``, ``show_progress``, ``verbose``, ``started``, backend options
            (``labels``, ``endpoint`` ...) and vLLM ``EngineArgs``, as :func:`vllm_eval.evaluate` takes them.

    Returns:
        A :class:`TaskResults`.

    Raises:
        UsageError: both ``tasks`` and ``data``, no model for a local backend, a bad option; a bad file (named
            with its line).
        DataUnavailableError: a hub task offline and not cached.
        EngineError, EndpointError: a failure while running.
    """
    check_model_argument(model)
    from ..tasks.classification import run_classification

    return _run_tasks(
        "classify",
        model,
        lambda: command_tasks("classify", tasks, data),
        lambda scorer, task, out: run_classification(scorer, task, limit=limit, output_dir=out),
        backend=backend,
        output_dir=output_dir,
        backend_options=("labels",),
        **common,
    )


@sweepable("reward")
def reward(
    model: str | os.PathLike,
    tasks: list[str] | str | None = None,
    *,
    data: str | os.PathLike | None = None,
    limit: int | None = None,
    chat_template: str | None = None,
    backend: str = "vllm",
    output_dir: str | os.PathLike | None = None,
    **common: Any,
) -> TaskResults:
    """A reward model on preference pairs: RewardBench's pairwise accuracy (chosen > rejected; ties lose), per
    subset, and the reward margins. Each pair is rendered as a user and an assistant turn through the model's chat
    template here (so served models cannot take part) and scored raw, without the head's activation.

    Args:
        model: a model directory or hub id.
        tasks: ``RewardBench`` (needs the hub or its cache), or ``data``: your own pairs (``prompt``, ``chosen``,
            ``rejected``).
        limit: the first N pairs only.
        chat_template: a template file, or the Jinja text itself (default: the model's).
        backend: ``vllm`` (default) or ``hf``.
        output_dir: as :func:`classify` (default ``results/reward/<task>``).
        **common: as :func:`classify`.

    Returns:
        A :class:`TaskResults`.

    Raises:
        UsageError: as :func:`classify`; a chat template that is neither a file nor a template.
    """
    check_model_argument(model)
    from ..tasks.preference import run_reward
    from .spec import capability

    if capability("classifier", backend) == "remote":
        raise UsageError(f"reward renders each pair's chat template here: a served model (--backend {backend}) cannot")
    template = read_chat_template(chat_template)
    # The raw score, on the chat-rendered text as is (the template carries the special tokens).
    internal = {"use_activation": False, "add_special_tokens": False, "labels": ["reward"]}
    return _run_tasks(
        "reward",
        model,
        lambda: command_tasks("reward", tasks, data),
        lambda scorer, task, out: run_reward(scorer, task, limit=limit, output_dir=out, chat_template=template),
        backend=backend,
        output_dir=output_dir,
        kind="classifier",
        internal=internal,
        **common,
    )


@sweepable("token_classify")
def token_classify(
    model: str | os.PathLike | None,
    data: str | os.PathLike,
    *,
    limit: int | None = None,
    backend: str = "vllm",
    output_dir: str | os.PathLike | None = None,
    **common: Any,
) -> TaskResults:
    """A token classifier (``*ForTokenClassification``, e.g. NER) on tagged sentences: seqeval's entity-level
    precision/recall/F1 (conlleval and strict IOB2) and token accuracy. Each word takes its first sub-token's label.

    Args:
        model: a model directory or hub id; for a served model the served name (optional).
        data: a CoNLL file (``.conll``/``.txt``) or ``.jsonl``/``.csv``/``.parquet`` with tokens and tags.
        limit: the first N sentences only.
        backend: ``vllm`` (default), ``hf``, ``remote`` (``tokenizer=`` names the served model's tokenizer).
        output_dir: default ``results/token-classify/<data file name>``.
        **common: as :func:`classify`.

    Returns:
        A :class:`TaskResults` of one task.

    Raises:
        UsageError: as :func:`classify`.
    """
    check_model_argument(model)
    from ..tasks.ner import run_token_classification
    from ..tasks.registry import load_file

    return _run_tasks(
        "token-classify",
        model,
        lambda: [load_file("token-classify", os.fspath(data))],
        lambda scorer, task, out: run_token_classification(scorer, task, limit=limit, output_dir=out),
        backend=backend,
        output_dir=output_dir,
        kind="token_classifier",
        backend_options=("tokenizer",),
        **common,
    )


def command_tasks(command: str, names: list[str] | str | None, data: str | os.PathLike | None) -> list[Any]:
    """A classifier command's tasks: ``data`` (a file) or the named tasks (default: the kind's).

    Raises:
        UsageError: both given; an unknown name; a bad file (named with its line).
        DataUnavailableError: a hub task offline and not cached.
    """
    from ..models.kinds import get_kind
    from ..tasks import split_names
    from ..tasks.registry import load_file, load_task, own_tasks

    if data and names:
        raise UsageError("give --data FILE or --tasks, not both")
    if data:
        return [load_file(command, os.fspath(data))]
    default = get_kind("classifier").default_tasks if command == "classify" else [t.name for t in own_tasks(command)]
    return [load_task(command, n) for n in split_names(names or list(default))]


def _run_tasks(
    command: str,
    model: Any,
    tasks: Callable[[], list[Any]],
    runner: Callable[[Any, Any, str], dict[str, Any]],
    *,
    backend: str,
    output_dir: str | os.PathLike | None,
    kind: str = "classifier",
    backend_options: tuple[str, ...] = (),
    internal: dict[str, Any] | None = None,
    check: Callable[[Any, list[Any]], None] | None = None,
    cache_dir: str | os.PathLike | None = None,
    no_cache: bool = False,
    show_progress: bool = True,
    verbose: bool = False,
    started: float | None = None,
    **options: Any,
) -> TaskResults:
    """The three commands' common course: checks, tasks, the model, output folders, cache, backend, each task.
    ``check(resolved model, tasks)``: the command's own refusals, before the backend loads."""
    given, engine = split_options(options, backend_options)
    out_dir = None if output_dir is None else os.fspath(output_dir)
    session = prepare(kind, [backend], given, engine, output_dir=out_dir, verbose=verbose, started=started)
    spec = session.spec
    model = None if model is None else os.fspath(model)
    require_model(model, spec.remote)
    selected = tasks()
    resolved = resolve_model(model, spec.remote)
    if check is not None:
        check(resolved, selected)
    outputs = task_output_dirs(session.output_dir, command, selected)
    cache = open_cache(cache_dir, no_cache)
    try:
        with spec.load(resolved, show_progress_bar=show_progress, **(internal or {})) as scorer:
            scorer.use_cache(cache)
            results = [
                {"task": task.name, "output_dir": Path(out), **runner(scorer, task, out)}
                for task, out in zip(selected, outputs, strict=True)
            ]
            name = scorer.name
    finally:
        if cache is not None:
            cache.close()
    return TaskResults(results, name, spec.name, cache)
