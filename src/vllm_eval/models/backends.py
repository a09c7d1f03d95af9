"""The backend table: (kind, backend name) -> class, the one place that decides which class runs.

The CLI's ``--backend`` choices, ``bench``, the two-stage reranking and the first-stage loader all
read :data:`BACKENDS`. Entries are ``"module:Class"`` strings imported on first use (as
lm-evaluation-harness's ``MODEL_MAPPING``), so listing them imports neither vLLM nor torch.

Adding a backend is one file and one line: write the class (a subclass of the kind's base,
:class:`~vllm_eval.models.encoder.base.EncoderBase`, :class:`~vllm_eval.models.reranker.base.RerankerBase` or
:class:`~vllm_eval.models.generator.base.GeneratorBase`; for a server, also of
:class:`~vllm_eval.models.http.RemoteBackend`), then add ``("encoder", "tei"): "my_pkg.tei:TeiEncoder"``
here. Remote classes take an :class:`~vllm_eval.models.http.HttpOptions` as their first argument, the
others the model. A class declares which vLLM engine options it takes in its ``engine_options``
class attribute (None: all of them).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any

from ..utils.errors import OptionError, UnknownNameError, UsageError
from .kinds import KINDS as _KINDS

#: Kinds of model, each with one base class (in the package of the same name); see :mod:`vllm_eval.models.kinds`.
KINDS = tuple(_KINDS)

#: The backend a command runs when ``--backend`` is not given.
DEFAULT_BACKEND = "vllm"

BACKENDS: dict[tuple[str, str], str] = {
    ("encoder", "vllm"): "vllm_eval.models.encoder.vllm:VllmEncoder",
    ("encoder", "st"): "vllm_eval.models.encoder.st:SentenceTransformerEncoder",
    ("encoder", "hf"): "vllm_eval.models.encoder.hf:TransformersEncoder",
    ("encoder", "remote"): "vllm_eval.models.encoder.remote:RemoteEncoder",
    ("reranker", "vllm"): "vllm_eval.models.reranker.vllm:VllmReranker",
    ("reranker", "st"): "vllm_eval.models.reranker.st:SentenceTransformerReranker",
    ("reranker", "remote"): "vllm_eval.models.reranker.remote:RemoteReranker",
    ("generator", "vllm"): "vllm_eval.models.generator.vllm:VllmGenerator",
    ("generator", "hf"): "vllm_eval.models.generator.hf:TransformersGenerator",
    ("generator", "remote"): "vllm_eval.models.generator.remote:RemoteGenerator",
    ("classifier", "vllm"): "vllm_eval.models.classifier.vllm:VllmClassifier",
    ("classifier", "hf"): "vllm_eval.models.classifier.hf:TransformersClassifier",
    ("transcriber", "vllm"): "vllm_eval.models.transcriber.vllm:VllmTranscriber",
    ("transcriber", "hf"): "vllm_eval.models.transcriber.hf:TransformersTranscriber",
    ("transcriber", "remote"): "vllm_eval.models.transcriber.remote:RemoteTranscriber",
    ("classifier", "remote"): "vllm_eval.models.classifier.remote:RemoteClassifier",
    ("token_classifier", "vllm"): "vllm_eval.models.token_classifier.vllm:VllmTokenClassifier",
    ("token_classifier", "hf"): "vllm_eval.models.token_classifier.hf:TransformersTokenClassifier",
    ("token_classifier", "remote"): "vllm_eval.models.token_classifier.remote:RemoteTokenClassifier",
    ("token_embedder", "vllm"): "vllm_eval.models.token_embedder.vllm:VllmTokenEmbedder",
    ("token_embedder", "hf"): "vllm_eval.models.token_embedder.hf:TransformersTokenEmbedder",
    ("token_embedder", "remote"): "vllm_eval.models.token_embedder.remote:RemoteTokenEmbedder",
    ("sparse_encoder", "vllm"): "vllm_eval.models.sparse_encoder.vllm:VllmSparseEncoder",
    ("sparse_encoder", "st"): "vllm_eval.models.sparse_encoder.st:SentenceTransformerSparseEncoder",
    ("sparse_encoder", "hf"): "vllm_eval.models.sparse_encoder.hf:TransformersBgeM3",
}

#: The backend names that talk to servers, for callers that must not import the classes (the command line's
#: parsers: importing every backend imports mteb). The classes say so themselves (:func:`is_remote`); a test keeps
#: the two the same.
SERVED_BACKENDS = frozenset({"remote"})

#: One line per backend name for ``--help`` (a backend without one is listed by name).
BACKEND_NOTES: dict[str, str] = {
    "vllm": "in-process vLLM engine(s)",
    "st": "sentence-transformers (the reference)",
    "hf": "transformers (the reference)",
    "remote": "running `vllm serve` instances (--endpoint)",
}


def describe_backends(names: list[str]) -> str:
    """``--backend`` help: each name with its note."""
    return "; ".join(f"{n}: {BACKEND_NOTES[n]}" if n in BACKEND_NOTES else n for n in names)


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
    """True when ``(kind, backend)`` talks to servers (it takes :class:`~vllm_eval.models.http.HttpOptions`).

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

    ``http`` (an :class:`~vllm_eval.models.http.HttpOptions`) is required by remote backends and refused
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
