"""``VllmBackend``: what every vLLM backend of every kind shares: one engine or engine replicas, and one
way to run a job on them.

:meth:`VllmBackend.start` acquires one shared in-process engine (:mod:`vllm_eval.engine.build`) or starts
``data_parallel_size`` × ``replicas_per_gpu`` replicas (:mod:`vllm_eval.replicas.pool`), and records how long
that took. :meth:`VllmBackend.run_split` (and :meth:`VllmBackend.submit_split`, which does not wait)
runs a job — a module-level ``fn(llm, payload)`` — on the engine, or split in input order over the
replicas, and joins the parts in order. A job with a non-blocking variant (the encoder's) hands the in-process
engine its chunks through :mod:`vllm_eval.engine.pipeline`, so the next chunk is queued in the engine while this one is
collected.

The job convention, for every kind: a job returns its value or raises. A request vLLM failed on raises
:class:`RequestFailed` (its index within the job's part and vLLM's reason), which comes back to the
caller as an :class:`~vllm_eval.utils.errors.EngineError` naming the input; vLLM's refusal of a request
before it runs is a :class:`~vllm_eval.utils.errors.UsageError` (:func:`refusals_as_usage_errors`), raised as
itself from a replica too.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..engine.build import acquire_engine, collect_released_on_gpu, release_engine
from ..engine.outputs import RequestFailed, check_outputs, first_request_error, refusals_as_usage_errors
from ..engine.pipeline import drain as drain_pipeline
from ..utils import timeline
from ..utils.errors import EngineError, VllmEvalError
from .base import Resource

logger = logging.getLogger(__name__)

__all__ = [
    "RequestFailed",
    "VllmBackend",
    "check_outputs",
    "first_request_error",
    "refusals_as_usage_errors",
]


def guarded(fn: Callable[[Any, Any], Any], llm: Any, payload: Any) -> Any:
    """``fn(llm, payload)`` with vLLM's refusal of a request (an empty prompt, one over ``max_model_len``) as a
    one-line UsageError; module-level, so ``functools.partial(guarded, fn)`` pickles for a replica."""
    with refusals_as_usage_errors("an input"):
        return fn(llm, payload)


def _join(parts: list[Any]) -> Any:
    """Parts of one split, in order: arrays concatenated, named tuples of arrays
    (:class:`~vllm_eval.engine.jobs.TokenizedRows`) field by field, lists chained (one part: itself)."""
    if len(parts) == 1:
        return parts[0]
    if parts and all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    if parts and all(isinstance(p, tuple) and hasattr(p, "_fields") for p in parts):  # named arrays: field by field
        return type(parts[0])(*(np.concatenate(field) for field in zip(*parts, strict=True)))
    return [x for part in parts for x in part]


def _named(value: Callable[[], Any], lo: int, describe: Callable[[int], str] | None) -> Any:
    """``value()``, a :class:`RequestFailed` turned into an EngineError naming input ``lo + index``."""
    try:
        return value()
    except RequestFailed as exc:
        what = describe(lo + exc.index) if describe is not None else f"input {lo + exc.index}"
        raise EngineError(f"vLLM failed on {what}: {exc.reason}") from None


class VllmBackend(Resource):
    """Mixin of the vLLM backends (encoder, reranker, generator, classifier, token classifier, token
    embedder): the shared engine in ``self.llm``, or replicas in ``self.pool``, and the jobs run on them.

    A backend sets ``self.engine_kwargs`` (:func:`vllm_eval.engine.args.backend_engine_kwargs`), calls
    :meth:`start` with its picklable ``setup(llm) -> dict`` (tokenizer, limits, ``dtype``,
    ``quantization`` ...: the parent needs nothing from an engine afterwards, since with replicas it has
    none) and runs every engine call through :meth:`run_split` / :meth:`submit_split`.
    """

    llm: Any = None
    pool: Any = None
    engine_kwargs: dict[str, Any]
    _engine_start_s: float = 0.0
    _data_parallel_size: int = 1
    #: Where the engines run (:class:`vllm_eval.engine.sizing.Layout`), set by :meth:`start`.
    layout: Any = None
    #: The options local replicas' engines are built with (``engine_kwargs`` and their placement's), set by
    #: :meth:`start`; None: the engine gets ``engine_kwargs``.
    built_with: dict[str, Any] | None = None
    #: A chunk of this backend went through the in-process pipeline (:mod:`vllm_eval.engine.pipeline`).
    _pipelining: bool = False
    #: What another model's backend must match to take this one's engine in a sweep (:mod:`.handoff`).
    _reuse_key: str | None = None
    #: Whether :meth:`start` took a sweep's engine and loaded this model's weights into it.
    engine_reused: bool = False

    def start(
        self,
        ref: Any,
        setup: Callable[[Any], dict[str, Any]],
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
    ) -> dict[str, Any]:
        """One shared engine in this process, or ``data_parallel_size`` × ``replicas_per_gpu`` > 1 replicas
        (local processes; with ``ray_address``, Ray actors on that cluster, however many); either size None: chosen
        for the model and the GPUs on a GPU machine, else 1 (:mod:`vllm_eval.replicas.layout`);
        returns ``setup(llm)`` of the engine (of the first replica). Records the wall seconds until ready
        (``engine_start_seconds`` in the counters, also when they exist already) and keeps ``dtype`` and
        ``quantization`` from the info. In a sweep, the engine a backend of a model of the same shape left is taken
        and the weights loaded into it (:mod:`vllm_eval.models.handoff`).

        Raises:
            UsageError: a replica layout the machine (or the Ray cluster) cannot hold; Ray missing.
            ReplicaError: a replica failed to start.
            EngineError: the in-process engine failed to start.
        """
        started, wall = time.perf_counter(), time.time()
        self.layout = self._layout(ref, data_parallel_size, replicas_per_gpu, ray_address)
        self._data_parallel_size = self.layout.data_parallel_size
        info = self._take_parked(ref, setup)
        if info is not None:  # a sweep's engine, its weights reloaded (the reload is on the timeline)
            self._engine_start_s, self.engine_reused = time.perf_counter() - started, True
        else:
            info = self._start_engines(ref, setup, ray_address)
            # The pool times its own start (until every replica is ready); planning it takes no time to speak of.
            self._engine_start_s = self.pool.start_seconds if self.pool is not None else time.perf_counter() - started
            _record_start(wall, self._engine_start_s, self.pool, ref)
        counters = getattr(self, "counters", None)
        if counters is not None:  # a base built before the engine started (the generator's)
            counters.engine_start_seconds = self._engine_start_s
        self.dtype, self.quantization = info["dtype"], info["quantization"]
        return info

    def _start_engines(self, ref: Any, setup: Callable[[Any], dict[str, Any]], ray_address: str | None) -> dict:
        """Start the engines of ``self.layout``: Ray actors, one in-process engine, or local replicas; ``setup`` of
        the (first) engine."""
        dp, rpg = self.layout.data_parallel_size, self.layout.replicas_per_gpu
        tp = self.layout.tensor_parallel_size
        if ray_address or dp * rpg > 1:
            collect_released_on_gpu()  # an in-process engine's leftovers would count against the replicas' GPUs
        if ray_address:
            from ..replicas.ray import RayReplicaPool

            self.pool = RayReplicaPool(
                ref.path,
                self.engine_kwargs,
                address=ray_address,
                replicas=dp * rpg,
                tensor_parallel_size=tp,
                replicas_per_gpu=rpg,
                setup=setup,
            )
            return self.pool.info
        if dp * rpg <= 1:
            self.llm = acquire_engine(ref, **self.engine_kwargs)
            return setup(self.llm)
        from ..replicas.ahead import take_ahead
        from ..replicas.pool import ReplicaPool, plan_replicas

        placements = plan_replicas(dp, rpg, tensor_parallel_size=tp, engine_kwargs=self.engine_kwargs, model=ref.path)
        self.pool = ReplicaPool(ref.path, self.engine_kwargs, placements, setup=setup, ahead=take_ahead(placements))
        # What each replica's engine is built with: its share of the GPU, its KV-cache size (alike for all).
        self.built_with = {**self.engine_kwargs, **placements[0].engine_kwargs}
        return self.pool.info

    def _take_parked(self, ref: Any, setup: Callable[[Any], dict[str, Any]]) -> dict[str, Any] | None:
        """In a sweep (:func:`vllm_eval.models.handoff.engines_kept`): the engine or replicas a closed backend of a
        model of the same shape parked, with ``ref``'s weights loaded in place, and ``setup`` of it; else None (a
        parked engine of another shape is shut down first)."""
        from ..engine.build import reload_engine
        from ..engine.jobs import reload_job
        from . import handoff

        if not handoff.keeping():
            return None
        self._reuse_key = handoff.reuse_key(ref.path, self.engine_kwargs, self.layout, setup)
        parked = handoff.take(self._reuse_key)
        if parked is None:
            return None
        try:
            with timeline.phase("reload", detail=str(ref.path)):
                if parked.pool is not None:
                    for future in parked.pool.broadcast(reload_job, ref.path):
                        future.result()
                    self.pool, self.built_with = parked.pool, parked.built_with
                    handoff.note_reload()
                    return self.pool.info
                if reload_engine(parked.llm, ref.path):
                    self.llm = parked.llm
                    handoff.note_reload()
                    return setup(self.llm)
        except VllmEvalError as exc:  # an engine that cannot reload (an older vLLM): a fresh one, as a run would
            logger.warning("loading %s into the running engine failed, starting a fresh one: %s", ref.path, exc)
        self.pool = self.llm = None
        parked.close()
        return None

    def _layout(self, ref: Any, dp: int | None, rpg: int | None, ray_address: str | None) -> Any:
        """The layout to start (:func:`vllm_eval.replicas.layout.resolve_layout`), printed on a GPU machine; a
        tensor-parallel size it chose goes into the engine options."""
        from ..engine.args import on_cpu
        from ..replicas.layout import resolve_layout
        from ..utils.progress import echo

        layout = resolve_layout(ref.path, self.engine_kwargs, dp, rpg, ray_address)
        if layout.tensor_parallel_size != (self.engine_kwargs.get("tensor_parallel_size") or 1):
            self.engine_kwargs = {**self.engine_kwargs, "tensor_parallel_size": layout.tensor_parallel_size}
        if not ray_address and not on_cpu():
            echo(f"vllm-eval: {layout.describe()}")
        return layout

    @property
    def accelerators(self) -> int:
        """GPUs the engines run on (the MFU divides by their peak): each replica's tensor-parallel size times the
        GPUs the replicas spread over (replicas sharing a GPU count it once); on the CPU build, the core sets of the
        replicas; 1 for one engine without tensor parallelism."""
        return (self.engine_kwargs.get("tensor_parallel_size") or 1) * self._data_parallel_size

    @property
    def parallel_jobs(self) -> int:
        """Engines that run a split at once: the replicas, else 1 (chunks grow with it, so each replica
        still gets a whole chunk per step)."""
        return len(self.pool) if self.pool is not None else 1

    @property
    def max_in_flight(self) -> int:
        """Chunks handed over before the oldest is collected: two with replicas, so none waits idle; one once the
        in-process engine's chunks are pipelined (:mod:`vllm_eval.engine.pipeline`: the next chunk's requests are queued
        in the engine while this one's outputs are collected), else none."""
        if self.pool is not None:
            return 2
        return 1 if self._pipelining else 0

    def submit_split(
        self,
        fn: Callable[[Any, Any], Any],
        n: int,
        payload: Callable[[int, int], Any],
        describe: Callable[[int], str] | None = None,
        pipelined: Callable[[Any, Any, Callable[[Callable[[], Any]], Any]], Future | None] | None = None,
    ) -> Future:
        """Start ``fn(llm, payload(lo, hi))`` over ``n`` inputs: inline on the engine (a finished future), or
        one part per replica in input order; the future's result joins the parts in order (arrays
        concatenated, lists chained). ``describe(i)`` names input ``i`` when vLLM fails on it.

        ``pipelined(llm, payload, named)``, where given, is ``fn`` without waiting, for the in-process engine
        (:mod:`vllm_eval.engine.pipeline`): its future may be unfinished (waiting for it steps the engine),
        ``named(value)``
        is ``value()`` with a failed request named; where it returns None, ``fn`` runs inline as usual.

        ``fn`` must be a module-level function; with replicas, its payload and result must pickle.
        """
        combined: Future = Future()
        fn = functools.partial(guarded, fn)
        if self.pool is None or n == 0:
            try:
                part = payload(0, n)
                if n and pipelined is not None:
                    with refusals_as_usage_errors("an input"):
                        future = pipelined(self.llm, part, lambda value: _named(value, 0, describe))
                    if future is not None:
                        self._pipelining = True  # from now on the stream keeps a chunk in flight (max_in_flight)
                        return future
                if n:  # a synchronous call steps the engine until it is empty: no pipelined chunk may be left in it
                    drain_pipeline(self.llm)
                combined.set_result(_named(lambda: fn(self.llm, part), 0, describe))
            except BaseException as exc:  # handed to the caller through the future
                combined.set_exception(exc)
            return combined
        parts = self.pool.submit_split(fn, n, payload)
        pending = [len(parts)]
        lock = threading.Lock()

        def done(_: Future) -> None:
            with lock:
                pending[0] -= 1
                if pending[0]:
                    return
            if combined.cancelled():  # its caller gave up on it
                return
            try:
                combined.set_result(_join([_named(f.result, lo, describe) for lo, f in parts]))
            except BaseException as exc:  # handed to the caller through the future
                combined.set_exception(exc)

        for _, f in parts:
            f.add_done_callback(done)
        return combined

    def run_split(
        self,
        fn: Callable[[Any, Any], Any],
        n: int,
        payload: Callable[[int, int], Any],
        describe: Callable[[int], str] | None = None,
    ) -> Any:
        """:meth:`submit_split`, waited for.

        Raises:
            EngineError: vLLM failed on an input (named through ``describe``).
            UsageError: vLLM refused a request before it ran.
            ReplicaError: a replica failed on the job, or died with no other left.
        """
        return self.submit_split(fn, n, payload, describe).result()

    def engine_identity(self) -> dict[str, Any]:
        """What of the engine changes outputs, for the backend's identity: dtype, quantization, ``hf_overrides``."""
        return {
            "dtype": self.dtype,
            "quantization": self.quantization,
            "hf_overrides": self.engine_kwargs.get("hf_overrides"),
        }

    def close(self) -> None:
        """Stop the replicas, or release this wrapper's engine (shut down when no other wrapper shares
        it). Idempotent."""
        pool, self.pool = self.pool, None
        llm, self.llm = self.llm, None
        if pool is None and llm is None:
            return
        from . import handoff

        if handoff.park(self._reuse_key, llm, pool, getattr(self, "model", ""), self.built_with):
            return
        with timeline.phase("shutdown"):
            if pool is not None:
                pool.close()
            if llm is not None:
                release_engine(llm)


def _record_start(wall: float, seconds: float, pool: Any, ref: Any) -> None:
    """The engine's start on the timeline: one ``engine`` phase per replica (until it was ready), or the
    in-process engine's."""
    name = getattr(ref, "path", str(ref))
    if pool is None:
        timeline.current().add("engine", wall, wall + seconds, detail=str(name))
        return
    # Planning the pool counts too; replicas started with the command (replicas_ahead) count from their launch.
    for index, ready in sorted(pool.ready_seconds.items()):
        timeline.current().add("engine", min(wall, pool.started_at), pool.started_at + ready, detail=f"replica {index}")
