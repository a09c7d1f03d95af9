"""Engine sizes derived from the model and the GPU: tokens and sequences per pooling step, each engine's share of
GPU memory, and the layout (GPUs, replicas per GPU, tensor-parallel size) a run takes when the user names none.

Why: one fixed pooling budget (131,072 tokens a step, chosen on BERT-base, whose steps are bound by per-request
work) made an 8B embedder's steps 6 GiB matrices (``gate_up_proj``: 131,072 x 24,576 x 2 bytes) on top of a
profile that the command's own scoring processes then broke; the run died out of memory on an 80 GB H100. Here a
step holds about the FLOPs of BERT-base's 131,072 tokens (a step that size keeps an H100's matrix units busy
already), never fewer tokens than one whole prompt, and its activations fit the engine's share; that share leaves
room for the scoring this command runs on the same GPU (:data:`SCORING_RESERVE_BYTES`).

Everything is read from the model's ``config.json`` as plain JSON and from NVML: no vLLM, no torch, no CUDA context
(a parent of GPU replicas plans them before its own imports).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Most tokens and sequences per pooling step (vLLM's are 8,192-16,384 / 256, sized for generation): with them an
#: H100 embedded 2x more tokens/s for BERT-base fp16 (253k -> 505k tok/s, ``vllm-eval bench``).
GPU_POOLING_MAX_NUM_BATCHED_TOKENS = 131072
GPU_POOLING_MAX_NUM_SEQS = 1024
#: Fewest tokens per pooling step we choose (a smaller step of a big model idles the GPU between steps).
GPU_POOLING_MIN_NUM_BATCHED_TOKENS = 32768
#: FLOPs of one pooling step: BERT-base's layers (85 M parameters, 2 FLOPs each per token) at 131,072 tokens.
STEP_FLOPS = 2 * 85_000_000 * GPU_POOLING_MAX_NUM_BATCHED_TOKENS
#: Share of a GPU's memory the engines on it take when it is free (vLLM's own default).
GPU_MEMORY_SHARE = 0.9
#: What one process of ours scoring on the GPU beside the engines may hold: its CUDA context (~0.5 GiB), a block
#: of scores (``models.encoder.search.DEVICE_BYTES``, 1 GiB) and its headroom (0.5 GiB).
SCORER_BYTES = 2 * 1024**3
#: Processes that may score on one GPU beside an engine: the command's and up to four task processes
#: (``evaluation.concurrency.MAX_DEFAULT_WORKERS``, also for a sweep of models bigger than
#: :data:`FOUR_REPLICAS_MAX_PARAMS`; on several GPUs each task process scores on one of them). Two
#: task processes next to an 8B engine held 1.3 and 2.2 GB of an H100 and the engine's next step ran out of memory.
SCORING_PROCESSES = 5
SCORING_RESERVE_BYTES = SCORING_PROCESSES * SCORER_BYTES
#: Parameters at or below which a GPU gets 4 replicas of a pooling model, and 2: one engine cannot keep a GPU
#: busy with a small model (per-request CPU work bounds it). On an H200: BERT-base fp16 1,275,592 tok/s with 4
#: replicas against 443,656 with one (side by side, docs/throughput.md); Qwen3-0.6B 436,021 with 4 against
#: 343,702 with one (two sessions); the 8B's one engine is at 62 % MFU already.
FOUR_REPLICAS_MAX_PARAMS = 1_000_000_000
TWO_REPLICAS_MAX_PARAMS = 5_000_000_000
#: Most of one GPU's memory a replica's weights may take before the layout splits the model over GPUs.
WEIGHTS_SHARE_MAX = 0.6
#: Tokens per step of a generation engine on a GPU where the user names none (vLLM's own default is 8,192 or 16,384
#: by GPU and entry point): fixed, so that the room a step's prompt log-probabilities take is known.
GPU_GENERATE_MAX_NUM_BATCHED_TOKENS = 8192
#: Bytes per prompt token and vocabulary entry that a step's prompt log-probabilities take on top of what vLLM
#: profiles (it profiles logits of one token per sequence): the logits in the model's dtype (2), their float32
#: log-softmax (4) and the float32 copy it is taken from (4). Without this room an 8B model scoring lm-eval's
#: multi-token options used 50 GB where vLLM had planned 10 (lm-evaluation-harness #2490, #2698).
PROMPT_LOGPROB_BYTES_PER_ENTRY = 10

#: ``model_type``s whose feed-forward block has no gate (two matrices, not three).
_UNGATED = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "nomic_bert", "new", "deberta-v2")
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs of a transformer, from its ``config.json`` (a multimodal model's ``text_config``).

    Attributes:
        layer_params: parameters of the transformer layers (embeddings left out); a token costs 2 FLOPs each.
        params: all parameters (``layer_params`` plus the token embeddings).
        weight_bytes: bytes of the weights at ``dtype_bytes`` each (fp8 quantisation: 1 per layer parameter).
        hidden, intermediate, layers: the widths and depth.
        dtype_bytes: bytes per activation value (2 for float16/bfloat16, 4 for float32).
        max_positions: ``max_position_embeddings`` (None when the config has none).
        max_len: the longest prompt vLLM will take without ``max_model_len`` given: sentence-transformers'
            ``max_seq_length`` where the folder has one and it is shorter (vLLM reads it too), else
            ``max_positions``.
        vocab: ``vocab_size`` (0 when the config has none).
        kv_bytes_per_token: bytes of one token's keys and values over every layer (vLLM's KV cache holds at least
            one sequence of the longest prompt, or the engine does not start).
        vision_params: parameters of a multimodal model's vision tower (``vision_config``), in ``params`` and
            ``weight_bytes`` (16-bit under fp8 too), not in ``layer_params``.
    """

    layer_params: int
    params: int
    weight_bytes: int
    hidden: int
    intermediate: int
    layers: int
    dtype_bytes: int
    max_positions: int | None
    max_len: int | None = None
    vocab: int = 0
    kv_bytes_per_token: int = 0
    vision_params: int = 0

    @property
    def activation_bytes_per_token(self) -> int:
        """Bytes one token's activations take at the widest point of a layer: the gated feed-forward input and
        output (3 x intermediate), the residual, norm and attention projections (6 x hidden)."""
        return self.dtype_bytes * (3 * self.intermediate + 6 * self.hidden)


def _json_file(model: str | os.PathLike, name: str, revision: str | None = None) -> dict[str, Any] | None:
    """The JSON object in file ``name`` of ``model``'s folder (a hub id: its cached snapshot, read by the checked
    reader), else None: no such file, or one the checked reader refuses (the command's own checks name it)."""
    from ..utils.errors import VllmEvalError
    from ..utils.modelinfo import local_snapshot, model_json

    folder = local_snapshot(os.fspath(model), revision)
    if folder is None or not (Path(folder) / name).is_file():
        return None
    try:
        return model_json(Path(folder) / name)
    except VllmEvalError:
        return None


def model_shape(model: str | os.PathLike, engine_kwargs: dict[str, Any] | None = None) -> ModelShape | None:
    """The :class:`ModelShape` of ``model`` (a folder, or a hub id's cached snapshot), or None where its
    ``config.json`` is missing, unreadable or lacks the sizes (sizing then falls back to the fixed defaults).

    Parameters are counted from the config, as a dense transformer has them (attention with grouped keys and
    values, a gated or plain feed-forward block): within a few percent of the safetensors count for BERT-base
    and Qwen3-8B. The dtype is ``engine_kwargs["dtype"]``, else the config's, else 2 bytes.
    """
    engine_kwargs = engine_kwargs or {}
    config = _json_file(model, "config.json", engine_kwargs.get("revision"))
    if config is None:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        hidden, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        vocab = int(text.get("vocab_size") or 0)
        max_positions = text.get("max_position_embeddings")
        max_positions = int(max_positions) if max_positions else None
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    gated = str(text.get("model_type") or "") not in _UNGATED
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    layer_params = layers * (attention + (3 if gated else 2) * hidden * intermediate)
    dtype = str(engine_kwargs.get("dtype") or text.get("torch_dtype") or text.get("dtype") or "bfloat16")
    width = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)
    fp8 = str(engine_kwargs.get("quantization") or "").startswith("fp8")
    vision = _vision_params(config.get("vision_config"))
    weight_bytes = layer_params * (1 if fp8 else width) + (vocab * hidden + vision) * width
    st_len = (_json_file(model, "sentence_bert_config.json", engine_kwargs.get("revision")) or {}).get("max_seq_length")
    lengths = [n for n in (max_positions, st_len) if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return ModelShape(
        max_len=min(lengths) if lengths else None,
        layer_params=layer_params,
        params=layer_params + vocab * hidden + vision,
        weight_bytes=weight_bytes,
        hidden=hidden,
        intermediate=intermediate,
        layers=layers,
        dtype_bytes=width,
        max_positions=max_positions,
        vocab=vocab,
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * width,
        vision_params=vision,
    )


def _vision_params(vision: Any) -> int:
    """Parameters of a vision tower from its config (Qwen2.5-VL's ``depth``, SigLIP's and CLIP's
    ``num_hidden_layers``): attention (4 x hidden^2) and a feed-forward block (3 matrices when gated, as Qwen2.5-VL's
    ``silu`` one, else 2) per block; 0 without one, or where the sizes are missing."""
    if not isinstance(vision, dict):
        return 0
    try:
        hidden = int(vision.get("hidden_size") or vision.get("embed_dim"))
        blocks = int(vision.get("depth") or vision.get("num_hidden_layers"))
        intermediate = int(vision.get("intermediate_size") or 4 * hidden)
    except (TypeError, ValueError):
        return 0
    gated = vision.get("hidden_act") == "silu" and "depth" in vision
    return blocks * (4 * hidden * hidden + (3 if gated else 2) * hidden * intermediate)


def is_encoder_decoder(model: str | os.PathLike, revision: str | None = None) -> bool:
    """True when ``model``'s ``config.json`` says ``is_encoder_decoder`` (Whisper): False where it cannot be read."""
    config = _json_file(model, "config.json", revision)
    return bool(config and config.get("is_encoder_decoder"))


def _pow2_near(x: float) -> int:
    """The power of two nearest ``x`` on a log scale (at least 1)."""
    return 1 << max(0, round(math.log2(max(x, 1.0))))


def longest_prompt(shape: ModelShape | None, engine_kwargs: dict[str, Any]) -> int | None:
    """The longest prompt an engine with ``engine_kwargs`` takes: their ``max_model_len``, else the model's
    (:attr:`ModelShape.max_len`, as vLLM reads it); None where neither is known."""
    return engine_kwargs.get("max_model_len") or (shape.max_len if shape is not None else None)


def pooling_step(shape: ModelShape | None, max_model_len: int | None, memory_bytes: int | None) -> dict[str, int]:
    """``max_num_batched_tokens`` and ``max_num_seqs`` for a pooling engine on a GPU.

    Tokens: :data:`STEP_FLOPS` worth of ``shape``'s layers, as a power of two between
    :data:`GPU_POOLING_MIN_NUM_BATCHED_TOKENS` and :data:`GPU_POOLING_MAX_NUM_BATCHED_TOKENS`; halved while a step's
    activations would take more than a quarter of what ``memory_bytes`` (the engine's share) leaves beside the
    weights; never below ``max_model_len`` (a bidirectional model cannot split a prompt over steps). Sequences:
    :data:`GPU_POOLING_MAX_NUM_SEQS`, at most one per 16 tokens. Without a shape: the maxima (BERT-sized).

    Returns:
        ``{"max_num_batched_tokens": int, "max_num_seqs": int}``.
    """
    tokens = GPU_POOLING_MAX_NUM_BATCHED_TOKENS
    if shape is not None:
        tokens = _pow2_near(STEP_FLOPS / (2 * max(shape.layer_params, 1)))
        tokens = min(max(tokens, GPU_POOLING_MIN_NUM_BATCHED_TOKENS), GPU_POOLING_MAX_NUM_BATCHED_TOKENS)
        if memory_bytes:
            room = max(memory_bytes - shape.weight_bytes, 0) // 4
            while tokens > 1024 and tokens * shape.activation_bytes_per_token > room:
                tokens //= 2
    if max_model_len:
        tokens = max(tokens, int(max_model_len))
    return {"max_num_batched_tokens": tokens, "max_num_seqs": min(GPU_POOLING_MAX_NUM_SEQS, max(tokens // 16, 1))}


def memory_share(
    total: int, free: int | None = None, replicas: int = 1, scoring: bool = True, reserve: int = 0
) -> float:
    """Each of ``replicas`` engines' ``gpu_memory_utilization`` on a GPU of ``total`` bytes, ``free`` of them free
    now: :data:`GPU_MEMORY_SHARE` of it, less what another program holds and (``scoring``) the room the command's
    own scoring keeps (:data:`SCORING_RESERVE_BYTES`), split evenly, less ``reserve`` bytes each (room an engine
    uses beyond what vLLM profiles: :func:`prompt_logprob_reserve`), rounded down to 4 decimals. At least 0.05."""
    usable = GPU_MEMORY_SHARE * total
    if free is not None:
        usable = min(usable, free - (1 - GPU_MEMORY_SHARE) * total)
    if scoring:
        usable = min(usable, total - (1 - GPU_MEMORY_SHARE) * total / 2 - SCORING_RESERVE_BYTES)
    return max(math.floor((usable / replicas - reserve) / total * 1e4) / 1e4, 0.05)


def prompt_logprob_reserve(shape: ModelShape | None, tokens: int) -> int:
    """Bytes one step of ``tokens`` prompt tokens takes for their log-probabilities over ``shape``'s vocabulary
    (:data:`PROMPT_LOGPROB_BYTES_PER_ENTRY` per entry), which vLLM's memory profile leaves out; 0 without a shape.
    An 8B model with a 128,256-token vocabulary at 8,192 tokens a step: 10.5 GB."""
    return int(tokens) * shape.vocab * PROMPT_LOGPROB_BYTES_PER_ENTRY if shape is not None else 0


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES``, else NVML's count (no torch import: replicas are
    planned before the command's own imports), else torch's."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML here: torch knows
        pass
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


#: ``(free, total)`` bytes of each GPU as this process first read them (:func:`first_gpu_memory`).
_FIRST_READ: dict[str, tuple[int, int]] = {}
#: Memory other programs hold on a GPU below which nothing is said about it.
HELD_NOTE_BYTES = 1 << 30


def first_gpu_memory(device: str | None = None) -> tuple[int, int]:
    """:func:`gpu_memory` as this process first read it, before its own engines took any: a single engine's default
    share is taken from what was free then (another program's memory left out, as replicas leave it out), and stays
    the same for every later engine of the process, since engine options are an engine's identity (equal options
    share one engine). What other programs held then is said once, in the log ("62.1 GiB of the GPU's 139.8 GiB
    held by other programs").

    Returns: ``(free, total)`` bytes."""
    key = device or (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    if key not in _FIRST_READ:
        free, total = gpu_memory(device)
        _FIRST_READ[key] = (free, total)
        if total - free > HELD_NOTE_BYTES:
            logger.info(
                "%.1f GiB of the GPU's %.1f GiB held by other programs: engines take their share of the %.1f GiB free",
                (total - free) / 2**30,
                total / 2**30,
                free / 2**30,
            )
    return _FIRST_READ[key]


def engine_memory_share(user: dict[str, Any], model: str | None, replicas: int = 1) -> float | None:
    """The one rule for an engine's default ``gpu_memory_utilization`` on a GPU, whatever starts it: a single engine
    of this process, each of ``replicas`` engines sharing a GPU, a Ray actor (which reads it in its own process), of
    every kind. It is :func:`memory_share` of what was free before this process's engines
    (:func:`first_gpu_memory`, which says what other programs held): a pooling engine leaves room for the command's
    scoring, a generation engine room for a step's prompt log-probabilities over ``model``'s vocabulary
    (:func:`prompt_logprob_reserve` at ``user``'s ``max_num_batched_tokens``, else
    :data:`GPU_GENERATE_MAX_NUM_BATCHED_TOKENS`).

    Returns:
        The share (a fraction of the GPU's total), or None: the user chose the memory (``gpu_memory_utilization``
        or ``kv_cache_memory_bytes`` in ``user``), a speech-to-text model (encoder-decoder: vLLM's own share, as its
        RTFx was measured), or no GPU to read.
    """
    if "gpu_memory_utilization" in user or "kv_cache_memory_bytes" in user:
        return None
    pooling = user.get("runner") == "pooling"
    if not pooling and model and is_encoder_decoder(model, user.get("revision")):
        return None
    try:
        free, total = first_gpu_memory()
    except Exception:  # no GPU to ask (options read where no engine runs)
        return None
    if pooling:
        return memory_share(total, free, replicas)
    shape = model_shape(model, user) if model else None
    tokens = int(user.get("max_num_batched_tokens") or GPU_GENERATE_MAX_NUM_BATCHED_TOKENS)
    return memory_share(total, free, replicas, scoring=False, reserve=prompt_logprob_reserve(shape, tokens))


def check_fits(shape: ModelShape | None, share: float, free: int, total: int, tensor_parallel: int = 1) -> None:
    """Refuses, before any engine loads, a model whose weights alone take more than its memory share.

    Raises:
        UsageError: naming the weights, what is free and what other programs hold, and what would make it fit.
    """
    if shape is None or shape.weight_bytes / max(tensor_parallel, 1) <= share * total:
        return
    from ..utils.errors import UsageError

    gib = 2**30
    raise UsageError(
        f"the model's weights take {shape.weight_bytes / max(tensor_parallel, 1) / gib:.1f} GiB per GPU, more than "
        f"the {share * total / gib:.1f} GiB an engine can have: {free / gib:.1f} GiB of the GPU's {total / gib:.1f} "
        f"GiB is free ({(total - free) / gib:.1f} GiB held by other programs); free the GPU, or give "
        "--quantization fp8, --tensor-parallel-size N or --gpu-memory-utilization"
    )


def check_engine_fits(model: str, kwargs: dict[str, Any]) -> None:
    """:func:`check_fits` for an engine about to start on this process's GPU with options ``kwargs`` (its
    ``gpu_memory_utilization``, ``tensor_parallel_size``); nothing where the share or the GPU's memory is not known.

    Raises:
        UsageError: see :func:`check_fits`.
    """
    share = kwargs.get("gpu_memory_utilization")
    if share is None or kwargs.get("kv_cache_memory_bytes") is not None:
        return
    try:
        free, total = first_gpu_memory()
    except Exception:  # no memory reading: vLLM says what does not fit
        return
    shape = model_shape(model, kwargs)
    check_fits(shape, float(share), free, total, int(kwargs.get("tensor_parallel_size") or 1))


def gpu_memory(device: str | None = None) -> tuple[int, int]:
    """``(free, total)`` bytes of GPU ``device`` (default: the first visible; the GPUs of one machine are taken to
    be alike) through NVML (``pynvml``, which vLLM requires): no CUDA context is made in this process, and vLLM is
    not imported. NVML's command line answers when the module cannot, then vLLM's platform (total only)."""
    import subprocess

    visible = device or (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            by = pynvml.nvmlDeviceGetHandleByIndex if visible.isdigit() else pynvml.nvmlDeviceGetHandleByUUID
            info = pynvml.nvmlDeviceGetMemoryInfo(by(int(visible) if visible.isdigit() else visible))
            return int(info.free), int(info.total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py here: NVML's own command line
        pass
    try:
        query = ["nvidia-smi", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits", "-i", visible]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        free, total = (int(float(v) * 1024**2) for v in out.replace(",", " ").split()[:2])  # MiB
        return free, total
    except Exception:  # no NVML (another vendor's GPU): ask vLLM
        from vllm.platforms import current_platform

        total = int(current_platform.get_device_total_memory(0))
        return total, total


@dataclass(frozen=True)
class Layout:
    """Where a run's engines go: ``gpus`` GPUs in all, ``replicas_per_gpu`` engines on each group of
    ``tensor_parallel_size`` GPUs; ``data_parallel_size`` groups. ``chosen``: no layout flag was given (on a GPU
    machine the sizes were then chosen for the model, elsewhere they are 1); ``on_gpu`` False: the CPU build's
    replicas (core sets, no GPU)."""

    data_parallel_size: int
    replicas_per_gpu: int
    tensor_parallel_size: int
    chosen: bool
    on_gpu: bool = True

    @property
    def gpus(self) -> int:
        """GPUs the engines use (0 on the CPU build)."""
        return self.data_parallel_size * self.tensor_parallel_size if self.on_gpu else 0

    def as_json(self) -> dict[str, Any]:
        """What ``summary.json`` and ``suite.json`` keep of it."""
        return {
            "gpus": self.gpus,
            "data_parallel_size": self.data_parallel_size,
            "replicas_per_gpu": self.replicas_per_gpu,
            "tensor_parallel_size": self.tensor_parallel_size,
            "chosen": "default" if self.chosen else "user",
        }

    def describe(self) -> str:
        """The line printed at start: ``layout: 2 GPUs, 1 replica per GPU (chosen for the model and the GPUs)``."""
        tp = f", tensor parallel {self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
        how = "chosen for the model and the GPUs" if self.chosen else "as given"
        return (
            f"layout: {self.gpus} GPU{'s' if self.gpus > 1 else ''}, {self.replicas_per_gpu} "
            f"replica{'s' if self.replicas_per_gpu > 1 else ''} per GPU{tp} ({how})"
        )


def engine_bytes(shape: ModelShape, tensor_parallel: int, max_len: int | None, step_tokens: int) -> int:
    """Bytes each of ``tensor_parallel`` GPUs needs before an engine of ``shape`` can run: its part of the weights,
    of the KV cache of one ``max_len``-token sequence (vLLM refuses to start without room for one) and of one step's
    activations at ``step_tokens`` tokens (vLLM's memory profile)."""
    need = shape.weight_bytes + shape.kv_bytes_per_token * (max_len or 0)
    return math.ceil((need + shape.activation_bytes_per_token * step_tokens) / max(tensor_parallel, 1))


@dataclass(frozen=True)
class FitCheck:
    """What the layout checks a model against: ``budget`` bytes an engine may have of one GPU (its memory share),
    a sequence of ``max_len`` tokens, steps of ``step_tokens``; ``quantized``: the weights' size already counts
    the user's quantisation (so fp8 is not offered)."""

    budget: int
    max_len: int | None
    step_tokens: int
    quantized: bool = False


def _fp8(shape: ModelShape) -> ModelShape:
    """``shape`` with fp8 layer weights (the embeddings and the vision tower stay 16-bit, as vLLM's fp8 keeps them)."""
    from dataclasses import replace

    return replace(shape, weight_bytes=shape.weight_bytes - shape.layer_params * (shape.dtype_bytes - 1))


def _cannot_fit(shape: ModelShape, gpus: int, gpu_total: int, fit: FitCheck, tp: int) -> Exception:
    """The one-line refusal of a model no layout of these GPUs holds, with what would make it fit."""
    from ..utils.errors import UsageError

    gib = 2**30
    kv = shape.kv_bytes_per_token * (fit.max_len or 0)

    def fewest(of: ModelShape, sizes: tuple[int, ...]) -> int:
        return next((t for t in sizes if engine_bytes(of, t, fit.max_len, fit.step_tokens) <= fit.budget), 0)

    ways = []
    if not fit.quantized and shape.dtype_bytes > 1 and (n := fewest(_fp8(shape), (1, 2, 4, 8))):
        fp8 = _fp8(shape).weight_bytes / gib
        ways.append(f"with --quantization fp8 (weights {fp8:.1f} GiB) on {n} GPU{'s' * (n > 1)}")
    if (n := fewest(shape, (2, 4, 8, 16, 32, 64))) > gpus:
        ways.append(f"on {n} GPUs of this size (tensor parallelism over them, chosen when they are visible)")
    if shape.kv_bytes_per_token and fit.max_len:
        room = fit.budget * tp - engine_bytes(shape, 1, 0, fit.step_tokens)
        longest = (room // shape.kv_bytes_per_token) // 1024 * 1024
        if 1024 <= longest < fit.max_len:
            ways.append(f"with --max-model-len {longest}")
    return UsageError(
        f"the model does not fit {gpus} GPU{'s' * (gpus > 1)} of {gpu_total / gib:.1f} GiB: its weights "
        f"({shape.weight_bytes / gib:.1f} GiB) and one {fit.max_len or 0:,}-token sequence's KV cache "
        f"({kv / gib:.1f} GiB) need {engine_bytes(shape, tp, fit.max_len, fit.step_tokens) / gib:.1f} GiB per GPU over "
        f"{tp} GPU{'s' * (tp > 1)}, and an engine has {fit.budget / gib:.1f} GiB of each; it would fit "
        + (" or ".join(ways) if ways else "on GPUs with more memory")
    )


def default_layout(
    shape: ModelShape | None,
    gpus: int,
    gpu_total: int,
    *,
    pooling: bool,
    data_parallel_size: int | None = None,
    replicas_per_gpu: int | None = None,
    tensor_parallel_size: int | None = None,
    fit: FitCheck | None = None,
) -> Layout:
    """The layout of a run on a machine of ``gpus`` alike GPUs of ``gpu_total`` bytes: what the user gave, the
    rest chosen so that every GPU is used.

    - Tensor parallel size: the user's, else 1 unless the weights exceed :data:`WEIGHTS_SHARE_MAX` of one GPU or
      (with ``fit``) the model does not fit one (:func:`engine_bytes` over ``fit.budget``); then the smallest power
      of two of the GPUs here that holds it. A Qwen2.5-VL-72B in bf16: 2 H200s, 4 H100s; in fp8: 1 H200.
    - Data parallel size: the user's, else every GPU (``gpus // tensor_parallel_size``, at least 1): a
      tensor-parallel group's replicas over the rest.
    - Replicas per GPU: the user's, else for a pooling model of at most :data:`FOUR_REPLICAS_MAX_PARAMS` 4, of at
      most :data:`TWO_REPLICAS_MAX_PARAMS` 2, else 1 (generation keeps 1: its engine batches enough by itself;
      four engines of a 0.6B on one H200 evaluated HellaSwag no faster than one, docs/bench/h200-vllm033-0.6b);
      1 under tensor parallelism.

    Raises:
        UsageError: (with ``fit``, the tensor-parallel size not given) no power of two of these GPUs holds the
            model; the message says what would: fp8, more GPUs, a shorter ``--max-model-len``.
    """
    chosen = data_parallel_size is None and replicas_per_gpu is None
    tp = tensor_parallel_size
    if tp is None:
        tp = 1
        if shape is not None and gpu_total > 0:

            def short(t: int) -> bool:
                over = shape.weight_bytes / t > WEIGHTS_SHARE_MAX * gpu_total
                return over or (fit is not None and engine_bytes(shape, t, fit.max_len, fit.step_tokens) > fit.budget)

            while tp * 2 <= max(gpus, 1) and short(tp):
                tp *= 2
            if fit is not None and engine_bytes(shape, tp, fit.max_len, fit.step_tokens) > fit.budget:
                raise _cannot_fit(shape, max(gpus, 1), gpu_total, fit, tp)
    dp = data_parallel_size if data_parallel_size is not None else max(1, max(gpus, 1) // tp)
    rpg = replicas_per_gpu
    if rpg is None:
        rpg = 1
        if pooling and tp == 1 and shape is not None and data_parallel_size is None:
            rpg = 4 if shape.params <= FOUR_REPLICAS_MAX_PARAMS else 2 if shape.params <= TWO_REPLICAS_MAX_PARAMS else 1
    return Layout(data_parallel_size=dp, replicas_per_gpu=rpg, tensor_parallel_size=tp, chosen=chosen)
