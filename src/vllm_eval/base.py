"""What every backend of every kind has in common; the kinds' own bases (``encoder/base.py``,
``reranker/base.py``, ``generator/base.py``) build on these."""

from __future__ import annotations

from typing import Any, ClassVar

from .engine import Resource
from .errors import UsageError


class BackendBase(Resource):
    """What every backend of every kind has: the model it runs, its chunking and progress, its capabilities.

    Args:
        model: the resolved model path, hub id or served name (recorded in results).
        chunk_size: inputs handed to the backend per step.
        show_progress_bar: show a progress bar over each call's inputs.

    Raises:
        UsageError: ``chunk_size`` is not a positive integer.
    """

    #: vLLM ``EngineArgs`` names the backend takes: None for all (it runs a vLLM engine); a server takes none.
    engine_options: ClassVar[frozenset[str] | None] = frozenset()

    def __init__(self, *, model: str, chunk_size: int, show_progress_bar: bool = True) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise UsageError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.model = model
        self.chunk_size = chunk_size
        self.show_progress_bar = show_progress_bar


class PoolingBackendBase(BackendBase):
    """Base of the pooling kinds (encoder, reranker): mteb metadata, prompts, token limit, tokenizer.

    Args:
        meta: mteb ``ModelMeta`` (names the result folder; ``name`` is taken from it).
        prompting: the task prompts (see :func:`vllm_eval.prompts.resolve_prompting`).
        max_length: token limit including special tokens (None: unknown, e.g. a server that does not say).
        tokenizer: required when the class declares :attr:`tokenizes_locally`, ignored otherwise.
        model, chunk_size, show_progress_bar: see :class:`BackendBase`.

    Raises:
        UsageError: a bad ``chunk_size``, or no tokenizer for a backend that tokenizes locally.
    """

    #: The backend tokenizes here, so truncation is counted locally (and a reranker's template
    #: document is cut to fit); False when the server tokenizes and truncates (remote backends).
    tokenizes_locally: ClassVar[bool] = True

    def __init__(
        self,
        *,
        model: str,
        meta: Any,
        prompting: Any,
        max_length: int | None,
        tokenizer: Any = None,
        chunk_size: int,
        show_progress_bar: bool = True,
    ) -> None:
        super().__init__(model=model, chunk_size=chunk_size, show_progress_bar=show_progress_bar)
        if self.tokenizes_locally and tokenizer is None:
            raise UsageError(f"{type(self).__name__} tokenizes locally and needs a tokenizer")
        self.mteb_model_meta = meta
        self.name = meta.name
        self.prompting = prompting
        self.max_length = max_length
        self.tokenizer = tokenizer if self.tokenizes_locally else None
