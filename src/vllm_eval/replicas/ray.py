"""Engine replicas as Ray actors: the same jobs as local replicas (:mod:`vllm_eval.replicas.pool`), on a Ray cluster.

``RayReplicaPool`` connects to a running cluster (``address``: ``auto``, ``HOST:PORT`` or
``ray://HOST:PORT``, as ``ray.init`` takes it), reserves one placement-group bundle per replica (``PACK``:
a node is filled before the next is used) and starts one actor per bundle, each building one plain
``vllm.LLM``: on a GPU cluster one engine per GPU (``tensor_parallel_size`` GPUs per bundle, or
``1/replicas_per_gpu`` of one GPU), on a CPU-only cluster one engine per core set, the cores of a node split
among the replicas placed on it as local replicas split them. Jobs go in order to the least-loaded actor,
and outputs come back to the driver, which alone writes caches and results.

A cluster that cannot hold the replicas is refused before anything starts (from ``ray.cluster_resources()``),
and a placement that is still pending after :data:`PLACEMENT_TIMEOUT_S` is an error naming what the
cluster has, not a hang (lm-evaluation-harness's Ray path waited forever at placement: its issues #1734,
#2904, #3093). An actor lost mid-run (killed, its process or node gone) has its unfinished jobs run on
the others (:class:`~vllm_eval.replicas.jobpool.JobPool`). Ray is optional: ``pip install 'vllm-eval[ray]'``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..engine.watchdog import EngineStalled
from ..utils.errors import ReplicaError, UsageError, VllmEvalError
from .jobpool import JobPool

__all__ = ["RayReplicaPool", "connect"]

logger = logging.getLogger(__name__)

#: Seconds Ray may take to place every replica's bundle before the start fails with what the cluster has.
PLACEMENT_TIMEOUT_S = 120.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray-address needs Ray: pip install 'vllm-eval[ray]'") from None
    return ray


def _reachable(address: str) -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) that refuses connections fails here in seconds, not in
    Ray's own retries."""
    if address == "auto" or "://" in address and not address.startswith("ray://"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise UsageError(f"--ray-address {address!r}: nothing answers there ({exc.strerror or exc})") from None


def connect(address: str) -> Any:
    """The ``ray`` module, connected to the cluster at ``address`` (an existing connection is kept).

    Raises:
        UsageError: Ray is not installed, or no cluster answers at ``address``.
    """
    ray = _ray()
    if ray.is_initialized():
        return ray
    _reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(f"--ray-address {address!r}: no Ray cluster ({' '.join(str(exc).split())[:200]})") from None
    return ray


class _ReplicaActor:
    """One engine replica inside a Ray actor (made remote by :class:`RayReplicaPool`)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.llm: Any = None

    def start(self, model: str, engine_kwargs: dict[str, Any], layout: dict[str, Any], setup: Any) -> tuple:
        """Build the engine where Ray placed this actor; ``("ready", info)`` or ``("failed", reason)``."""
        try:
            from .pool import place_on_node

            env, extra = place_on_node(model=model, engine_kwargs=engine_kwargs, **layout)
            os.environ.update(env)
            from ..engine.build import acquire_engine

            self.llm = acquire_engine(model, **{**engine_kwargs, **extra})
            return "ready", setup(self.llm) if setup is not None else None
        except BaseException as exc:  # the driver must hear why
            return "failed", f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"

    def run(self, fn: Callable[[Any, Any], Any], payload: Any) -> tuple:
        """``("done", fn(llm, payload))``, or ``("error", ...)`` with our own errors as themselves."""
        try:
            return "done", fn(self.llm, payload)
        except EngineStalled as exc:  # the engine hangs: the actor ends, and the driver counts it as lost
            logger.error("replica %d: %s", self.index, exc)
            os._exit(EngineStalled.exit_code)
        except BaseException as exc:  # a bad job must not take the actor down
            logger.debug("job failed:\n%s", traceback.format_exc())
            own = isinstance(exc, VllmEvalError)
            return "error", exc if own else f"replica {self.index}: {type(exc).__name__}: {exc}"

    def stop(self) -> None:
        if self.llm is not None:
            from ..engine.build import release_engine

            release_engine(self.llm)
            self.llm = None


def held_cpus(ray: Any) -> dict[str, float]:
    """CPUs held by the cluster's placement groups, by node id: another run's, or this run's task actors
    (:mod:`vllm_eval.evaluation.ray_tasks`, placed before the engine). Read from the group table, which says
    a removed group is gone at once (``ray.available_resources()`` lagged by a second)."""
    held: dict[str, float] = {}
    for group in ray.util.placement_group_table().values():
        if group.get("state") != "CREATED":
            continue
        for index, bundle in group.get("bundles", {}).items():
            node = group.get("bundles_to_node_id", {}).get(index, "")
            held[node] = held.get(node, 0.0) + bundle.get("CPU", 0.0)
    return held


def _bundle(
    cluster: dict[str, float],
    nodes: list[dict],
    n: int,
    tp: int,
    replicas_per_gpu: int,
    held: dict[str, float] | None = None,
) -> dict:
    """One replica's resources: GPUs (``tp``, or a share of one) and a CPU on a GPU cluster, else an even
    share of the cores that fits on one node, of the cores no placement group holds (``held``, by node).

    Raises:
        UsageError: the cluster cannot hold ``n`` such bundles.
    """
    gpus = cluster.get("GPU", 0.0)
    if gpus:
        if replicas_per_gpu > 1 and tp > 1:
            raise UsageError("--replicas-per-gpu with --tensor-parallel-size > 1 is not supported on Ray")
        share = tp if replicas_per_gpu == 1 else round(1 / replicas_per_gpu, 4)
        if n * share > gpus + 1e-6:
            raise UsageError(f"{n} replicas of {share} GPU each need {n * share:g} GPUs; the Ray cluster has {gpus:g}")
        return {"GPU": share, "CPU": 1}
    held = held or {}
    free = [node.get("Resources", {}).get("CPU", 0.0) - held.get(node.get("NodeID", ""), 0.0) for node in nodes]
    taken = sum(held.values())
    cpus = min(max(free, default=0.0), (cluster.get("CPU", 0.0) - taken) // n)
    if cpus < 1:
        also = f", {taken:g} of them held by placement groups (task actors, other runs)" if taken else ""
        raise UsageError(f"{n} replicas need a CPU each; the Ray cluster has {cluster.get('CPU', 0.0):g}{also}")
    return {"CPU": int(cpus)}


class RayReplicaPool(JobPool):
    """``replicas`` engine replicas as actors on the Ray cluster at ``address``; jobs as for local replicas.

    Args:
        model: model path (as the nodes see it) or hub id.
        engine_kwargs: vLLM ``EngineArgs`` for every replica.
        address: the cluster (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``).
        replicas: how many actors (``data_parallel_size * replicas_per_gpu``).
        tensor_parallel_size, replicas_per_gpu: each actor's GPUs (``tp``, or ``1/replicas_per_gpu`` of one).
        setup: as for :class:`~vllm_eval.replicas.pool.ReplicaPool` (runs in each actor).
        start_timeout: seconds for the actors' engines to be ready.

    Raises:
        UsageError: Ray missing, no cluster at ``address``, or one too small for the replicas.
        ReplicaError: placement still pending after :data:`PLACEMENT_TIMEOUT_S`, or an actor failed to start.
    """

    def __init__(
        self,
        model: str,
        engine_kwargs: dict[str, Any],
        *,
        address: str,
        replicas: int,
        tensor_parallel_size: int = 1,
        replicas_per_gpu: int = 1,
        setup: Callable[[Any], Any] | None = None,
        start_timeout: float = 900.0,
    ) -> None:
        ray = connect(address)
        super().__init__(list(range(replicas)), f"ray {address}")
        self._ray = ray
        self._actors: list[Any] = []
        self._nodes: list[str] = []
        self._refs: dict[Any, tuple[int, int]] = {}  # object ref -> (job id, replica)
        self._wake = threading.Event()
        bundle = _bundle(ray.cluster_resources(), [n for n in ray.nodes() if n.get("Alive")], replicas,
                         tensor_parallel_size, replicas_per_gpu, held_cpus(ray))  # fmt: skip
        self.bundle = bundle
        self._pg = ray.util.placement_group([bundle] * replicas, strategy="PACK")
        try:
            self._place(bundle, replicas)
            self._start(model, engine_kwargs, tensor_parallel_size, replicas_per_gpu, setup, start_timeout)
        except BaseException:
            self.close(timeout=5.0)
            raise
        self._started_all()
        self._collector = threading.Thread(target=self._collect, name="vllm-eval-ray-results", daemon=True)
        self._collector.start()

    def describe(self, index: int) -> str:
        node = self._nodes[index][:8] if index < len(self._nodes) else "?"
        return f"replica {index} (Ray actor on node {node})"

    def _place(self, bundle: dict, replicas: int) -> None:
        ray = self._ray
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise ReplicaError(
                f"Ray could not place {replicas} replicas of {bundle} in {PLACEMENT_TIMEOUT_S:.0f} s; "
                f"available: {ray.available_resources()}"
            ) from None
        table = ray.util.placement_group_table(self._pg)["bundles_to_node_id"]
        self._nodes = [table[i] for i in range(replicas)]
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as strategy

        remote = ray.remote(_ReplicaActor)
        for i in range(replicas):
            options = {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0), "max_restarts": 0}
            where = strategy(placement_group=self._pg, placement_group_bundle_index=i)
            self._actors.append(remote.options(scheduling_strategy=where, **options).remote(i))

    def _start(
        self, model: str, engine_kwargs: dict, tp: int, replicas_per_gpu: int, setup: Any, timeout: float
    ) -> None:
        """Start the engines: on each node, the replicas there share its cores (CPU) or get their own ports."""
        ray = self._ray
        per_node: dict[str, list[int]] = {}
        for i, node in enumerate(self._nodes):
            per_node.setdefault(node, []).append(i)
        layouts = {}
        for members in per_node.values():
            for rank, i in enumerate(members):
                layouts[i] = {
                    "rank": rank,
                    "count": len(members),
                    "cpu": "GPU" not in self.bundle,
                    "tensor_parallel_size": tp,
                    "replicas_per_gpu": replicas_per_gpu,
                }
        pending = {
            actor.start.remote(model, engine_kwargs, layouts[i], setup): i for i, actor in enumerate(self._actors)
        }
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not done:
                names = ", ".join(self.describe(i) for i in sorted(pending.values()))
                raise ReplicaError(f"{names} not ready after {timeout:.0f} s")
            index = pending.pop(done[0])
            try:
                kind, info = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                kind, info = "failed", " ".join(str(exc).split())[:300]
            if kind == "failed":
                raise ReplicaError(f"{self.describe(index)} failed to start: {info}")
            if self.info is None:
                self.info = info
            self._ready(index)

    def _send(self, index: int, job_id: int, fn: Callable[[Any, Any], Any], payload: Any) -> None:
        self._refs[self._actors[index].run.remote(fn, payload)] = (job_id, index)
        self._wake.set()

    def _collect(self) -> None:
        ray = self._ray
        while not self._closed:
            with self._lock:
                refs = list(self._refs)
            if not refs:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            done, _ = ray.wait(refs, num_returns=1, timeout=0.5)
            for ref in done:
                with self._lock:
                    sent = self._refs.pop(ref, None)
                if sent is None:  # its actor was lost, and the job sent again
                    continue
                job_id, index = sent
                try:
                    kind, value = ray.get(ref)
                except ray.exceptions.RayActorError as exc:  # the actor, its process or its node is gone
                    self._lost(index, f"was lost ({type(exc).__name__})")
                    continue
                except ray.exceptions.RayError as exc:
                    kind, value = "error", f"{self.describe(index)}: {' '.join(str(exc).split())[:300]}"
                self._finished(index, job_id, kind == "done", value)

    def _lost(self, index: int, reason: str) -> None:
        with self._lock:  # its other jobs' refs will only fail too: forget them, they are sent again
            for ref, (_, i) in list(self._refs.items()):
                if i == index:
                    del self._refs[ref]
        super()._lost(index, reason)

    def close(self, timeout: float = 60.0) -> None:
        """Stop every actor's engine, then the actors and their placement group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        live = [a for i, a in enumerate(self._actors) if i not in self._dead]
        try:
            ray.wait([a.stop.remote() for a in live], num_returns=len(live), timeout=timeout)
        except Exception as exc:  # an actor already gone: nothing to stop
            logger.debug("stopping actors: %s", exc)
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(self._pg)
        self._fail_pending("the replica pool was closed")
