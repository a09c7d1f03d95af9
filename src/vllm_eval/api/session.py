"""The checks every library call that loads a model shares, before any model, engine or task loads.

A call names its kind of model, its backend(s), the backend options and the vLLM engine options the user
set; :func:`prepare` checks them together (offline mode, option names and values, the backend spec,
endpoints, the output directory), sets up logging, and hands back a :class:`Session`. Every function of
:mod:`vllm_eval.api` goes through it, and the CLI's commands call those functions, so the same bad input gets the
same one-line error from Python and from the command line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..utils.errors import UsageError
from .checks import check_engine, prepare_output_dir
from .spec import CAPABILITY_OPTIONS, check_multi, resolve_spec


@dataclass
class Session:
    """What a model call gets after the shared checks.

    Attributes:
        engine: the vLLM engine options the user set (``EngineArgs`` names), checked.
        spec: the resolved backend (:class:`~vllm_eval.api.spec.BackendSpec`) of a one-backend call, None
            for one that runs several (``bench``, ``compare``).
        started: ``time.time()`` when the call started (results count their total from here).
        output_dir: the output directory, absolute and created, or None.
    """

    engine: dict[str, Any]
    spec: Any = None
    started: float = 0.0
    output_dir: str | None = None


def split_options(options: dict[str, Any], backend_options: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(backend options, engine options)`` of a library call's ``**options``: a name among ``backend_options``
    or :data:`~vllm_eval.api.spec.CAPABILITY_OPTIONS` reaches the backend, any other is a vLLM ``EngineArgs``
    name (checked by :func:`prepare`). None values are dropped."""
    given = {k: v for k, v in options.items() if v is not None}
    backend = {k: v for k, v in given.items() if k in backend_options or k in CAPABILITY_OPTIONS}
    return backend, {k: v for k, v in given.items() if k not in backend}


def prepare(
    kind: str,
    backends: list[str],
    options: dict[str, Any],
    engine: dict[str, Any],
    *,
    output_dir: str | None = None,
    verbose: bool = False,
    several: bool = False,
    peers: dict[str, str] | None = None,
    http_batch_size: int | None = None,
    started: float | None = None,
) -> Session:
    """Check a call's options before anything loads, and set up its logging.

    Args:
        kind: the kind of model (:mod:`vllm_eval.models.kinds`).
        backends: the backend names (one, unless ``several``).
        options: backend options (constructor keywords and capability options such as ``endpoint`` or
            ``data_parallel_size``); None values mean "not set".
        engine: vLLM ``EngineArgs`` options; names outside
            :data:`~vllm_eval.engine.args.LISTED_ENGINE_ARGS` are checked against vLLM's list.
        output_dir: created now (so a bad one fails first); ``vllm-eval.log`` goes there.
        verbose: vLLM's INFO logs, third-party warnings and tracebacks.
        several: the call runs every backend of ``backends`` (``bench``, ``compare``); ``peers`` gives the
            capability of names outside the backend table.
        http_batch_size: inputs per request for a remote backend (None: the transport's default).
        started: when the call started (``time.time()``); default now, and the process's timeline starts afresh
            (a command passes its own start, having recorded its imports already).

    Raises:
        UsageError: a bad option, endpoint or output directory.
        OptionError: an unknown engine option (close names suggested) or a bad value.
        UnknownNameError: an unknown backend.
    """
    from ..engine.args import LISTED_ENGINE_ARGS
    from ..models.http import check_endpoint
    from ..utils import logs, timeline
    from ..utils.hub import ensure_offline_if_unreachable

    # First: the hub libraries read offline mode once, when they are imported (mteb imports them).
    ensure_offline_if_unreachable()
    if started is None:  # a call of its own, not a command's: its timeline (and summaries) start afresh
        timeline.current().reset()
    engine = dict(engine)
    session = Session(engine=engine, started=time.time() if started is None else started)
    if not several:
        if len(backends) != 1:
            raise UsageError(f"one backend, not {len(backends)}")
        session.spec = resolve_spec(kind, backends[0], options, engine, http_batch_size=http_batch_size)
        runs_vllm = session.spec.runs_engine
    else:
        check_multi(kind, backends, options, peers)
        runs_vllm = True
    for url in options.get("endpoint") or ():
        check_endpoint(url)
    session.output_dir = prepare_output_dir(output_dir)
    logs.configure(verbose, session.output_dir)
    if engine and runs_vllm:
        check_engine(engine, [k for k in engine if k not in LISTED_ENGINE_ARGS])
    if runs_vllm and not verbose and "use_tqdm_on_load" not in engine:
        engine["use_tqdm_on_load"] = False  # vLLM's weight-loading bar; the log has the timing
    return session
