"""Terminal and log-file output of a command: quiet by default, everything in the log file.

The terminal gets the progress display, our own warnings (each once, one line, no source line),
errors and the results. vLLM's INFO lines, third-party warnings and the C++ warnings of torch go
to ``<output-dir>/vllm-eval.log`` (with ``--verbose``, to the terminal too). vLLM's engine-core
processes write to the same file: they are configured through ``VLLM_LOGGING_CONFIG_PATH``, a
logging config this module writes, which vLLM applies in every process it starts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from .progress import echo

#: Name of the log file written into a run's output directory.
LOG_FILE = "vllm-eval.log"
_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
#: Logger whose records go to the log file only (the command line, for the record).
_FILE_ONLY = "vllm_eval.run"


class _Once(logging.Filter):
    """Pass each distinct message once (a warning repeated per task or per chunk says nothing new)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.getMessage()}"
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class _EchoHandler(logging.Handler):
    """Console lines through the progress display: ``vllm-eval: warning: ...``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = " ".join(record.getMessage().split())
            echo(f"vllm-eval: {record.levelname.lower()}: {message}")
        except Exception:  # logging must never raise
            self.handleError(record)


#: ``(verbose, output_dir)`` of this process's :func:`configure`, for processes of ours to log alike.
_SETTINGS: list[tuple[bool, str | None]] = []


def settings() -> tuple[bool, str | None] | None:
    """What :func:`configure` was called with in this process, or None (a library caller's own logging)."""
    return _SETTINGS[-1] if _SETTINGS else None


def configure(verbose: bool, output_dir: str | os.PathLike | None, *, child: bool = False) -> Path | None:
    """Set up this process's (and its vLLM children's) logging and warnings; returns the log file, if any.
    ``child``: a process of ours logging as the command that started it (the command line is not recorded again).

    Call it before vLLM is imported: some of what it sets is read once, at import.
    """
    _SETTINGS.append((verbose, str(output_dir) if output_dir else None))
    level = "INFO" if verbose else "ERROR"
    preset_environment(verbose)
    log_file = Path(output_dir) / LOG_FILE if output_dir else None
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = _EchoHandler(logging.INFO)
    console.addFilter(_Once())
    console.addFilter(lambda r: r.name != _FILE_ONLY)
    if not verbose:
        console.addFilter(lambda r: r.levelno >= _quiet_level(r.name))
        _quiet_datasets()
    root.handlers = [console]
    handlers: dict[str, Any] = {
        "console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "plain",
            "level": level,
        }
    }
    if log_file is not None:
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setFormatter(logging.Formatter(_FORMAT))
        file_handler.setLevel(logging.DEBUG)
        root.addHandler(file_handler)
        handlers["file"] = {
            "class": "logging.FileHandler",
            "filename": str(log_file),
            "formatter": "plain",
            "level": "DEBUG",
            "encoding": "utf-8",
        }
        if not child:
            logging.getLogger(_FILE_ONLY).info("command: %s", " ".join(sys.argv))
    warnings.showwarning = _make_showwarning(verbose)
    if child:  # starts no vLLM
        return log_file
    # vLLM's own logger: its handlers come from this config in every process it starts.
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": _FORMAT}},
        "handlers": handlers,
        "loggers": {"vllm": {"handlers": list(handlers), "level": "DEBUG" if log_file else level, "propagate": False}},
    }
    fd, path = tempfile.mkstemp(prefix="vllm-eval-logging-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(config, fh)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    return log_file


def preset_environment(verbose: bool) -> None:
    """The variables processes started from here read once, at their start or at an import (vLLM's log level,
    torch's C++ log level, Python's warning filters), unless the user set them. :func:`configure` sets them;
    so does the start of replicas ahead of it (:mod:`vllm_eval.replicas.ahead`)."""
    level = "INFO" if verbose else "ERROR"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", level)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", level)
    if not verbose:
        # Child processes (vLLM's engine core) print torch's deprecation warnings at import.
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning")


def _make_showwarning(verbose: bool):
    seen: set[str] = set()
    log = logging.getLogger("vllm_eval.warnings")

    def showwarning(
        message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        text = " ".join(str(message).split())
        log.debug("%s (%s:%s): %s", category.__name__, filename, lineno, text)
        ours = str(filename).startswith(_PACKAGE_DIR)
        if (ours or verbose) and text not in seen:
            seen.add(text)
            echo(f"vllm-eval: warning: {text}")

    return showwarning


def _quiet_level(logger: str) -> int:
    """Lowest level shown in the terminal without ``--verbose``: ours from INFO (an engine starting,
    a system prompt merged), vLLM's from ERROR, everyone else's from WARNING."""
    if logger.startswith("vllm_eval"):
        return logging.INFO
    return logging.ERROR if logger.startswith("vllm") else logging.WARNING


def _quiet_datasets() -> None:
    """No ``datasets`` or ``transformers`` progress bars (mteb maps corpora through the one, the other
    shows weight loading). They are imported by now, so their environment variables would come too late."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def silence_early_vllm_logs() -> None:
    """Drop what vLLM logs before it configures its logger (e.g. "Triton is installed, but doesn't
    include CPU backend"), which Python would otherwise print bare on standard error.

    A ``NullHandler`` on the ``vllm`` logger only stops Python's last-resort printing; vLLM replaces
    it with its configured handlers, and records still propagate to ours. Spawned engine processes
    import the CLI module too, so this runs there as well.
    """
    logging.getLogger("vllm").addHandler(logging.NullHandler())
