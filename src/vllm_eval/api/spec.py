"""One backend of a command, resolved once: its class, what it can do, and the options that reach it.

Options reach a backend by what it accepts. Most are read off its constructor's signature (an option
the chosen backend has no parameter for is a one-line error naming the backends that take it); a few
go by declared capability whatever the signature says:

* ``remote`` (the class talks to servers, :class:`~vllm_eval.models.http.RemoteBackend`): endpoints and
  transport, and the options only a server needs (``--encoding-format``, ``--api``, ``--labels``,
  ``--tokenizer``);
* ``engine`` (the class runs a vLLM engine here: ``engine_options is None``): replicas, and every vLLM
  ``EngineArgs`` name;
* ``reference`` (everything else: sentence-transformers, transformers): a torch ``--device``, and
  only the engine options listed in the class's ``engine_options``.

No backend name is written here: names come from the backend table (:mod:`vllm_eval.models.backends`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from ..utils.errors import UsageError

#: Options that follow a capability, not the signature (see the module docstring).
CAPABILITY_OPTIONS: dict[str, str] = {
    "endpoint": "remote",
    "api_key": "remote",
    "max_concurrency": "remote",
    "encoding_format": "remote",
    "api": "remote",
    "labels": "remote",
    "tokenizer": "remote",
    "remote_batch_size": "remote",
    "data_parallel_size": "engine",
    "replicas_per_gpu": "engine",
    "ray_address": "engine",
    "device": "reference",
}
#: The capability options that configure the transport (:class:`~vllm_eval.models.http.HttpOptions`), not the class.
HTTP_OPTIONS = ("endpoint", "api_key", "max_concurrency", "remote_batch_size")


def flag(dest: str) -> str:
    """``data_parallel_size`` -> ``--data-parallel-size``."""
    return "--" + dest.replace("_", "-")


def capability(kind: str, backend: str) -> str:
    """``remote``, ``engine`` or ``reference``: what ``(kind, backend)`` is (see the module docstring).

    Raises:
        UnknownNameError: an unknown kind or backend.
    """
    from ..models.backends import engine_options, is_remote

    if is_remote(kind, backend):
        return "remote"
    return "engine" if engine_options(kind, backend) is None else "reference"


def _parameters(cls: type) -> tuple[frozenset[str], bool]:
    params = inspect.signature(cls).parameters.values()
    named = frozenset(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def accepts(cls: type, name: str) -> bool:
    """Whether ``cls``'s constructor takes option ``name``: a parameter of that name, or ``**kwargs``
    of a class that runs no vLLM engine (an engine class's ``**kwargs`` are ``EngineArgs``)."""
    named, var_kw = _parameters(cls)
    return name in named or (var_kw and cls.engine_options is not None)


def _names(capable: str) -> list[str]:
    """Backend names of one capability over every kind, in table order."""
    from ..models.backends import BACKENDS

    return list(dict.fromkeys(n for k, n in BACKENDS if capability(k, n) == capable))


def _refuse(dest: str, capable: str, named: str) -> UsageError:
    if capable == "remote":
        return UsageError(f"{flag(dest)} is for --backend {' / '.join(_names('remote'))} (a served model), not {named}")
    if capable == "engine":
        return UsageError(
            f"--data-parallel-size / --replicas-per-gpu need --backend {' / '.join(_names('engine'))} "
            "(for servers, pass one --endpoint per replica)"
        )
    return UsageError(
        f"{flag(dest)} is for a reference backend ({', '.join(_names('reference'))}: a torch device), not {named}"
    )


@dataclass
class BackendSpec:
    """One backend of a command: ``kind``, table ``name``, ``cls``, its capability, and what reaches it.

    Attributes:
        options: constructor keywords the user set (checked: the class takes each).
        engine: vLLM ``EngineArgs`` (every one for an engine class, the class's own few for a reference).
        http: the endpoints and transport of a remote backend, else None.
    """

    kind: str
    name: str
    cls: type
    capability: str
    options: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    http: Any = None

    @property
    def remote(self) -> bool:
        """True when the backend talks to servers."""
        return self.capability == "remote"

    @property
    def runs_engine(self) -> bool:
        """True when the backend starts vLLM engines in this process (or its replicas)."""
        return self.capability == "engine"

    def takes(self, name: str) -> bool:
        """Whether the backend's constructor takes ``name``."""
        return accepts(self.cls, name)

    def load(self, model: Any, **internal: Any) -> Any:
        """Build the backend for ``model`` with the user's options, its engine options, and those of
        ``internal`` (settings the command derives, such as ``show_progress_bar``) the class takes.

        Raises:
            Whatever the class raises (see :func:`vllm_eval.models.backends.load_backend`).
        """
        from ..models.backends import load_backend

        quiet = {k: v for k, v in internal.items() if self.takes(k)}
        return load_backend(self.kind, self.name, model, http=self.http, **{**quiet, **self.options, **self.engine})


def _not_taken(kind: str, backend: str, dest: str) -> UsageError:
    """The error for an option ``backend`` does not take: the backends of ``kind`` that do, or that none does."""
    from ..models.backends import backend_class, backend_names

    others = [n for n in backend_names(kind) if accepts(backend_class(kind, n), dest)]
    if not others:
        return UsageError(f"{flag(dest)} is not an option of a {kind} (no backend of it takes it)")
    return UsageError(f"{flag(dest)} needs --backend {' or '.join(others)}, not {backend}")


def resolve_spec(
    kind: str,
    backend: str,
    options: dict[str, Any],
    engine: dict[str, Any],
    *,
    http_batch_size: int | None = None,
) -> BackendSpec:
    """The :class:`BackendSpec` of ``(kind, backend)`` for the options the user set (None values ignored).

    Raises:
        UsageError: an option the backend does not take (named, with the backends that do), engine
            options a reference or remote backend cannot take, a remote backend without ``--endpoint``.
        UnknownNameError: an unknown backend of ``kind``.
    """
    from ..models.backends import backend_class

    cls = backend_class(kind, backend)
    spec = BackendSpec(kind, backend, cls, capability(kind, backend))
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    for dest, value in given.items():
        capable = CAPABILITY_OPTIONS.get(dest)
        if capable is not None:
            if capable != spec.capability:
                raise _refuse(dest, capable, backend)
        elif not spec.takes(dest):
            raise _not_taken(kind, backend, dest)
        if dest not in HTTP_OPTIONS:
            spec.options[dest] = value
    if spec.remote:
        if not given.get("endpoint"):
            raise UsageError(f"--backend {backend} needs at least one --endpoint URL")
        from ..models.http import HttpOptions

        http: dict[str, Any] = {"api_key": given.get("api_key")}
        for key, value in (("max_concurrency", given.get("max_concurrency")), ("batch_size", http_batch_size)):
            if value is not None:
                http[key] = value
        spec.http = HttpOptions(tuple(given["endpoint"]), **http)
    takes = cls.engine_options
    if takes is None:
        spec.engine = engine
    else:
        unused = sorted(set(engine) - set(takes) - {"use_tqdm_on_load"})
        if unused:
            raise UsageError(
                f"--backend {backend} does not take vLLM engine options: {', '.join(flag(u) for u in unused)}"
            )
        spec.engine = {k: v for k, v in engine.items() if k in takes}
    return spec


def check_multi(
    kind: str,
    backends: list[str],
    options: dict[str, Any],
    peers: dict[str, str] | None = None,
) -> None:
    """Checks for a command that runs several backends (``bench``, ``compare``): a capability option needs
    one backend of that capability among them; a remote one needs ``--endpoint``. ``peers``: the capability of
    names outside the backend table (the bench's ``mteb-vllm``). Engine options go to the
    engine backends only, so they are not refused here.

    Raises:
        UsageError: as :func:`resolve_spec`, for the set of backends.
    """
    caps = {b: (peers or {}).get(b) or capability(kind, b) for b in backends}
    named = " ".join(backends)
    for dest, value in options.items():
        capable = CAPABILITY_OPTIONS.get(dest)
        if value is None or capable is None:
            continue
        if capable not in caps.values():
            raise _refuse(dest, capable, named)
    for b, cap in caps.items():
        if cap == "remote" and not options.get("endpoint"):
            raise UsageError(f"--backends {b} needs at least one --endpoint URL")
