"""The package's own error types: one base, so a caller (and the CLI) can tell them from bugs.

Every error vllm-eval raises on purpose derives from :class:`VllmEvalError` and carries a
one-line message that names the culprit (the option, file, input, endpoint or replica) and, where
there is one, the fix. The CLI prints that line and exits 2 (:class:`UsageError` and its kin,
found before any engine starts) or 1 (a failure while running). Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations


class VllmEvalError(Exception):
    """Base of every error vllm-eval raises on purpose; the message is one line for the user."""

    #: Exit code of the CLI for this error: 2 for bad input, 1 for a failure while running.
    exit_code: int = 1


class UsageError(VllmEvalError, ValueError):
    """Bad input found before any model or engine loads: an option, a path, a task name, a URL.

    Also a ``ValueError`` so library callers that catch that keep working.
    """

    exit_code = 2


class OptionError(UsageError, TypeError):
    """An option or input of the wrong name or type (an unknown engine option, a non-str text)."""


class ModelNotFoundError(UsageError, FileNotFoundError):
    """A model path that does not exist or is not a model directory."""


class UnknownNameError(UsageError, KeyError):
    """An unknown task, backend or preset name; the message lists close names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class DataUnavailableError(UsageError):
    """A task's or model's files are neither local nor reachable (offline); names the task and dataset."""


class EngineError(VllmEvalError, RuntimeError):
    """vLLM could not build an engine, or failed on an input; the message names the model and vLLM's reason."""


class ReplicaError(VllmEvalError, RuntimeError):
    """A replica failed to start, died, or failed a job (the message names the replica and why)."""


class EndpointError(VllmEvalError, RuntimeError):
    """No endpoint could serve a request, a server refused an input, or its reply was malformed
    (the message names the endpoint or the input)."""


class MissingAnswersError(VllmEvalError, RuntimeError):
    """More outputs than the missing budget allows had no parsable answer (results were still written)."""
