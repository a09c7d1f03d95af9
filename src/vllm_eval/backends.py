"""The backend table: (kind, backend name) -> class, the one place that decides which class runs.

The CLI's ``--backend`` choices, ``bench``, the two-stage reranking and the first-stage loader all
read :data:`BACKENDS`. Entries are ``"module:Class"`` strings imported on first use (as
lm-evaluation-harness's ``MODEL_MAPPING``), so listing them imports neither vLLM nor torch.

Adding a backend is one file and one line: write the class (a subclass of the kind's base,
:class:`~vllm_eval.encoder.base.EncoderBase`, :class:`~vllm_eval.reranker.base.RerankerBase` or
:class:`~vllm_eval.generator.base.GeneratorBase`; for a server, also of
:class:`~vllm_eval.http.RemoteBackend`), then add ``("encoder", "tei"): "my_pkg.tei:TeiEncoder"``
here. Remote classes take an :class:`~vllm_eval.http.HttpOptions` as their first argument, the
others the model. A class declares which vLLM engine options it takes in its ``engine_options``
class attribute (None: all of them).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, ClassVar

from .engine import Resource
from .errors import OptionError, UnknownNameError, UsageError

#: Kinds of model, each with one base class (in the package of the same name).
KINDS = ("encoder", "reranker", "generator")

BACKENDS: dict[tuple[str, str], str] = {
    ("encoder", "vllm"): "vllm_eval.encoder.vllm:VllmEncoder",
    ("encoder", "st"): "vllm_eval.encoder.st:SentenceTransformerEncoder",
    ("encoder", "remote"): "vllm_eval.encoder.remote:RemoteEncoder",
    ("reranker", "vllm"): "vllm_eval.reranker.vllm:VllmReranker",
    ("reranker", "st"): "vllm_eval.reranker.st:SentenceTransformerReranker",
    ("reranker", "remote"): "vllm_eval.reranker.remote:RemoteReranker",
    ("generator", "vllm"): "vllm_eval.generator.vllm:VllmGenerator",
    ("generator", "remote"): "vllm_eval.generator.remote:RemoteGenerator",
}


def backend_names(kind: str) -> list[str]:
    """The backend names of ``kind``, in table order (the CLI's ``--backend`` choices).

    Raises:
        UnknownNameError: an unknown kind.
    """
    if kind not in KINDS:
        raise UnknownNameError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
    return [name for k, name in BACKENDS if k == kind]


def backend_class(kind: str, backend: str) -> type:
    """The class registered for ``(kind, backend)``, imported now.

    Raises:
        UnknownNameError: an unknown kind or backend (close names suggested).
    """
    names = backend_names(kind)
    if (kind, backend) not in BACKENDS:
        close = difflib.get_close_matches(str(backend), names, n=2, cutoff=0.5)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise UnknownNameError(f"unknown {kind} backend {backend!r}{hint}; choose from {', '.join(names)}")
    module, _, cls = BACKENDS[(kind, backend)].partition(":")
    return getattr(importlib.import_module(module), cls)


def is_remote(kind: str, backend: str) -> bool:
    """True when ``(kind, backend)`` talks to servers (it takes :class:`~vllm_eval.http.HttpOptions`).

    Raises:
        UnknownNameError: an unknown kind or backend.
    """
    from .http import RemoteBackend

    return issubclass(backend_class(kind, backend), RemoteBackend)


def engine_options(kind: str, backend: str) -> frozenset[str] | None:
    """The vLLM ``EngineArgs`` names ``(kind, backend)`` accepts: None for all of them (it runs a vLLM
    engine), else the few it maps to its own settings (empty for a server, configured when started).

    Raises:
        UnknownNameError: an unknown kind or backend.
    """
    return backend_class(kind, backend).engine_options


def load_backend(kind: str, backend: str, model: Any = None, *, http: Any = None, **kwargs: Any) -> Any:
    """Build the ``(kind, backend)`` class for ``model`` with ``kwargs``.

    ``http`` (an :class:`~vllm_eval.http.HttpOptions`) is required by remote backends and refused
    by the others; for them ``model`` is the served name (None: the server's).

    Raises:
        UnknownNameError: an unknown kind or backend.
        UsageError: ``http`` missing for a remote backend, or given to another.
        OptionError: a keyword the class does not take.
        Whatever the class raises for its arguments (see its docstring).
    """
    cls = backend_class(kind, backend)
    if is_remote(kind, backend):
        if http is None:
            raise UsageError(f"the {backend} {kind} backend needs endpoints (--endpoint URL)")
        args: tuple[Any, ...] = (http, model)
    elif http is not None:
        raise UsageError(f"endpoints are for the remote backend, not {backend!r}")
    else:
        args = (model,)
    try:  # an option the class does not take is the user's error, found before anything loads
        inspect.signature(cls).bind(*args, **kwargs)
    except TypeError as exc:
        raise OptionError(f"the {backend} {kind} backend does not take that option: {exc}") from None
    return cls(*args, **kwargs)


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
