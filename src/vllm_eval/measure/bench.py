"""Encode throughput harness: ``vllm-eval bench``.

Measures, side by side in one process and on the same texts, texts/s, tokens/s and per-call latency
of three backends:

* ``vllm``      — ours (:class:`~vllm_eval.models.encoder.VllmEncoder`: batch tokenization, token ids, dedup);
* ``st``        — sentence-transformers ``SentenceTransformer.encode`` (the reference);
* ``mteb-vllm`` — mteb's own ``VllmEncoderWrapper`` (the peer), fed the same texts, with the same
  engine options but without the process-wide settings our engines make (on small CPUs, computing
  on every core), i.e. as its users run it;
* ``remote``    — :class:`~vllm_eval.models.encoder.remote.RemoteEncoder` over running ``vllm serve`` endpoints
  (all of them, round-robin), to compare one server with several.

``replicas`` (``data_parallel_size`` / ``replicas_per_gpu``) applies to ``vllm``, so one engine
and N replicas are measured the same way.

A sparse model (SPLADE, BGE-M3: :func:`sparse_flavour_of`) is measured as the ``sparse_encoder`` kind: ``vllm``
(:class:`~vllm_eval.models.sparse_encoder.vllm.VllmSparseEncoder`, rows kept sparse) against its reference,
``st`` (sentence-transformers' ``SparseEncoder.encode``, sparse tensors) for SPLADE or ``hf`` (transformers and
BGE-M3's head) for BGE-M3's lexical weights (:data:`SPARSE_BACKENDS`); the other backends have no sparse output
and are refused in one line.

Texts of controlled token length are built from the model's own vocabulary (whole-word entries,
one token each), so no data is downloaded: ``fixed:N`` gives N tokens per text including special
tokens, ``mixed:A-B`` lengths uniform in [A, B]. For each backend, dtype, length mode and batch
size (texts per encode call, i.e. the offered concurrency) the whole text set is encoded in calls of
that size; each call's wall time is one latency sample. Results go to ``bench.json`` and plots
(throughput vs latency with a log latency axis, as in mteb's vLLM docs; fp16 vs fp32; fixed vs mixed).
Numbers come only from here, never from timed tests.
"""

from __future__ import annotations

import gc
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..tasks.shaped import single_token_words
from ..utils.errors import UsageError, VllmEvalError
from ..utils.progress import input_bar

BACKENDS = ("vllm", "st", "mteb-vllm", "remote")
#: The bench's peer outside the backend table: mteb's own vLLM wrapper (runs an engine here).
PEER = "mteb-vllm"


def default_backends() -> list[str]:
    """The backends ``bench`` measures when none are named: those of :data:`BACKENDS` that run here (a served one
    needs ``endpoint``, so it is measured only when named)."""
    from ..models.backends import SERVED_BACKENDS, backend_names

    names = backend_names("encoder")
    return [b for b in BACKENDS if b == PEER or (b in names and b not in SERVED_BACKENDS)]


#: The backends that measure a sparse model, by flavour: ours, then the reference of its sparse output.
SPARSE_BACKENDS = {"splade": ("vllm", "st"), "bge-m3": ("vllm", "hf")}


def sparse_flavour_of(model: Any, revision: str | None = None) -> str | None:
    """``splade`` or ``bge-m3`` for a sparse model (a path, hub id or ``ModelRef``;
    :func:`~vllm_eval.models.sparse_encoder.base.sparse_flavour`), else None (a dense model, or one that cannot be
    resolved: its own error comes later)."""
    if model is None:
        return None
    from ..models.sparse_encoder.base import sparse_flavour
    from ..utils.modelinfo import ModelRef

    try:
        return sparse_flavour(ModelRef.resolve(model, revision))
    except VllmEvalError:
        return None


def sparse_reference(model: Any, revision: str | None = None) -> str:
    """The reference backend of a sparse model (:data:`SPARSE_BACKENDS`): ``hf`` for BGE-M3 (its
    sentence-transformers modules give the dense vector, not the lexical weights), else ``st`` (SPLADE, and a model
    that cannot be read, whose own error comes later). ``compare`` and ``run --check-parity`` both ask here."""
    return SPARSE_BACKENDS[sparse_flavour_of(model, revision) or "splade"][1]


def check_sparse_backends(flavour: str, backends: Sequence[str]) -> None:
    """Refuse the backends that cannot measure a ``flavour`` sparse model.

    Raises:
        UsageError: naming them and the ones that can.
    """
    bad = [b for b in backends if b not in SPARSE_BACKENDS[flavour]]
    if bad:
        raise UsageError(
            f"bench of a sparse model ({flavour}) measures --backends {' '.join(SPARSE_BACKENDS[flavour])}, not "
            f"{' '.join(bad)} (no sparse output there)"
        )


@dataclass
class BenchRecord:
    """One measured configuration. Latencies in seconds, throughputs per second of wall time."""

    backend: str
    dtype: str
    lengths: str
    batch_size: int
    n_texts: int
    n_tokens: int
    seconds: float
    texts_per_s: float
    tokens_per_s: float
    latency_p50_s: float
    latency_p95_s: float
    calls: int
    #: Seconds to make the backend ready: engine start (all replicas) for vLLM, model load for ST.
    start_s: float = 0.0
    #: With replicas: seconds from their start until each was ready, in replica order.
    replica_ready_s: list[float] = field(default_factory=list)
    #: Model FLOPs utilisation (0-1): ``tokens_per_s * 2 * parameters`` over :attr:`peak_tflops` (None: unknown).
    mfu: float | None = None
    #: The dense peak for the computing dtype (fp8 under ``quantization="fp8"``) of every GPU the backend ran on
    #: (replicas x tensor-parallel size), TFLOP/s.
    peak_tflops: float | None = None


def parse_lengths(spec: str) -> tuple[int, int]:
    """``"fixed:130"`` → (130, 130); ``"mixed:16-500"`` → (16, 500).

    Raises:
        UsageError: any other form, or lengths below 3 (two special tokens plus one word).
    """
    kind, _, arg = spec.partition(":")
    try:
        if kind == "fixed":
            lo = hi = int(arg)
        elif kind == "mixed":
            a, b = arg.split("-")
            lo, hi = int(a), int(b)
        else:
            raise ValueError
    except ValueError:
        raise UsageError(f"lengths must be 'fixed:N' or 'mixed:A-B', got {spec!r}") from None
    if lo < 3 or hi < lo:
        raise UsageError(f"lengths need 3 <= A <= B, got {spec!r}")
    return lo, hi


def make_texts(tokenizer: Any, n: int, lengths: str, seed: int = 0) -> tuple[list[str], list[int]]:
    """``n`` texts of random vocabulary words with controlled token counts.

    Words are the tokenizer's own whole-word, alphabetic vocabulary entries that encode to exactly
    one token, so a text of ``L - 2`` words is ``L`` tokens with ``[CLS]``/``[SEP]``-style
    specials (checked by re-tokenizing).

    Returns:
        (texts, token counts including special tokens).
    """
    lo, hi = parse_lengths(lengths)
    rng = np.random.default_rng(seed)
    words = single_token_words(tokenizer)
    n_special = len(tokenizer("a")["input_ids"]) - len(tokenizer("a", add_special_tokens=False)["input_ids"])
    targets = rng.integers(lo, hi + 1, size=n)
    # One array for every draw: choice() on a list converts the whole vocabulary on each call (77 of 97 s
    # for 20,000 texts). The draws, and so the texts, are the same.
    vocab = np.asarray(words)
    texts = [" ".join(rng.choice(vocab, size=max(int(t) - n_special, 1))) for t in targets]
    counts = [len(x) for x in tokenizer(texts)["input_ids"]]
    return texts, counts


def _time_calls(
    encode: Callable[[list[str]], Any], texts: list[str], batch_size: int, desc: str
) -> tuple[float, list[float]]:
    latencies = []
    start = time.perf_counter()
    with input_bar(desc, -(-len(texts) // batch_size), "calls") as advance:
        for i in range(0, len(texts), batch_size):
            t0 = time.perf_counter()
            encode(texts[i : i + batch_size])
            latencies.append(time.perf_counter() - t0)
            advance(1)
    return time.perf_counter() - start, latencies


class _Backend:
    """One measured backend: ours through the backend table, or mteb's wrapper (the peer); ``encode(texts)``."""

    def __init__(
        self,
        name: str,
        model: str,
        dtype: str,
        engine_kwargs: dict[str, Any],
        *,
        st_batch_size: int = 128,
        replicas: dict[str, int] | None = None,
        remote: dict[str, Any] | None = None,
        flavour: str | None = None,
    ):
        from ..models.backends import is_remote, load_backend

        self.name = self.label = name
        #: GPUs the throughput comes from (the MFU divides by their peak): ours' replicas x tensor-parallel size.
        self.devices = 1
        if flavour is not None:
            self._sparse(name, model, dtype, engine_kwargs, st_batch_size, replicas)
            return
        if name == PEER:
            self.obj, self.encode = _mteb_vllm(model, dtype, engine_kwargs)
            self.devices = engine_kwargs.get("tensor_parallel_size") or 1
            return
        if name == "vllm":
            r = dict(replicas or {})
            self.obj = load_backend(
                "encoder", "vllm", model, dtype=dtype, show_progress_bar=False, **r, **engine_kwargs
            )
            self.label = _replica_label(self.obj, r)
            self.devices = self.obj.accelerators
            # Distinct texts only: dedup must not flatter the numbers.
            self.encode = self.obj.encode_texts
        elif name == "st":
            self.obj = load_backend(
                "encoder", "st", model, dtype=dtype, show_progress_bar=False, batch_size=st_batch_size
            )
            self.encode = lambda texts: self.obj.st.encode(
                texts, batch_size=self.obj.batch_size, show_progress_bar=False, convert_to_numpy=True
            )
        elif is_remote("encoder", name):
            from ..models.http import HttpOptions

            if not remote or not remote.get("endpoints"):
                raise UsageError(f"the {name} backend needs endpoints")
            http = HttpOptions(
                tuple(remote["endpoints"]),
                api_key=remote.get("api_key"),
                batch_size=remote.get("batch_size", 64),
                max_concurrency=remote.get("max_concurrency", 8),
            )
            # The servers' dtype is what they were started with; the record's dtype names the run.
            extra = {"encoding_format": "base64"} if name == "remote" else {}
            self.obj = load_backend("encoder", name, None, http=http, show_progress_bar=False, **extra)
            self.encode = self.obj.encode_texts
            self.label = f"{name}-{len(remote['endpoints'])}ep"
        else:
            self.obj = load_backend("encoder", name, model, show_progress_bar=False)
            self.encode = self.obj.encode_texts

    def _sparse(self, name: str, model: str, dtype: str, engine_kwargs: dict[str, Any], st_batch_size: int,
                replicas: dict[str, int] | None) -> None:  # fmt: skip
        """A sparse model's backend (the ``sparse_encoder`` kind); ``encode(texts)`` gives its sparse vectors."""
        from ..models.backends import load_backend

        quiet = {"dtype": dtype, "show_progress_bar": False}
        if name == "vllm":
            r = dict(replicas or {})
            self.obj = load_backend("sparse_encoder", "vllm", model, **quiet, **r, **engine_kwargs)
            self.label = _replica_label(self.obj, r)
            self.devices = self.obj.accelerators
            self.encode = self.obj.encode_sparse  # distinct texts, rows kept sparse (CSR)
        elif name == "st":
            self.obj = load_backend("sparse_encoder", "st", model, **quiet, batch_size=st_batch_size)
            # SparseEncoder.encode as its users call it (sparse tensors), as SentenceTransformer.encode for dense ones.
            self.encode = lambda texts: self.obj.st.encode(
                texts, batch_size=self.obj.batch_size, show_progress_bar=False, convert_to_sparse_tensor=True
            )
        else:
            self.obj = load_backend("sparse_encoder", name, model, **quiet)
            self.encode = self.obj.encode_sparse

    def close(self) -> None:
        if self.name == PEER:
            llm = getattr(self.obj, "llm", None)
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()
            self.obj.llm = None
        else:
            self.obj.close()
        gc.collect()


def _replica_label(backend: Any, given: dict[str, Any]) -> str:
    """``vllm`` for one engine, else the layout started, e.g. ``vllm-dp2`` (two GPUs), ``vllm-dp1x4`` (4 replicas on
    one GPU), ``-ray`` on Ray: read from ``backend.layout`` (the layout a GPU machine chose when none was given),
    ``given`` (``data_parallel_size``, ``replicas_per_gpu``, ``ray_address``) where the backend has none."""
    layout = getattr(backend, "layout", None)
    dp = getattr(layout, "data_parallel_size", None) or given.get("data_parallel_size") or 1
    rpg = getattr(layout, "replicas_per_gpu", None) or given.get("replicas_per_gpu") or 1
    ray = given.get("ray_address")
    if dp == 1 and rpg == 1 and not ray:
        return "vllm"
    return f"vllm-dp{dp}" + (f"x{rpg}" if rpg != 1 else "") + ("-ray" if ray else "")


def mteb_vllm_wrapper(model: str, dtype: str, engine_kwargs: dict[str, Any]) -> Any:
    """mteb's own ``VllmEncoderWrapper`` for ``model``, as its users get it: offline metadata (its
    default ``from_hub`` needs the network), our engine options and platform defaults (on CPU:
    float32, eager, a fixed KV reserve), but none of the process-wide settings our engines make."""
    from mteb.models.vllm_wrapper import VllmEncoderWrapper

    from ..engine.args import default_engine_kwargs, normalize_engine_kwargs
    from ..engine.procenv import without_our_env
    from ..utils.modelinfo import build_model_meta, resolve_model

    path = resolve_model(model)
    # mteb's wrapper loads ModelMeta.name with vLLM, so the name must be the local path.
    meta = build_model_meta(path).model_copy(update={"name": path})
    extra = {k: v for k, v in default_engine_kwargs(engine_kwargs, path).items() if k != "trust_remote_code"}
    extra.update(normalize_engine_kwargs(engine_kwargs))  # vLLM's names only: head_dtype folded, ours left out
    extra["dtype"] = dtype
    # The peer as its users get it: without the process-wide settings our own engines made.
    with without_our_env():
        return VllmEncoderWrapper(meta, trust_remote_code=False, **extra)


def _mteb_vllm(model: str, dtype: str, engine_kwargs: dict[str, Any]):
    """mteb's wrapper (:func:`mteb_vllm_wrapper`) and an ``encode(texts)`` that feeds it as mteb does."""
    from torch.utils.data import DataLoader

    from ..tasks.offline import LeeDocSimilarity

    wrapper = mteb_vllm_wrapper(model, dtype, engine_kwargs)
    task = LeeDocSimilarity.metadata

    def encode(texts: list[str]):
        loader = DataLoader(
            [{"text": t} for t in texts],
            batch_size=max(len(texts), 1),
            collate_fn=lambda b: {"text": [x["text"] for x in b]},
        )
        return wrapper.encode(loader, task_metadata=task, hf_split="test", hf_subset="default")

    return wrapper, encode


def run_bench(
    model: str,
    *,
    backends: Sequence[str] = BACKENDS,
    dtypes: Sequence[str] = ("float32",),
    lengths: Sequence[str] = ("fixed:130", "mixed:16-500"),
    batch_sizes: Sequence[int] = (64, 512, 2000),
    n_texts: int = 2000,
    warmup: int = 64,
    seed: int = 0,
    engine_kwargs: dict[str, Any] | None = None,
    st_batch_size: int = 128,
    replicas: Sequence[dict[str, int]] | dict[str, int] | None = None,
    remote: dict[str, Any] | None = None,
    output_dir: str | Path | None = None,
) -> list[BenchRecord]:
    """Measure every backend × dtype × lengths × batch size on the same generated texts.

    A backend's model is loaded once per dtype and warmed up on ``warmup`` other texts before timing; vLLM's
    prefix caching is off unless ``engine_kwargs`` turns it on (the passes re-encode the same texts).
    ``engine_kwargs`` (vLLM ``EngineArgs``) go to both vLLM backends, ``replicas``
    (``data_parallel_size``, ``replicas_per_gpu``; a list measures ours once per entry) to ours,
    ``remote`` (``endpoints``, ``api_key``,
    ``batch_size``, ``max_concurrency``) to the remote one, whose servers must serve ``model``
    (its tokenizer builds the texts). Writes ``bench.json`` and the plots to ``output_dir`` when given.
    """
    from transformers import AutoTokenizer

    from ..utils.modelinfo import ModelRef, safetensors_stats

    model = ModelRef.resolve(model).path
    flavour = sparse_flavour_of(model)
    if flavour is not None:
        check_sparse_backends(flavour, backends)
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts_by_len = {spec: make_texts(tokenizer, n_texts, spec, seed) for spec in lengths}
    warm_texts = make_texts(tokenizer, warmup, lengths[0], seed + 1)[0]
    snapshot = ModelRef.resolve(model).snapshot
    n_parameters = safetensors_stats(snapshot)[0] if snapshot else None
    # Every batch size encodes the same texts again: vLLM's prefix caching (on by default for causal pooling models)
    # would serve the later passes from its KV cache (an 8B model "ran" 252,037 tok/s, 4x the H200's bf16 peak, on
    # 64 texts it had been warmed up on). A user's run keeps vLLM's default; the bench measures the computation.
    engine_kwargs = {"enable_prefix_caching": False, **(engine_kwargs or {})}
    layouts = [replicas] if isinstance(replicas, dict) or replicas is None else list(replicas) or [None]
    runs = [(backend, layout) for backend in backends for layout in (layouts if backend == "vllm" else [None])]
    records: list[BenchRecord] = []
    for backend, layout in runs:
        for dtype in dtypes:
            started = time.perf_counter()
            b = _Backend(
                backend,
                model,
                dtype,
                dict(engine_kwargs),
                st_batch_size=st_batch_size,
                replicas=layout,
                remote=remote,
                flavour=flavour,
            )
            start_s = round(time.perf_counter() - started, 2)
            pool = getattr(b.obj, "pool", None)
            ready = [pool.ready_seconds[i] for i in sorted(pool.ready_seconds)] if pool is not None else []
            print(f"{b.label} {dtype}: ready in {start_s:.1f} s" + (f" (replicas: {ready} s)" if ready else ""))
            try:
                b.encode(warm_texts)
                for spec in lengths:
                    for bs in batch_sizes:
                        r = _measure(b, dtype, spec, texts_by_len[spec], bs, start_s, ready)
                        computing = _computing_dtype(backend, dtype, engine_kwargs)
                        records.append(_with_mfu(r, n_parameters, computing, b.devices))
            finally:
                b.close()
    if output_dir:
        _save(records, Path(output_dir), model, n_texts, engine_kwargs, layouts, remote, st_batch_size)
    return records


def _computing_dtype(backend: str, dtype: str, engine_kwargs: dict[str, Any]) -> str:
    """The dtype the matrix products run in: fp8 where vLLM quantizes to it, else ``dtype``."""
    quantized = backend in ("vllm", "mteb-vllm") and engine_kwargs.get("quantization") == "fp8"
    return "fp8" if quantized else dtype


def _with_mfu(r: BenchRecord, n_parameters: int | None, dtype: str, devices: int = 1) -> BenchRecord:
    """``r`` with its MFU against the peak of its ``devices`` for ``dtype`` (utils.telemetry), printed beside it;
    ``peak_tflops`` is theirs together."""
    from ..utils.telemetry import device_name, mfu, peak_flops

    device = device_name()
    util, peak = mfu(r.tokens_per_s, n_parameters, device, dtype, devices), peak_flops(device, dtype)
    if util is None or peak is None:
        return r
    many = f"{devices} x " if devices > 1 else ""
    print(
        f"{'':10s} MFU {util:.0%} of {many}{device}'s {peak / 1e12:,.0f} TFLOP/s {dtype} "
        f"({n_parameters / 1e9:.2f} B params)"
    )
    return replace(r, mfu=round(util, 4), peak_tflops=round(peak * devices / 1e12, 1))


def _measure(
    b: Any, dtype: str, spec: str, texts_counts: tuple[list[str], list[int]], bs: int, start_s: float, ready: list
) -> BenchRecord:
    """Time ``b.encode`` over the texts of one lengths spec in calls of ``bs`` texts; print the line."""
    texts, counts = texts_counts
    seconds, lat = _time_calls(b.encode, texts, bs, f"{b.label} {dtype} {spec} bs{bs}")
    r = BenchRecord(
        backend=b.label,
        dtype=dtype,
        lengths=spec,
        batch_size=bs,
        n_texts=len(texts),
        n_tokens=int(sum(counts)),
        seconds=round(seconds, 3),
        texts_per_s=round(len(texts) / seconds, 1),
        tokens_per_s=round(sum(counts) / seconds, 1),
        latency_p50_s=round(float(np.percentile(lat, 50)), 4),
        latency_p95_s=round(float(np.percentile(lat, 95)), 4),
        calls=len(lat),
        start_s=start_s,
        replica_ready_s=ready,
    )
    print(
        f"{b.label:10s} {dtype:9s} {spec:14s} bs={bs:<6d} {r.tokens_per_s:>10.0f} tok/s "
        f"{r.texts_per_s:>8.1f} texts/s  p50 {r.latency_p50_s:.3f} s"
    )
    return r


def _save(
    records: list[BenchRecord],
    out: Path,
    model: str,
    n_texts: int,
    engine_kwargs: dict[str, Any] | None,
    layouts: list[Any],
    remote: dict[str, Any] | None,
    st_batch_size: int,
) -> None:
    """``bench.json`` (records, versions, machine, settings) and the plots, in ``out``."""
    from ..evaluation.results import package_versions

    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model,
        "versions": package_versions(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "n_texts": n_texts,
        "engine_kwargs": engine_kwargs or {},
        "replicas": [x for x in layouts if x],
        "endpoints": (remote or {}).get("endpoints"),
        "st_batch_size": st_batch_size,
        "records": [asdict(r) for r in records],
    }
    try:
        import torch

        payload["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # device naming is informational only
        payload["device"] = "unknown"
    (out / "bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(records, out)


def print_best(records: Sequence[BenchRecord]) -> None:
    """Each backend's best tokens/s per dtype and lengths, with its ratios to the reference and the peer."""
    from ..models.kinds import get_kind

    best: dict[tuple[str, str, str], float] = {}
    for r in records:
        key = (r.backend, r.dtype, r.lengths)
        best[key] = max(best.get(key, 0.0), r.tokens_per_s)
    peers = (get_kind("encoder").reference_backend, PEER)
    print(f"\nbest tokens/s per backend, dtype, lengths (ratios to {' and to '.join(peers)}):")
    for (backend, dtype, spec), tps in sorted(best.items()):
        ratios = [
            f"{tps / ref:.2f}x {name}" for name in peers if name != backend and (ref := best.get((name, dtype, spec)))
        ]
        print(f"  {backend:12s} {dtype:9s} {spec:14s} {tps:>10.0f}  " + "  ".join(ratios))


def plot(records: Sequence[BenchRecord], out_dir: str | Path) -> list[Path]:
    """Write ``throughput_latency.png``, ``dtype.png`` and ``lengths.png``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    paths = []
    combos = sorted({(r.dtype, r.lengths) for r in records})
    fig, axes = plt.subplots(1, len(combos), figsize=(5 * len(combos), 4), squeeze=False)
    for ax, (dtype, spec) in zip(axes[0], combos):
        for backend in sorted({r.backend for r in records}):
            rs = sorted(
                (r for r in records if r.backend == backend and r.dtype == dtype and r.lengths == spec),
                key=lambda r: r.batch_size,
            )
            if rs:
                ax.plot([r.latency_p50_s for r in rs], [r.tokens_per_s for r in rs], marker="o", label=backend)
                for r in rs:
                    ax.annotate(str(r.batch_size), (r.latency_p50_s, r.tokens_per_s), fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("latency per call, p50 (s, log)")
        ax.set_ylabel("tokens / s")
        ax.set_title(f"{dtype}, {spec}")
        ax.legend()
    fig.tight_layout()
    paths.append(out / "throughput_latency.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    for key, name in (("dtype", "dtype.png"), ("lengths", "lengths.png")):
        best: dict[tuple[str, str], float] = {}
        for r in records:
            k = (r.backend, getattr(r, key))
            best[k] = max(best.get(k, 0.0), r.tokens_per_s)
        backends = sorted({b for b, _ in best})
        groups = sorted({g for _, g in best})
        fig, ax = plt.subplots(figsize=(6, 4))
        width = 0.8 / max(len(groups), 1)
        for j, g in enumerate(groups):
            ax.bar(
                [i + j * width for i in range(len(backends))],
                [best.get((b, g), 0.0) for b in backends],
                width=width,
                label=g,
            )
        ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(backends))], backends)
        ax.set_ylabel("best tokens / s")
        ax.set_title("fp16 vs fp32" if key == "dtype" else "fixed vs mixed lengths")
        ax.legend()
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths
