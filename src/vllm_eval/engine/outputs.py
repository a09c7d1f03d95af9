"""What vLLM returns or refuses for one engine call: a failed request named by its index, a refusal before a
request runs as a one-line :class:`~vllm_eval.utils.errors.UsageError`.

Used by the jobs a backend or a replica runs (:mod:`vllm_eval.engine.jobs`) and by the backends that run them
(:class:`~vllm_eval.models.vllm_backend.VllmBackend`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..utils.errors import UsageError, VllmEvalError


class RequestFailed(VllmEvalError):
    """vLLM failed on one request of a job: ``index`` within the job's inputs, and vLLM's ``reason``.

    Raised inside jobs (on a replica too: it pickles); :meth:`VllmBackend.run_split` turns it into an
    :class:`~vllm_eval.utils.errors.EngineError` that names the input.
    """

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(index, reason)
        self.index, self.reason = index, reason

    def __str__(self) -> str:
        return f"request {self.index}: {self.reason}"


def first_request_error(outputs: list[Any]) -> tuple[int, str] | None:
    """``(index, vLLM's reason)`` of the first output that carries an error, or None."""
    for i, out in enumerate(outputs):
        error = getattr(out, "error", None)
        if error is not None:
            return i, str(getattr(error, "message", error))
    return None


def check_outputs(outputs: list[Any]) -> list[Any]:
    """``outputs`` of one engine call, or :class:`RequestFailed` for the first one vLLM failed on."""
    failed = first_request_error(outputs)
    if failed is not None:
        raise RequestFailed(*failed)
    return outputs


@contextmanager
def refusals_as_usage_errors(what: str) -> Iterator[None]:
    """Turn vLLM's refusal of a request before it runs (``VLLMValidationError``: a prompt longer than
    ``max_model_len``, an out-of-vocabulary token ...) into a one-line :class:`UsageError` naming ``what``."""
    from vllm.exceptions import VLLMValidationError

    try:
        yield
    except VLLMValidationError as exc:
        raise UsageError(f"vLLM refused {what}: {' '.join(str(exc).split())}") from None
