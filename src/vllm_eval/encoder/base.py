"""``EncoderBase``: what every encoder backend shares (mteb's ``EncoderProtocol``).

A backend implements one hook, :meth:`EncoderBase._embed_chunk` (distinct texts in, float32 rows
out), and passes what it knows to the constructor: its mteb metadata, token limit, tokenizer and
prompts. The base does the rest the same way for every backend: prompts and instructions per task,
input checks, deduplication within a call, chunking with the next chunk tokenized while the current
one is embedded, the progress display and the truncation report. This is the one place where inputs
reach a backend, so what sits between (a cache) attaches here once for every backend.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.types import PromptType

from ..base import PoolingBackendBase
from ..progress import input_bar
from ..prompts import PromptResolver, check_texts, texts_from
from ..streaming import BatchTokenizer, chunked, flatten, loader_len, prefetched, warn_truncated


class _Chunk:
    """One chunk of distinct texts on its way through the stream: token ids, cache keys and hits."""

    def __init__(
        self, fresh: list[str], ids: list[list[int]], n_texts: int, keys: list[bytes], hits: dict[bytes, Any]
    ) -> None:
        self.fresh, self.ids, self.n_texts, self.keys, self.hits = fresh, ids, n_texts, keys, hits

    def missing(self) -> list[int]:
        """Positions (in ``fresh``) the backend must compute: all without a cache, else the misses."""
        if not self.keys:
            return list(range(len(self.fresh)))
        return [i for i, k in enumerate(self.keys) if k not in self.hits]

    def assemble(self, computed: np.ndarray | None, cache: Any) -> np.ndarray:
        """Rows of ``fresh`` in order, from the cache and the backend; new rows are stored (one transaction)."""
        if not self.keys:
            return computed
        miss = self.missing()
        if computed is not None and miss:
            cache.put_many((self.keys[i], computed[j]) for j, i in enumerate(miss))
        if not self.hits:
            return computed
        rows: list[np.ndarray] = [None] * len(self.fresh)  # type: ignore[list-item]
        for j, i in enumerate(miss):
            rows[i] = computed[j]
        for i, key in enumerate(self.keys):
            if rows[i] is None:
                rows[i] = self.hits[key]
        return np.stack(rows)


class EncoderBase(AbsEncoder, PoolingBackendBase, ABC):
    """Base of the encoder backends: mteb ``encode`` over one hook, :meth:`_embed_chunk`.

    Args:
        model: the resolved model path, hub id or served name (recorded in results).
        meta: mteb ``ModelMeta`` of the model (names the result folder, gives the similarity).
        prompting: the task prompts (see :func:`vllm_eval.prompts.resolve_prompting`).
        max_length: token limit including special tokens (None: unknown, e.g. a server that
            does not say).
        tokenizer: a :class:`~vllm_eval.streaming.BatchTokenizer`; required when the class
            declares ``tokenizes_locally``.
        chunk_size: texts tokenized and handed to the backend per step.
        show_progress_bar: show a progress bar over each call's texts.

    Raises:
        UsageError: ``chunk_size`` < 1, or no tokenizer for a backend that tokenizes locally.
    """

    kind: ClassVar[str] = "encoder"
    #: Chunks handed over before the oldest is collected (0: one at a time; replicas use more).
    max_in_flight: int = 0

    def __init__(
        self,
        *,
        model: str,
        meta: Any,
        prompting: PromptResolver,
        max_length: int | None,
        tokenizer: BatchTokenizer | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        super().__init__(
            model=model,
            model_ref=model_ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            tokenizer=tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    _recorded: list[str] | None = None
    _record_limit: int = 0
    _seen: int = 0

    def _account(self, item: _Chunk) -> None:
        """Count a prepared chunk into :attr:`counters` (and keep a few of its inputs when recording)."""
        if self._recorded is not None:
            # Reservoir sampling (Vitter's algorithm R, seeded): a uniform sample of everything sent.
            for text in item.fresh:
                self._seen += 1
                if len(self._recorded) < self._record_limit:
                    self._recorded.append(text)
                elif (j := self._rng.randrange(self._seen)) < self._record_limit:
                    self._recorded[j] = text
        c = self.counters
        c.inputs += item.n_texts
        c.distinct += len(item.fresh)
        if item.ids:
            c.tokens += sum(map(len, item.ids))
            c.compute_tokens += sum(len(item.ids[i]) for i in item.missing())

    def record_inputs(self, limit: int) -> None:
        """From now on keep a uniform sample of ``limit`` of the exact distinct texts sent to the model
        (after prompts; seeded, so repeatable); :meth:`recorded_inputs` returns them (for per-input
        parity checks). ``limit=0`` stops recording."""
        self._recorded, self._record_limit, self._seen = ([] if limit else None), int(limit), 0
        self._rng = random.Random(0)

    def recorded_inputs(self) -> list[str]:
        """The texts kept since :meth:`record_inputs` (empty when not recording)."""
        return list(self._recorded or [])

    @abstractmethod
    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        """Embed distinct ``texts`` (with their token ids when :attr:`tokenizes_locally`, else ``[]``).

        Returns:
            float32 array (len(texts), dim), one row per text, in order.
        """

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
            OptionError: an input that is not a str (named by index).
        """
        # Progress is the backend's own setting: mteb's encode_kwargs show_progress_bar drives mteb's bars.
        show = self.show_progress_bar
        batches = texts_from(inputs, self.prompting.prefix(task_metadata, prompt_type))
        return self._embed_stream(flatten(batches), total=loader_len(inputs), show_progress_bar=show)

    def encode_texts(self, texts: Sequence[str], *, show_progress_bar: bool | None = None) -> np.ndarray:
        """Embed ``texts`` exactly as given (no prompt or instruction), float32 (n_texts, dim)."""
        texts = check_texts(texts)
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        return self._embed_stream(iter(texts), total=len(texts), show_progress_bar=show)

    def _embed_stream(self, texts: Iterable[str], *, total: int | None, show_progress_bar: bool) -> np.ndarray:
        # Texts repeat a lot within one call (an STS task encodes each document once per pair it
        # is in: LeeDocSimilarity has 2,450 texts but 50 distinct), so each distinct text is
        # embedded once and its row reused. Chunk k+1 is deduplicated, tokenized and looked up in
        # the cache on a worker thread while the backend embeds chunk k (the fast tokenizer, SQLite
        # and the engine's IPC release the GIL), so none of that is on the critical path. Only the
        # cache's misses reach the backend; they are stored as each chunk completes.
        rows: dict[str, int] = {}
        order: list[int] = []
        parts: list[np.ndarray] = []
        counts = {"unique": 0, "truncated": 0}

        def prepare(chunk: list[str]) -> _Chunk:
            fresh: list[str] = []
            for t in chunk:
                if t not in rows:
                    rows[t] = counts["unique"] + len(fresh)
                    fresh.append(t)
                order.append(rows[t])
            counts["unique"] += len(fresh)
            ids: list[list[int]] = []
            if fresh and self.tokenizer is not None:
                ids, n_cut = self.tokenizer(fresh)
                counts["truncated"] += n_cut
            # The exact model input keys the cache: token ids where we tokenize, else the text.
            keys, hits = self._cached(ids or fresh) if fresh else ([], {})
            item = _Chunk(fresh, ids, len(chunk), keys, hits)
            self._account(item)
            return item

        # Chunks handed over but not collected yet: with engine replicas several are in flight.
        inflight: deque[tuple[_Chunk, Future | None]] = deque()

        def collect(advance: Any, keep: int) -> None:
            while len(inflight) > keep:
                chunk, future = inflight.popleft()
                if chunk.fresh:
                    parts.append(chunk.assemble(future.result() if future is not None else None, self.cache))
                advance(chunk.n_texts)

        start = time.perf_counter()
        with input_bar("encode", total, "texts", enabled=show_progress_bar) as advance:
            for chunk in prefetched(chunked(texts, self.chunk_size), prepare):
                miss = chunk.missing()
                future = None
                if miss:
                    future = self._submit_chunk(
                        [chunk.fresh[i] for i in miss], [chunk.ids[i] for i in miss] if chunk.ids else []
                    )
                inflight.append((chunk, future))
                collect(advance, self.max_in_flight)
            collect(advance, 0)
        self.counters.compute_seconds += time.perf_counter() - start
        self.counters.truncated += counts["truncated"]
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
