"""``EncoderBase``: what every encoder backend shares (mteb's ``EncoderProtocol``).

A backend implements one hook, :meth:`EncoderBase._embed_chunk` (distinct texts in, float32 rows
out), and passes what it knows to the constructor: its mteb metadata, token limit, tokenizer and
prompts. The base does the rest the same way for every backend: prompts and instructions per task,
input checks, deduplication within a call, chunking with the next chunk tokenized while the current
one is embedded, the progress display and the truncation report. This is the one place where inputs
reach a backend, so what sits between (a cache) attaches here once for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.types import PromptType

from ..base import PoolingBackendBase
from ..progress import input_bar
from ..prompts import PromptResolver, check_texts, texts_from
from ..streaming import BatchTokenizer, chunked, flatten, loader_len, prefetched, warn_truncated


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
    ) -> None:
        super().__init__(
            model=model,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            tokenizer=tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

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
        # embedded once and its row reused. Chunk k+1 is deduplicated and tokenized on a worker
        # thread while the backend embeds chunk k (the fast tokenizer and the engine's IPC both
        # release the GIL), so tokenization stays off the critical path.
        rows: dict[str, int] = {}
        order: list[int] = []
        parts: list[np.ndarray] = []
        counts = {"unique": 0, "truncated": 0}

        def prepare(chunk: list[str]) -> tuple[list[str], list[list[int]], int]:
            fresh: list[str] = []
            for t in chunk:
                if t not in rows:
                    rows[t] = counts["unique"] + len(fresh)
                    fresh.append(t)
                order.append(rows[t])
            counts["unique"] += len(fresh)
            if not fresh or self.tokenizer is None:
                return fresh, [], len(chunk)
            ids, n_cut = self.tokenizer(fresh)
            counts["truncated"] += n_cut
            return fresh, ids, len(chunk)

        # Chunks handed over but not collected yet: with engine replicas several are in flight.
        inflight: deque[tuple[Future | None, int]] = deque()

        def collect(advance: Any, keep: int) -> None:
            while len(inflight) > keep:
                future, n_texts = inflight.popleft()
                if future is not None:
                    parts.append(future.result())
                advance(n_texts)

        with input_bar("encode", total, "texts", enabled=show_progress_bar) as advance:
            for fresh, ids, n_texts in prefetched(chunked(texts, self.chunk_size), prepare):
                inflight.append((self._submit_chunk(fresh, ids) if fresh else None, n_texts))
                collect(advance, self.max_in_flight)
            collect(advance, 0)
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
