"""Engine replicas: several plain vLLM engines, each in its own worker process, with an inbox and a result pipe each.

Used for two things that are the same mechanism at two scales:

* **data parallelism** over the GPUs of a machine (``data_parallel_size=N``): replica *i* sees
  GPUs ``[i*tp, (i+1)*tp)`` through ``CUDA_VISIBLE_DEVICES`` (``tp`` = ``tensor_parallel_size``);
* **several replicas on one GPU** (``replicas_per_gpu=K``): when one engine cannot keep a GPU busy
  (encoder-sized models are bound by per-request CPU work, not FLOPs), K engines share it, each
  with ``gpu_memory_utilization / K``. The published finding behind this: 4 instances of
  jina-embeddings-v3 on one GPU gave ~4.6x one instance (vLLM issue #31678).

Each replica is a normal ``vllm.LLM`` built by :func:`vllm_eval.engine.build.acquire_engine`, in a
spawned worker process of its own, so its input processing runs under its own GIL. On the CPU
build, replicas get disjoint core sets (``VLLM_CPU_OMP_THREADS_BIND``) instead of GPUs.

This is vLLM's recipe for dense models (independent replicas, no cross-rank traffic; vLLM's
own ``data_parallel_size`` only adds coordination that MoE layers need). Each job goes to the live
replica with the fewest jobs outstanding; a replica that dies has its jobs moved to the others
(with a warning), so a lost process costs time, not results.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.procenv import cpu_cores, set_by_user
from ..engine.sizing import (
    GPU_MEMORY_SHARE,
    engine_memory_share,
    first_gpu_memory,
    longest_prompt,
    model_shape,
    pooling_step,
    visible_gpus,
)
from ..utils.errors import ReplicaError, UsageError
from ..utils.modelinfo import model_json
from .jobpool import JobPool
from .process import ReplicaProcess, kill_group, spawn, start_breakdown

__all__ = ["ReplicaError", "ReplicaPool", "plan_replicas"]

logger = logging.getLogger(__name__)

#: First port vLLM searches from in replica 0 (``VLLM_PORT``); replica *i* starts 100 ports higher.
REPLICA_BASE_PORT = 38000
#: KV-cache reserve per replica on the CPU build (pooling needs little; 2 GiB each would add up).
CPU_REPLICA_KV_CACHE_BYTES = 1024**3


@dataclass(frozen=True)
class Placement:
    """Where replica ``index`` runs: environment for its process, and its start wave.

    Replicas of one wave start together; waves start one after another. Replicas sharing a GPU
    start in one wave when each has an explicit KV-cache size (``kv_cache_memory_bytes``: vLLM then
    skips measuring free memory); otherwise one per wave, since vLLM's start-up memory profiling
    assumes it is alone on the GPU.
    """

    index: int
    env: dict[str, str]
    wave: int
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        where = self.env.get("CUDA_VISIBLE_DEVICES") or self.env.get("VLLM_CPU_OMP_THREADS_BIND") or "?"
        unit = "GPU" if "CUDA_VISIBLE_DEVICES" in self.env else "cores"
        return f"replica {self.index} ({unit} {where})"


def _kv_bytes_per_token(model: str, engine_kwargs: dict[str, Any]) -> int:
    """Bytes of K and V one token takes over all layers of ``model`` (plain multi-head or grouped
    attention): ``2 * layers * kv_heads * head_dim * bytes per element``. Read from the model's
    ``config.json`` as plain JSON (its ``text_config`` for a multimodal model): building a
    transformers config object took tens of seconds with transformers 5.17 on a GPU machine.

    Raises:
        UsageError: a ``config.json`` the checked reader refuses.
        KeyError, ValueError: no ``config.json``, or one without these fields.
    """
    path = Path(model) / "config.json"
    if not path.is_file():  # a hub id: the cached copy, never the network
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
        path = Path(cached) if isinstance(cached, str) else path
    config = model_json(path)
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_dtype = str(engine_kwargs.get("kv_cache_dtype") or "auto")
    if kv_dtype.startswith("fp8"):
        width = 1
    else:
        dtype = str(engine_kwargs.get("dtype") or text.get("torch_dtype") or text.get("dtype") or "auto")
        width = 4 if dtype in ("float", "float32") else 2
    return 2 * int(text["num_hidden_layers"]) * kv_heads * head_dim * width


def pooling_kv_cache_bytes(model: str, engine_kwargs: dict[str, Any], replica_bytes: int) -> int:
    """An explicit KV-cache size for one pooling replica, so replicas sharing a GPU can start together.

    A pooling request is answered in the step that reads it, so the cache needs to hold one step:
    ``max_num_batched_tokens`` tokens plus one partly filled 16-token block per sequence
    (``max_num_seqs``), at :func:`_kv_bytes_per_token`; both as given, else as the replica's engine will size them
    (:func:`vllm_eval.engine.sizing.pooling_step`). Capped at half of ``replica_bytes`` (the replica's share of the
    GPU) to leave room for weights and activations; vLLM schedules fewer tokens per step when the cap binds.
    Encoder-only models (BERT) allocate no KV cache at all.
    """
    shape = model_shape(model, engine_kwargs)
    step = pooling_step(shape, longest_prompt(shape, engine_kwargs), replica_bytes)
    tokens = int(engine_kwargs.get("max_num_batched_tokens") or step["max_num_batched_tokens"])
    tokens += 16 * int(engine_kwargs.get("max_num_seqs") or step["max_num_seqs"])
    return min(tokens * _kv_bytes_per_token(model, engine_kwargs), replica_bytes // 2)


def _gpu_memory_options(replicas_per_gpu: int, engine_kwargs: dict[str, Any], model: str | None) -> dict:
    """Each replica's share of its GPU (:func:`vllm_eval.engine.sizing.engine_memory_share`, the rule a single
    engine follows) and, for pooling models sharing a GPU, its KV-cache size (see :func:`plan_replicas`)."""
    pooling = engine_kwargs.get("runner") == "pooling"
    if "gpu_memory_utilization" in engine_kwargs or (replicas_per_gpu == 1 and not pooling):
        return {}  # one engine per GPU: each replica's process takes the single engine's default itself
    if "kv_cache_memory_bytes" in engine_kwargs and replicas_per_gpu == 1:
        return {}
    # engines sharing a GPU each take their part of it, even where the user sized their KV cache
    asked = {k: v for k, v in engine_kwargs.items() if k != "kv_cache_memory_bytes"}
    share = engine_memory_share(asked, model, replicas_per_gpu)
    if share is None:  # no GPU to ask (replicas planned where none runs), or a speech model: vLLM's share, split
        return {"gpu_memory_utilization": round(GPU_MEMORY_SHARE / replicas_per_gpu, 4)} if replicas_per_gpu > 1 else {}
    if not pooling:
        return {"gpu_memory_utilization": share}
    total = first_gpu_memory()[1]
    extra: dict[str, Any] = {"gpu_memory_utilization": share}
    if "kv_cache_memory_bytes" in engine_kwargs or model is None or replicas_per_gpu == 1:
        return extra
    try:
        extra["kv_cache_memory_bytes"] = pooling_kv_cache_bytes(model, engine_kwargs, int(share * total))
    except Exception as exc:  # no size, no harm: the replicas start one after another
        logger.info("replicas start one after another: no KV-cache size for %s (%s)", model, exc)
    return extra


def plan_replicas(
    data_parallel_size: int,
    replicas_per_gpu: int = 1,
    *,
    tensor_parallel_size: int = 1,
    engine_kwargs: dict[str, Any] | None = None,
    cpu: bool | None = None,
    devices: list[str] | None = None,
    model: str | None = None,
) -> list[Placement]:
    """Place ``data_parallel_size * replicas_per_gpu`` replicas on this machine's GPUs or cores.

    GPU build: replica group *i* (of ``data_parallel_size``) gets GPUs ``devices[i*tp:(i+1)*tp]``;
    the ``replicas_per_gpu`` replicas of a group share them, each with its part of
    ``gpu_memory_utilization`` unless the user set it (then taken per replica): for a pooling model
    :func:`vllm_eval.engine.sizing.memory_share` (what is free, less the room the command's scoring keeps), else
    what is free, split, less each engine's room for a step's prompt log-probabilities
    (:func:`vllm_eval.engine.sizing.prompt_logprob_reserve`). Replicas sharing a GPU start
    together when each has an explicit KV-cache size: the user's ``kv_cache_memory_bytes``, or, for
    a pooling ``model`` (``runner="pooling"``) whose user set neither that nor
    ``gpu_memory_utilization``, :func:`pooling_kv_cache_bytes`. Otherwise they start one after another.
    CPU build: the cores this process may use are split into equal contiguous sets, one per replica.

    Raises:
        UsageError: sizes below 1, more GPUs asked for than are visible, or fewer cores than replicas.
    """
    from ..engine.args import on_cpu

    engine_kwargs = dict(engine_kwargs or {})
    for name, value in (
        ("data_parallel_size", data_parallel_size),
        ("replicas_per_gpu", replicas_per_gpu),
        ("tensor_parallel_size", tensor_parallel_size),
    ):
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a positive int, got {value!r}")
    cpu = on_cpu() if cpu is None else cpu
    n = data_parallel_size * replicas_per_gpu
    if cpu:
        if tensor_parallel_size != 1:
            raise UsageError("replicas on the CPU build need tensor_parallel_size=1")
        cores = cpu_cores() if devices is None else [int(d) for d in devices]
        if len(cores) < n:
            raise UsageError(f"{n} replicas need at least {n} CPU cores; this process may use {len(cores)}")
        per = len(cores) // n
        extra = (
            {}
            if {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(engine_kwargs)
            else {"kv_cache_memory_bytes": CPU_REPLICA_KV_CACHE_BYTES}
        )
        out = []
        for i in range(n):
            mine = cores[i * per : (i + 1) * per]
            # The worker's scheduler shares these cores; with explicit binding vLLM reserves none. OpenMP
            # pools outside the bound worker default to every core: two replicas on this 2-core machine
            # encoded 6,411 tok/s with that, 7,815 tok/s with one thread each (scripts/ray_overhead.py).
            env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
            if not set_by_user("OMP_NUM_THREADS"):  # the user's setting stands
                env["OMP_NUM_THREADS"] = str(len(mine))
            out.append(Placement(index=i, env=env, wave=0, engine_kwargs=extra))
        return out
    gpus = visible_gpus() if devices is None else list(devices)
    need = data_parallel_size * tensor_parallel_size
    if need > len(gpus):
        raise UsageError(
            f"data_parallel_size={data_parallel_size} x tensor_parallel_size={tensor_parallel_size} "
            f"needs {need} GPUs; {len(gpus)} visible ({','.join(gpus) or 'none'})"
        )
    extra = _gpu_memory_options(replicas_per_gpu, engine_kwargs, model)
    together = "kv_cache_memory_bytes" in {**engine_kwargs, **extra}
    out = []
    base_port = int(os.environ.get("VLLM_PORT") or REPLICA_BASE_PORT)
    inproc = _engine_core_in_process(tensor_parallel_size)
    # Image preprocessing runs on the CPU in every replica (torch, torchvision): one OpenMP pool over every
    # core per replica oversubscribes the machine.
    threads = (
        {}
        if set_by_user("OMP_NUM_THREADS")
        else {"OMP_NUM_THREADS": str(max(1, len(cpu_cores()) // (data_parallel_size * replicas_per_gpu)))}
    )
    for g in range(data_parallel_size):
        group = gpus[g * tensor_parallel_size : (g + 1) * tensor_parallel_size]
        for k in range(replicas_per_gpu):
            out.append(
                Placement(
                    index=len(out),
                    # Replicas starting together each search for free ports from their own base:
                    # from one base, two engines took the same port for torch.distributed (EADDRINUSE).
                    env={
                        "CUDA_VISIBLE_DEVICES": ",".join(group),
                        "VLLM_PORT": str(base_port + 100 * len(out)),
                        **inproc,
                        **threads,
                    },
                    wave=0 if together else k,
                    engine_kwargs=extra,
                )
            )
    return out


def place_on_node(
    *,
    rank: int,
    count: int,
    cpu: bool,
    tensor_parallel_size: int,
    replicas_per_gpu: int,
    model: str,
    engine_kwargs: dict[str, Any],
) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment and extra engine options of replica ``rank`` of ``count`` placed on this machine by
    someone else (a Ray actor, whose GPUs Ray chose through ``CUDA_VISIBLE_DEVICES``): CPU, its share of the
    cores as :func:`plan_replicas` splits them; GPU, its own port range, the engine core in its process, and
    its share of a GPU shared by ``replicas_per_gpu``.

    Returns:
        ``(env, engine_kwargs)`` to set before the engine starts and to add to its options.
    """
    if cpu:
        placement = plan_replicas(count, 1, cpu=True, engine_kwargs=engine_kwargs)[rank]
        return placement.env, placement.engine_kwargs
    base_port = int(os.environ.get("VLLM_PORT") or REPLICA_BASE_PORT)
    env = {"VLLM_PORT": str(base_port + 100 * rank), **_engine_core_in_process(tensor_parallel_size)}
    extra = _gpu_memory_options(replicas_per_gpu, engine_kwargs, model)
    if tensor_parallel_size > 1 and "distributed_executor_backend" not in engine_kwargs:
        extra["distributed_executor_backend"] = "mp"  # inside an actor, vLLM would otherwise ask Ray for more
    return env, extra


#: vLLM's switch for its engine core's own process (V1: ``VLLM_ENABLE_V1_MULTIPROCESSING``).
ENGINE_CORE_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _engine_core_in_process(tensor_parallel_size: int) -> dict[str, str]:
    """A GPU replica's engine core runs in the replica's process (vLLM's in-process client), unless the
    user chose (``VLLM_ENABLE_V1_MULTIPROCESSING``) or an engine spans GPUs (not measured).

    The replica is a process of its own already: a second one per engine only re-imports vLLM and
    copies every output between processes, and a replica whose engine is all in its process stops at once
    (:func:`vllm_eval.replicas.process.engine_in_this_process`). (CPU replicas choose the same themselves:
    :func:`vllm_eval.engine.procenv.choose_engine_core_process`.) Measured on an H100 (vLLM 0.26.0, random-weight
    BERT-base
    fp16, 4 replicas, the 200,000-document synthetic suite, warm compile cache): ready in 36.4 s instead
    of 59.4 s, encoding 24.3 s instead of 26.7 s, 95.8 s instead of 121.4 s from process start to
    results (docs/bench/h100-time-to-result).
    """
    if set_by_user(ENGINE_CORE_PROCESS) or tensor_parallel_size != 1:
        return {}  # (ours, set for an engine of this process, is not the replicas' choice)
    return {ENGINE_CORE_PROCESS: "0"}


class ReplicaPool(JobPool):
    """Start replicas per ``placements`` as local processes, run jobs on them
    (:class:`~vllm_eval.replicas.jobpool.JobPool`:
    a replica that dies has its jobs moved to the others), shut them down.

    Args:
        model: resolved model path or hub id.
        engine_kwargs: vLLM ``EngineArgs`` for every replica (a placement's own options win).
        placements: from :func:`plan_replicas`.
        setup: ``setup(llm) -> info`` run in each replica once its engine is up; the first
            replica's ``info`` is kept in :attr:`info` (e.g. the tokenizer and model limits,
            so the parent needs no engine of its own). Must be a picklable module-level function.
        start_timeout: seconds to wait for one wave of replicas.
        ahead: processes started with the command for exactly these placements, one each in order
            (:func:`vllm_eval.replicas.ahead.take_ahead`): given their engine instead of new ones being started;
            ``started_at`` and the ready times then count from their launch.

    Raises:
        ReplicaError: a replica failed to start (its reason in the message); the others are stopped.
    """

    def __init__(
        self,
        model: str,
        engine_kwargs: dict[str, Any],
        placements: list[Placement],
        *,
        setup: Callable[[Any], Any] | None = None,
        start_timeout: float = 900.0,
        ahead: list[ReplicaProcess] | None = None,
    ) -> None:
        super().__init__([p.index for p in placements], "local")
        self.placements = placements
        #: Each replica's process, inbox and result pipe, by placement index (None until its wave starts).
        self._replicas: list[ReplicaProcess | None] = [None] * len(placements)
        self._reading = threading.Lock()
        if ahead:
            self.started_at = min(a.launched for a in ahead)
            self._started -= time.time() - self.started_at  # ready_seconds count from their launch
        try:
            for wave in sorted({p.wave for p in placements}):
                members = [p for p in placements if p.wave == wave]
                for p in members:
                    options = {**engine_kwargs, **p.engine_kwargs}
                    if ahead:
                        replica = ahead[p.index]
                        replica.assign(model, options, setup)
                    else:
                        replica = spawn(model, options, p.env, p.index, setup)
                    self._replicas[p.index] = replica
                self._await_ready(members, start_timeout)
        except BaseException:
            self.close(timeout=5.0)  # replicas still starting would read their stop only once ready
            for i, replica in enumerate(ahead or ()):
                if self._replicas[i] is None:  # a later wave's, never given its engine
                    replica.stop()
            raise
        self._started_all()
        self._collector = threading.Thread(target=self._collect, name="vllm-eval-replica-results", daemon=True)
        self._collector.start()

    def describe(self, index: int) -> str:
        return self.placements[index].describe()

    def _await_ready(self, members: list[Placement], timeout: float) -> None:
        waiting = {p.index: p for p in members}
        deadline = timeout
        while waiting:
            message = self._receive([p.index for p in waiting.values()], 5.0)
            if message is None:
                deadline -= 5.0
                for p in waiting.values():
                    proc = self._replicas[p.index].proc
                    if not proc.is_alive():
                        raise ReplicaError(f"{p.describe()} exited with code {proc.exitcode} while starting") from None
                if deadline <= 0:
                    raise ReplicaError(
                        f"{', '.join(p.describe() for p in waiting.values())} not ready after {timeout:.0f} s"
                    ) from None
                continue
            kind, index, info, _ = message
            if kind == "failed":
                raise ReplicaError(f"{waiting.get(index, members[0]).describe()} failed to start: {info}")
            info, marks = info
            if self.info is None:
                self.info = info
            waiting.pop(index, None)
            self._ready(index, start_breakdown(self.started_at, marks))

    def _send(self, index: int, job_id: int, fn: Callable[[Any, Any], Any], payload: Any) -> None:
        self._replicas[index].inbox.put((job_id, fn, payload))

    def _receive(self, indices: list[int], timeout: float) -> tuple | None:
        """The next message from one of replicas ``indices``, or None after ``timeout`` seconds (or from a
        replica whose pipe ended: its death is found by :meth:`_check`)."""
        from multiprocessing.connection import wait

        started = (self._replicas[i] for i in indices)
        readers = [r.reader for r in started if r is not None and not r.reader.closed]
        if not readers:
            time.sleep(timeout)
            return None
        try:
            ready = wait(readers, timeout)
        except (OSError, ValueError):  # a reader closed meanwhile by the other thread reading (close())
            return None
        for reader in ready:
            # One thread at a time: the collector and close() both read, and a pipe that ended was closed by one
            # while the other read it (EBADF, then a second close of the same descriptor; seen on an H100).
            with self._reading:
                if reader.closed:
                    continue
                try:
                    return reader.recv()
                except (EOFError, OSError):  # the replica is gone
                    reader.close()
        return None

    def _collect(self) -> None:
        while not self._closed:
            live = [i for i in self._outstanding if i not in self._dead]
            try:
                message = self._receive(live, 2.0)
            except (OSError, ValueError):  # closed under us
                return
            if message is None:
                self._check()
                continue
            kind, job_id, value, index = message
            self._finished(index, job_id, kind == "done", value)

    def _check(self) -> None:
        """Replicas whose process died are lost (what they left behind is stopped)."""
        for p, replica in zip(self.placements, self._replicas, strict=True):
            if replica is None or p.index in self._dead or replica.proc.is_alive():
                continue
            kill_group(replica.proc.pid)
            self._lost(p.index, f"exited with code {replica.proc.exitcode}")

    def close(self, timeout: float = 60.0) -> None:
        """Stop every replica (each shuts its engine down), then reap the processes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        started = [r for r in self._replicas if r is not None]  # later waves may not be
        for replica in started:
            if replica.proc.is_alive():
                replica.inbox.put(None)
        deadline = time.monotonic() + timeout
        for proc in (r.proc for r in started):
            while proc.is_alive() and time.monotonic() < deadline:
                # Results still coming are read and dropped: a replica blocked sending one would never
                # read its stop (a pipe holds little; the queue before it buffered in a thread).
                self._receive(list(range(len(self._replicas))), 0.1)
                proc.join(0.1)
            if proc.is_alive():
                logger.warning("replica process %s did not stop in %.0f s; terminating", proc.name, timeout)
                proc.terminate()
                proc.join(10)
            if proc.exitcode not in (0, None):
                kill_group(proc.pid)
        self._fail_pending("the replica pool was closed")
        for replica in started:
            replica.inbox.close()
            replica.inbox.cancel_join_thread()
            with self._reading:
                replica.reader.close()
