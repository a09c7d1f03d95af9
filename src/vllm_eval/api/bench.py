"""``vllm_eval.bench``: encode throughput and latency of the encoder backends, or a whole suite per backend, from
Python.

Everything ``vllm-eval bench`` does. Without ``suite``: every backend × dtype × lengths × batch size encodes the
same generated texts of controlled token length in one process (:func:`vllm_eval.measure.bench.run_bench`), ours
once per replica layout; ``bench.json`` and plots go to the output directory. With ``suite``: each backend runs a
whole task suite in a fresh process of its own, timed from process start to results written, scores checked
equal (:func:`vllm_eval.measure.suite.run_suite`). ``vllm-eval bench`` parses its flags and calls it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..utils.errors import UsageError
from ..utils.timeline import phase
from .checks import check_model_argument, resolve_model
from .session import Session, prepare

if TYPE_CHECKING:
    from ..measure.bench import BenchRecord
    from ..measure.suite import SuiteRecord

#: Where ``bench`` writes without ``output_dir`` (a suite: a folder of its own under it).
DEFAULT_OUTPUT_DIR = "results/bench"


def bench(
    model: str | os.PathLike | None = None,
    *,
    backends: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    lengths: Sequence[str] = ("fixed:130", "mixed:16-500"),
    batch_sizes: Sequence[int] = (64, 512, 2000),
    n_texts: int = 2000,
    st_batch_size: int = 128,
    output_dir: str | os.PathLike | None = None,
    suite: str | None = None,
    fraction: float = 1.0,
    n_docs: int = 200_000,
    n_queries: int = 1_000,
    restart: bool = False,
    time_limit: float | None = None,
    endpoint: Sequence[str] | str | None = None,
    api_key: str | None = None,
    max_concurrency: int | None = None,
    remote_batch_size: int | None = None,
    data_parallel_size: Sequence[int] | int | None = None,
    replicas_per_gpu: Sequence[int] | int | None = None,
    ray_address: str | None = None,
    verbose: bool = False,
    started: float | None = None,
    **engine: Any,
) -> list[BenchRecord] | list[SuiteRecord]:
    """Measure the encoder backends: throughput and latency on generated texts, or time to result on a suite.

    Every keyword has the name of ``vllm-eval bench``'s flag (``--n-texts`` is ``n_texts=``). Call it under
    ``if __name__ == "__main__":``: vLLM starts its processes with ``spawn``.

    Args:
        model: a model directory or hub id (offline: a cached one); default: the packaged all-MiniLM-L6-v2.
        backends: encoder backends and ``mteb-vllm`` (mteb's own vLLM wrapper); default: those that run here
            (:func:`vllm_eval.measure.bench.default_backends`; a sparse model's: :func:`sparse_backends`).
        dtypes: model dtypes, each measured (default: float32 on CPU, float16 and float32 on GPU); or one
            ``dtype=`` among the engine options, not both.
        lengths: ``fixed:N`` or ``mixed:A-B`` token lengths of the generated texts.
        batch_sizes: texts per encode call. ``n_texts``: texts per lengths spec.
        st_batch_size: sentence-transformers' batch size.
        output_dir: ``bench.json`` and plots, or the suite's runs and ``suite.json`` (created now); default
            ``results/bench``, for a suite ``results/bench/suite-<SUITE>`` (:func:`bench_dir`).
        suite: time a whole task suite per backend instead (``vllm``, ``st``, ``mteb-vllm``), each in a fresh
            process: ``offline``, ``synthetic`` (``n_docs`` documents and ``n_queries`` queries built from the
            vocabulary), or an mteb benchmark name, run as an offline replica of its tasks' sizes and text lengths
            (sample counts scaled by ``fraction``, 0 < f <= 1); resumable (:mod:`vllm_eval.measure.resume`).
        restart, time_limit: a suite: remove the earlier runs first; stop a backend (and the suite) after these seconds.
        endpoint, api_key, max_concurrency, remote_batch_size: the servers a served backend measures (all of
            them, round-robin), their key, requests in flight, inputs per request (default 64).
        data_parallel_size, replicas_per_gpu, ray_address: ours' replica layouts; several values measure each
            (a suite runs one).
        verbose: vLLM's INFO logs and third-party warnings.
        started: when the call started (``time.time()``); default now.
        **engine: vLLM ``EngineArgs`` for the vLLM backends (``max_model_len``, ``max_num_seqs`` ...; checked
            against vLLM's list).

    Returns:
        One :class:`~vllm_eval.measure.bench.BenchRecord` per backend, dtype, lengths and batch size; with
        ``suite`` one :class:`~vllm_eval.measure.suite.SuiteRecord` per backend (``returncode`` not 0: that
        backend's run failed, its log in ``<output_dir>/<backend>/log.txt``).

    Raises:
        UsageError: a bad option or combination (one line, before any model loads).
        OptionError: an unknown engine option (close names suggested).
        UnknownNameError: an unknown backend.
        ModelNotFoundError: a local model that does not exist.
        EngineError, EndpointError: a failure of an engine or a server while running.
    """
    from ..measure.bench import PEER, default_backends

    backends = sparse_backends(check_model_argument(model), backends, suite) or list(backends or default_backends())
    layout = {"data_parallel_size": _values(data_parallel_size), "replicas_per_gpu": _values(replicas_per_gpu)}
    options = {
        "remote_batch_size": remote_batch_size,
        **layout,
        "ray_address": ray_address,
        "endpoint": [endpoint] if isinstance(endpoint, str) else endpoint,
        "api_key": api_key,
        "max_concurrency": max_concurrency,
    }
    with phase("imports"):  # the option checks import the backend classes (and vLLM for unlisted options)
        session = prepare(
            "encoder",
            backends,
            options,
            engine,
            output_dir=_folder(output_dir, suite),
            verbose=verbose,
            several=True,
            peers={PEER: "engine"},
            started=started,
        )
    _check(model, lengths, dtypes, session.engine.get("dtype"), suite, fraction, restart or time_limit is not None)
    model = None if model is None else os.fspath(model)
    if suite:
        sizes = (n_docs, n_queries, fraction, restart, time_limit)
        return _suite(model, suite, backends, dtypes, layout, options, session, sizes)
    texts = {"lengths": list(lengths), "batch_sizes": list(batch_sizes), "n_texts": n_texts}
    return _throughput(model, backends, dtypes, layout, options, session, st_batch_size=st_batch_size, **texts)


def _throughput(
    model: str | None,
    backends: list[str],
    dtypes: Sequence[str] | None,
    layout: dict[str, list[int] | None],
    options: dict[str, Any],
    session: Session,
    **texts: Any,
) -> list[BenchRecord]:
    """Every backend × dtype × lengths × batch size on the same generated texts, ours once per replica layout."""
    from ..engine.args import on_cpu
    from ..measure.bench import run_bench

    dtype = session.engine.get("dtype")
    ray = {"ray_address": options["ray_address"]} if options["ray_address"] else {}
    replicas = [
        {"data_parallel_size": dp, "replicas_per_gpu": k, **ray}
        for dp in layout["data_parallel_size"] or [1]
        for k in layout["replicas_per_gpu"] or [1]
    ]
    return run_bench(
        model,
        backends=backends,
        dtypes=list(dtypes or ([dtype] if dtype else (["float32"] if on_cpu() else ["float16", "float32"]))),
        engine_kwargs={k: v for k, v in session.engine.items() if k != "dtype"},
        replicas=replicas,
        remote=_remote(options) if options["endpoint"] else None,
        output_dir=session.output_dir,
        **texts,
    )


def bench_dir(output_dir: str | os.PathLike | None, suite: str | None = None) -> Path:
    """The folder :func:`bench` writes to, absolute: ``output_dir``, else ``results/bench``, for a suite
    ``results/bench/suite-<SUITE>`` (its name with other characters than letters, digits, ``_.-`` as ``_``)."""
    return Path(os.path.abspath(os.path.expanduser(_folder(output_dir, suite))))


def _folder(output_dir: str | os.PathLike | None, suite: str | None) -> str:
    if output_dir is not None:
        return os.fspath(output_dir)
    if not suite:
        return DEFAULT_OUTPUT_DIR
    return os.path.join(DEFAULT_OUTPUT_DIR, "suite-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", suite).strip("_"))


def _values(value: Sequence[int] | int | None) -> list[int] | None:
    """Several values of a layout option (one given alone is a list of one)."""
    if value is None:
        return None
    return [value] if isinstance(value, int) else list(value)


def _check(
    model: Any,
    lengths: Sequence[str],
    dtypes: Sequence[str] | None,
    dtype: Any,
    suite: str | None,
    fraction: float,
    resume: bool = False,
) -> None:
    """``bench``'s own checks, after the shared ones and before any model loads (``resume``: ``restart`` or
    ``time_limit`` given)."""
    from ..engine.args import DTYPES
    from ..measure.bench import parse_lengths

    if model is not None:
        resolve_model(os.fspath(model), False)
    for spec in lengths:
        parse_lengths(spec)
    for d in dtypes or ():
        if d not in DTYPES:
            raise UsageError(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    if dtypes and dtype:
        raise UsageError("give --dtypes or --dtype, not both")
    if resume and not suite:
        raise UsageError("--restart and --time-limit go with --suite")
    if suite:
        from ..measure.suite import check_suite

        check_suite(suite, fraction)


def sparse_backends(model: Any, backends: Sequence[str] | None, suite: str | None) -> list[str] | None:
    """The backends that measure a sparse model (SPLADE, BGE-M3): ``backends`` checked, default ``vllm`` and its
    reference (``st`` for SPLADE, ``hf`` for BGE-M3; :data:`vllm_eval.measure.bench.SPARSE_BACKENDS`); None for
    another model.

    Raises:
        UsageError: a backend with no sparse output, or ``suite`` (a suite times dense encoders).
    """
    from ..measure.bench import SPARSE_BACKENDS, check_sparse_backends, sparse_flavour_of
    from ..utils.hub import ensure_offline_if_unreachable

    ensure_offline_if_unreachable()  # before a model's files are read: the hub libraries read it once, on import
    flavour = sparse_flavour_of(None if model is None else os.fspath(model))
    if flavour is None:
        return None
    if suite:
        raise UsageError(f"--suite times dense encoders; a sparse model ({flavour}) is measured without --suite")
    chosen = list(backends or SPARSE_BACKENDS[flavour])
    check_sparse_backends(flavour, chosen)
    return chosen


def _remote(options: dict[str, Any]) -> dict[str, Any]:
    """The served backends' transport, with its defaults filled in (as ``bench.json`` records it)."""
    from ..models.http import HttpOptions

    http = {"api_key": options["api_key"]}
    for key, value in (("max_concurrency", options["max_concurrency"]), ("batch_size", options["remote_batch_size"])):
        if value is not None:
            http[key] = value
    opts = HttpOptions(tuple(options["endpoint"]), **http)
    return {
        "endpoints": list(opts.endpoints),
        "api_key": opts.api_key,
        "batch_size": opts.batch_size,
        "max_concurrency": opts.max_concurrency,
    }


def _suite(
    model: str | None,
    suite: str,
    backends: list[str],
    dtypes: Sequence[str] | None,
    layout: dict[str, list[int] | None],
    options: dict[str, Any],
    session: Session,
    sizes: tuple[int, int, float, bool, float | None],
) -> list[SuiteRecord]:
    """``suite``: one fresh process per backend, wall time from start to results written. ``sizes``: ``n_docs``,
    ``n_queries``, ``fraction``, ``restart``, ``time_limit``."""
    from ..measure.suite import SUITE_BACKENDS, run_suite
    from ..utils.modelinfo import packaged_model_path

    bad = [b for b in backends if b not in SUITE_BACKENDS]
    if bad:
        raise UsageError(f"--suite times {', '.join(SUITE_BACKENDS)}; not {', '.join(bad)}")
    if dtypes and len(dtypes) > 1:
        raise UsageError("--suite runs one dtype: give --dtype")
    one: dict[str, Any] = {}
    for name, values in layout.items():
        if len(values or [1]) > 1:
            raise UsageError(f"--suite runs one layout: give one --{name.replace('_', '-')}")
        if values:  # not given: the run chooses (every GPU, replicas per GPU by the model's size)
            one[name] = values[0]
    if options["ray_address"]:
        one["ray_address"] = options["ray_address"]
    engine = dict(session.engine)
    dtype = engine.pop("dtype", None) or (dtypes[0] if dtypes else None)
    engine.pop("use_tqdm_on_load", None)  # display only; each process sets its own
    n_docs, n_queries, fraction, restart, time_limit = sizes
    return run_suite(
        model or packaged_model_path(),
        suite,
        backends=backends,
        output_dir=Path(session.output_dir),
        dtype=dtype,
        engine_kwargs=engine,
        replicas=one,
        n_docs=n_docs,
        n_queries=n_queries,
        fraction=fraction,
        restart=restart,
        time_limit=time_limit,
    )
