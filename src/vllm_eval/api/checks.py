"""Checks that run before any model, engine or task loads: engine options, paths, templates, the model, the cache."""

from __future__ import annotations

import os
from typing import Any

from ..utils.errors import UsageError


def check_engine(engine: dict[str, Any], unlisted: Any = None) -> None:
    """vLLM engine options: sane values, and known names among ``unlisted`` (the ``--name value`` options
    the parser does not list; default: all). The listed flags are ``EngineArgs`` names already, and
    checking a name imports vLLM (8 s on an H100 machine), which a parent of replicas never needs.

    Raises:
        OptionError: an unknown name (close names suggested) or a bad value.
    """
    from ..engine.args import check_engine_kwargs, check_engine_values

    check_engine_values(engine)
    names = engine if unlisted is None else unlisted
    unknown = {k: engine[k] for k in names if k != "head_dtype"}
    if unknown:
        check_engine_kwargs(unknown)


def prepare_output_dir(path: str | None, flag: str = "--output-dir") -> str | None:
    """Create the output directory now, so a bad one fails before any model loads; its absolute path.

    Raises:
        UsageError: it is a file, lies under a file, or cannot be created or written.
    """
    if path is None:
        return None
    if not path.strip():
        raise UsageError(f"{flag} is empty")
    target = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(target) and not os.path.isdir(target):
        raise UsageError(f"{flag} {path!r} is a file, not a directory")
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path!r} cannot be created: {exc.strerror or exc}") from None
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path!r} is not writable")
    return target


def task_output_dirs(output_dir: str | None, command: str, tasks: list[Any]) -> list[str]:
    """Where each task of a command that writes results.json goes, created now: ``--output-dir`` itself
    for one task, ``<--output-dir>/<task>`` for several; default ``results/<command>/<task>``."""
    if output_dir and len(tasks) == 1:
        paths = [output_dir]
    else:
        paths = [os.path.join(output_dir or os.path.join("results", command), t.name) for t in tasks]
    return [prepare_output_dir(p) for p in paths]


def chat_template(value: str | None) -> str | None:
    """``--chat-template``: Jinja text (it contains ``{{`` or ``{%``) or a file that must exist; the text.

    A file is UTF-8 (a byte-order mark is dropped) and must hold Jinja too: a template without ``{{`` or ``{%``
    renders every conversation as the same text, and every score would be the same.

    Raises:
        UsageError: neither a file nor a template; a file that is not UTF-8, empty, or holds no Jinja.
    """
    from ..utils.files import read_text

    if value is None or "{{" in value or "{%" in value:
        return value
    if not os.path.isfile(value):
        raise UsageError(f"--chat-template {value!r} is neither a file nor a Jinja template (no '{{{{' or '{{%')")
    text = read_text(value)
    if "{{" not in text and "{%" not in text:
        what = (
            "is empty" if not text.strip() else "holds no Jinja ('{{' or '{%'): every conversation would render alike"
        )
        raise UsageError(f"--chat-template {value}: the file {what}")
    return text


def resolve_model(model: str | None, remote: bool, what: str = "--model", revision: str | None = None) -> Any:
    """The model resolved once (a ``ModelRef``, handed to the backend), or ``model`` itself for a server.

    Raises:
        ModelNotFoundError: a local model that does not exist.
        DataUnavailableError: a hub id not cached while offline.
        UsageError: no model given where one is needed (``what`` names the option).
    """
    from ..utils.modelinfo import ModelRef

    if remote:
        return model
    if model is None and what != "--model":
        raise UsageError(f"{what} MODEL is required (for a served model it is the served name, optional)")
    return ModelRef.resolve(model, revision)


def check_model_argument(model: Any, what: str = "model") -> Any:
    """``model``, refused where it is neither None, a str nor an ``os.PathLike`` (a path or a hub id), before
    anything loads.

    Raises:
        UsageError: naming ``what`` and the value's type.
    """
    if model is not None and not isinstance(model, str | os.PathLike):
        shown = f"{type(model).__name__} {model!r:.40}"
        raise UsageError(f"{what} must be a model directory or a hub id (a str or a path), got {shown}")
    return model


def require_model(model: str | None, remote: bool) -> None:
    """Raises UsageError when a local backend is given no ``--model`` (a server's is optional)."""
    if not remote and not model:
        raise UsageError("--model is required (for a served model it is the served name, optional)")


def open_cache(cache_dir: str | os.PathLike | None, no_cache: bool) -> Any:
    """The output cache in ``cache_dir`` (a str or path; default :func:`~vllm_eval.models.cache.default_cache_dir`),
    or None with ``no_cache``.

    Raises:
        UsageError: both ``cache_dir`` and ``no_cache``.
    """
    from ..models.cache import OutputCache, default_cache_dir

    if no_cache:
        if cache_dir:
            raise UsageError("give --cache-dir or --no-cache, not both")
        return None
    return OutputCache(os.fspath(cache_dir) if cache_dir else default_cache_dir())


def check_image_tasks(model: Any, tasks: list[Any]) -> None:
    """Refuse image tasks for a local model whose ``config.json`` has no vision tower, before its engine starts
    (spares the engine start). A served model, or one whose config cannot be read, is refused by
    :func:`vllm_eval.evaluation.results.evaluate` once its metadata is known.

    Raises:
        UsageError: names the first image task and the model's architecture.
    """
    import json
    from pathlib import Path

    image_tasks = [t.metadata.name for t in tasks if "image" in (getattr(t.metadata, "modalities", None) or [])]
    path = Path(str(getattr(model, "path", ""))) / "config.json"
    if not image_tasks or not path.is_file():
        return
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if any("vision" in key or key in ("vlm_config", "img_processor") for key in config):  # Phi-3-V, ColPali
        return
    arch = ", ".join(config.get("architectures") or []) or config.get("model_type", "?")
    raise UsageError(
        f"task {image_tasks[0]} needs a model that takes images; {model.path} takes text only ({arch}, no "
        "vision tower in its config.json)"
    )
