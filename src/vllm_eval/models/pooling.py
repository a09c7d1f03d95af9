"""``TextPoolingBase``: the text stream of the pooling kinds that map one text to one row.

Encoders (an embedding per text) and classifiers (class probabilities per text) share it: input
deduplication within a call, chunking with the next chunk tokenized and looked up in the output
cache on a worker thread while the current one is computed, cache reads and writes, counters, the
progress display and the truncation report. A kind implements :meth:`TextPoolingBase._pool_chunk`
(distinct texts in, float32 rows out) and :meth:`TextPoolingBase._output_width`. A kind whose
output per text is a matrix of its own length (token embedders: one vector per token) sets
``ragged = True`` and gets a list of arrays instead of one stacked array.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from ..engine.jobs import TokenizedRows
from ..utils.progress import input_bar
from ..utils.telemetry import Counters
from .base import PoolingBackendBase
from .images import ImageInput, cache_form
from .streaming import chunked, prefetched, warn_truncated


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


class TextPoolingBase(PoolingBackendBase):
    """One float32 row per text, computed once per distinct text and streamed in chunks (see module doc)."""

    #: Chunks handed over before the oldest is collected (0: one at a time; replicas use more).
    max_in_flight: int = 0
    #: The word on the progress display.
    stream_label: ClassVar[str] = "encode"
    #: One array of its own length per text (a list comes back), not one row of a fixed width.
    ragged: ClassVar[bool] = False

    @abstractmethod
    def _pool_chunk(self, texts: list[str], ids: list[list[int]]) -> Any:
        """Rows for distinct ``texts`` (with their token ids when the backend tokenizes locally, else
        ``[]``): float32 (len(texts), width), in order; ``ragged``: a list of arrays, one per text."""

    @abstractmethod
    def _output_width(self) -> int:
        """Row width, for the (0, width) result of an empty call."""

    def _account(self, item: _Chunk, c: Counters) -> None:
        """Count a prepared chunk into its call's counters ``c`` (and keep a few of its inputs when recording)."""
        self._record(item.fresh)
        c.inputs += item.n_texts
        c.distinct += len(item.fresh)
        if item.ids:
            c.tokens += sum(map(len, item.ids))
            c.compute_tokens += sum(len(item.ids[i]) for i in item.missing())

    def _pooled_stream(self, texts: Iterable[str], *, total: int | None, show_progress_bar: bool) -> Any:
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
            if fresh and self.tokenizer is not None and isinstance(fresh[0], str) and not self._tokenized_remotely():
                ids, n_cut = self.tokenizer(fresh)
                counts["truncated"] += n_cut
            keys, hits = self._cached(self._cache_inputs(fresh, ids), c) if fresh else ([], {})
            item = _Chunk(fresh, ids, len(chunk), keys, hits)
            self._account(item, c)
            return item

        # Chunks handed over but not collected yet: with engine replicas several are in flight.
        inflight: deque[tuple[_Chunk, Future | None]] = deque()

        def collect(advance: Any, keep: int) -> None:
            while len(inflight) > keep:
                chunk, future = inflight.popleft()
                if chunk.fresh:
                    parts.append(self._chunk_rows(chunk, future, counts, c))
                advance(chunk.n_texts)

        # One stream at a time keeps its chunks in flight on the engine(s); on replicas fed by queues of their own,
        # a second stream's chunks fill the replicas that finish this one's last chunks first.
        with self._one_call(overlapping=self._overlaps_calls()) as c:
            start = time.perf_counter()
            bar = input_bar(self.stream_label, total, "texts", enabled=show_progress_bar)
            with bar as advance, _cancelled_on_error(inflight):
                # One kind per chunk (texts or images): a chunk is tokenized, keyed and sent as one kind of input.
                for chunk in prefetched(chunked(texts, self.chunk_size, kind=_is_image), prepare):
                    miss = chunk.missing()
                    future = None
                    if miss:
                        future = self._submit_chunk(
                            [chunk.fresh[i] for i in miss], [chunk.ids[i] for i in miss] if chunk.ids else []
                        )
                    inflight.append((chunk, future))
                    collect(advance, self.max_in_flight)
                collect(advance, 0)
            c.add_compute(time.perf_counter() - start)
            c.truncated += counts["truncated"]
            warn_truncated(counts["truncated"], counts["unique"], self.max_length, self.name)
            return self._in_input_order(parts, order)

    def _in_input_order(self, parts: list[Any], order: list[int]) -> Any:
        """One row per input: ``order[i]`` is input i's row among the distinct texts' rows (``parts``, in turn)."""
        if self.ragged:
            flat = [row for part in parts for row in part]
            return [flat[i] for i in order]
        if not parts:
            return np.zeros((0, self._output_width()), dtype=np.float32)
        unique = np.concatenate(parts).astype(np.float32, copy=False)
        if len(order) == len(unique):  # every text distinct: the rows are in input order already (a corpus)
            return np.ascontiguousarray(unique)
        return np.ascontiguousarray(unique[np.asarray(order, dtype=np.int64)])

    def _chunk_rows(self, chunk: _Chunk, future: Future | None, counts: dict[str, int], c: Counters) -> Any:
        """The rows of a collected chunk's distinct texts, in order: the cache's hits merged with what was computed
        (stored as it comes)."""
        computed = future.result() if future is not None else None
        if isinstance(computed, TokenizedRows):  # tokenized where it was computed: counted here
            computed = self._account_remote(computed, counts, c)
        rows = self._merge_cached(chunk.keys, chunk.hits, len(chunk.fresh), lambda _: computed)
        return rows if self.ragged or isinstance(rows, np.ndarray) else np.stack(rows)

    def _tokenized_remotely(self) -> bool:
        """Whether texts go to the engines untokenized and each engine tokenizes its share
        (:class:`~vllm_eval.engine.jobs.TokenizedRows` come back): the default, no."""
        return False

    def _overlaps_calls(self) -> bool:
        """Whether this backend's calls may overlap (:meth:`~vllm_eval.models.base.BackendBase._one_call`): where the
        engines tokenize (:meth:`_tokenized_remotely`: nothing of a call is prepared here on a tokenizer two calls would
        share)."""
        return self._tokenized_remotely()

    def _cache_inputs(self, fresh: list[Any], ids: list[list[int]]) -> list[Any]:
        """What keys each input's cached output: its exact model input, the token ids where they were made here,
        else the text (an image: its pixels). A backend keying texts by themselves puts its tokenizer's
        fingerprint in its identity."""
        return ids or [cache_form(x) for x in fresh]

    def _account_remote(self, computed: TokenizedRows, counts: dict[str, int], c: Counters) -> np.ndarray:
        """Count tokens and truncations an engine's own tokenizing found (as :meth:`_account` counts ours); the
        rows."""
        n = int(computed.lengths.sum())
        c.tokens += n
        c.compute_tokens += n
        counts["truncated"] += int(computed.truncated.sum())
        return computed.rows

    def _submit_chunk(self, texts: list[str], ids: list[list[int]]) -> Future:
        """Start one chunk; the default runs :meth:`_pool_chunk` here and returns a finished future."""
        future: Future = Future()
        future.set_result(self._pool_chunk(texts, ids))
        return future


@contextmanager
def _cancelled_on_error(inflight: deque[tuple[Any, Future | None]]) -> Iterator[None]:
    """On any exception (a signal too: the stall watchdog's, Ctrl-C) cancel the chunks still in flight: nobody
    collects them, and their requests leave the engine, which stays usable."""
    try:
        yield
    except BaseException:
        for _, future in inflight:
            if future is not None:
                future.cancel()
        raise


def _is_image(item: Any) -> bool:
    return isinstance(item, ImageInput)
