"""What every backend of every kind has in common; the kinds' own bases (``encoder/base.py``,
``reranker/base.py``, ``generator/base.py``) build on these."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from ..utils.errors import UsageError
from ..utils.telemetry import Counters, attribute, package_versions
from .cache import NUMERIC_PACKAGES, OutputCache, identity_digest, input_key, weights_fingerprint

#: dtype names the torch reference backends (st, hf) accept, vLLM's spellings and torch's -> torch's name.
TORCH_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def torch_dtype_name(dtype: str, *, allow_auto: bool = False) -> str:
    """The torch dtype name (``float32``, ``float16``, ``bfloat16``; ``auto`` when allowed) for ``dtype``.

    Raises:
        UsageError: a name not in :data:`TORCH_DTYPES` (nor ``auto`` when allowed).
    """
    if allow_auto and dtype == "auto":
        return "auto"
    if dtype not in TORCH_DTYPES:
        names = [*TORCH_DTYPES, *(["auto"] if allow_auto else [])]
        raise UsageError(f"dtype must be one of {', '.join(names)}, got {dtype!r}")
    return TORCH_DTYPES[dtype]


def load_torch_model(
    auto_class: Any, ref: Any, *, revision: str | None, dtype: str, device: str | None, trust_remote_code: bool
) -> tuple[Any, Any, str]:
    """``(model in eval mode on its device, tokenizer, device)`` for the transformers reference backends (``hf``).

    Args:
        auto_class: a transformers ``AutoModelFor...`` class.
        ref: the resolved :class:`~vllm_eval.utils.modelinfo.ModelRef`.
        dtype: a torch dtype name (see :func:`torch_dtype_name`).
        device: torch device; None: CUDA when available, else CPU.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ref.path, revision=revision, trust_remote_code=trust_remote_code)
    model, device = load_torch_weights(
        auto_class, ref, revision=revision, dtype=dtype, device=device, trust_remote_code=trust_remote_code
    )
    return model, tokenizer, device


def load_torch_weights(
    auto_class: Any, ref: Any, *, revision: str | None, dtype: str, device: str | None, trust_remote_code: bool
) -> tuple[Any, str]:
    """``(model in eval mode on its device, device)``: :func:`load_torch_model` without the tokenizer (a backend
    that reads its inputs through a processor of its own)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = auto_class.from_pretrained(
        ref.path, revision=revision, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
    )
    return model.to(device).eval(), device


def model_token_limit(config: Any, tokenizer: Any, max_model_len: int | None) -> int:
    """The token limit of a transformers model as vLLM derives it: ``max_model_len`` when given, else
    ``max_position_embeddings``, else the tokenizer's ``model_max_length``."""
    return int(max_model_len or getattr(config, "max_position_embeddings", None) or tokenizer.model_max_length)


class Resource:
    """Context-manager base: ``with X(...) as x:`` calls ``x.close()`` on exit."""

    def close(self) -> None:
        """Release what the object holds. Idempotent."""

    @contextmanager
    def closed_on_error(self) -> Iterator[None]:
        """Around the part of a constructor that acquires things: on any error, release them and re-raise."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: Overlapping calls (:meth:`BackendBase._one_call`) that may share a backend at once: two keep every replica fed
#: across the end of one call and the start of the next. Measured (docs/bench/h200-sweep-7): eight BERT-base
#: checkpoints swept on one H200's 4 replicas, a later model 9.9-11.2 s with two, 11.2-12.1 s with one, 11.0 s with 4.
OVERLAPPING_CALLS = 2


class BackendBase(Resource):
    """What every backend of every kind has: the model it runs, its chunking and progress, its capabilities.

    Args:
        model: the resolved model path, hub id or served name (recorded in results).
        chunk_size: inputs handed to the backend per step.
        show_progress_bar: show a progress bar over each call's inputs.
        model_ref: the :class:`~vllm_eval.utils.modelinfo.ModelRef` of a local or cached model (its
            revision and weight files go into :meth:`identity`); None for a served model.

    Raises:
        UsageError: ``chunk_size`` is not a positive integer.
    """

    #: vLLM ``EngineArgs`` names the backend takes: None for all (it runs a vLLM engine); a server takes none.
    engine_options: ClassVar[frozenset[str] | None] = frozenset()
    #: ``encoder``, ``reranker`` or ``generator`` (set by each kind's base).
    kind: ClassVar[str] = ""
    #: The output cache this backend reads and fills (None: none); see :meth:`use_cache`.
    cache: OutputCache | None = None
    #: Engines that compute one chunk at once (engine replicas: :class:`~vllm_eval.models.vllm_backend.VllmBackend`).
    parallel_jobs: int = 1

    @property
    def chunk_size(self) -> int:
        """Inputs handed to the backend per step: the chunk size given, times :attr:`parallel_jobs` (a chunk
        is split over replicas, and each should still get a whole one)."""
        return self._chunk_size * self.parallel_jobs

    @chunk_size.setter
    def chunk_size(self, value: int) -> None:
        self._chunk_size = value

    def __init__(self, *, model: str, chunk_size: int, show_progress_bar: bool = True, model_ref: Any = None) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise UsageError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.model = model
        self.model_ref = model_ref
        self.chunk_size = chunk_size
        self.show_progress_bar = show_progress_bar
        self._identity_key: bytes | None = None
        #: What this object has done so far (see :mod:`vllm_eval.utils.telemetry`); an engine started before
        #: this runs left its start time in ``_engine_start_s``, one started after writes it here.
        self.counters = Counters(engine_start_seconds=getattr(self, "_engine_start_s", 0.0))
        #: Calls in progress, and whether one of them holds the backend alone (see :meth:`_one_call`).
        self._calls = threading.Condition()
        self._active, self._alone = 0, False

    @contextmanager
    def _one_call(self, overlapping: bool = False) -> Iterator[Counters]:
        """Hold the backend for one call; yields the :class:`Counters` the call counts into (its own, added to the
        backend's and to its thread's task, :func:`~vllm_eval.utils.telemetry.task_counters`, at its end).

        A call holds the backend alone: a call from another thread (a task evaluated concurrently) waits its turn,
        counted as ``wait_seconds`` and drawn as ``wait`` on the timeline. An ``overlapping`` call shares it with up
        to :data:`OVERLAPPING_CALLS` - 1 other overlapping calls (engine replicas, each fed by its own queue: the next
        task's chunks reach a replica while the last chunks of this one finish on the others).
        """
        from ..utils import timeline

        own, start = Counters(), time.time()
        with self._calls:
            if not self._may_enter(overlapping):
                self._calls.wait_for(lambda: self._may_enter(overlapping))
                own.wait_seconds = time.time() - start
                timeline.current().add("wait", start, start + own.wait_seconds, timeline.current().task)
            self._active += 1
            self._alone = not overlapping
        try:
            yield own
        finally:
            with self._calls:
                self.counters.add(own)
                self._active -= 1
                self._alone = False
                self._calls.notify_all()
            attribute(own)

    def _may_enter(self, overlapping: bool) -> bool:
        """Whether a call may start now (caller holds ``_calls``)."""
        if self._alone:
            return False
        return self._active < OVERLAPPING_CALLS if overlapping else self._active == 0

    def identity(self) -> dict[str, Any]:
        """Everything that changes this backend's numbers for a given input, as a JSON-able dict.

        The base gives the kind, the class, the model (path or hub id), its revision, a fingerprint
        of its weight files and the versions of the packages that change numerics; each backend
        adds its own settings (dtype, pooling, ``dimensions``, token limit, sampling, server
        version ...). Two backends with equal identities give equal outputs for equal inputs:
        this is the cache key's first half (see :mod:`vllm_eval.models.cache`).
        """
        ref = self.model_ref
        return {
            "kind": self.kind,
            "backend": type(self).__name__,
            "model": self.model,
            "revision": getattr(ref, "revision", None),
            "weights": weights_fingerprint(getattr(ref, "snapshot", None)),
            "versions": package_versions(NUMERIC_PACKAGES),
        }

    def experiment(self) -> dict[str, Any]:
        """What tells this configuration's results apart from another's of the same model: the
        backend and, where set, dtype, quantization and ``dimensions`` (mteb's ``experiment_kwargs``;
        results then go to ``<model>/<revision>/experiments/<name>/``)."""
        # The backend's module is named after it (encoder/vllm.py, encoder/st.py, ...).
        out: dict[str, Any] = {"backend": type(self).__module__.rsplit(".", 1)[-1]}
        if self.experiment_output is not None:
            out["output"] = self.experiment_output
        for key in ("dtype", "quantization", "dimensions"):
            value = getattr(self, key, None)
            if value is not None:
                out[key] = str(value).removeprefix("torch.")
        return out

    #: Set by kinds whose outputs one model also gives another way (BGE-M3: a dense vector, lexical weights and
    #: ColBERT vectors): an ``output`` entry of :meth:`experiment`, so each kind's results of the same model go
    #: to a folder of their own and are never read back as another kind's.
    experiment_output: ClassVar[str | None] = None

    _recorded: list[Any] | None = None
    _record_limit: int = 0
    _seen: int = 0

    def record_inputs(self, limit: int) -> None:
        """From now on keep a uniform sample of ``limit`` of the exact distinct inputs sent to the
        model (texts after prompts for an encoder, (query, document) pairs for a reranker,
        (context, continuation) pairs for log-likelihoods); seeded, so repeatable.
        :meth:`recorded_inputs` returns them (for per-input parity checks). ``limit=0`` stops."""
        self._recorded, self._record_limit, self._seen = ([] if limit else None), int(limit), 0
        self._rng = random.Random(0)

    def recorded_inputs(self) -> list[Any]:
        """The inputs kept since :meth:`record_inputs` (empty when not recording)."""
        return list(self._recorded or [])

    def _record(self, inputs: Iterable[Any]) -> None:
        """Offer ``inputs`` to the sample (a no-op unless recording)."""
        if self._recorded is None:
            return
        # Reservoir sampling (Vitter's algorithm R, seeded): a uniform sample of everything sent. Calls that overlap
        # offer theirs from two threads: one at a time.
        with self._calls:
            for x in inputs:
                self._seen += 1
                if len(self._recorded) < self._record_limit:
                    self._recorded.append(x)
                elif (j := self._rng.randrange(self._seen)) < self._record_limit:
                    self._recorded[j] = x

    def use_cache(self, cache: OutputCache | None) -> None:
        """Read outputs from ``cache`` and store new ones there (None: stop caching)."""
        self.cache = cache
        self._identity_key = identity_digest(self.identity()) if cache is not None else None

    def _keys(self, inputs: Sequence[Any]) -> list[bytes]:
        """Cache keys of exact model inputs (token-id lists, texts, or JSON-able values)."""
        assert self._identity_key is not None, "use_cache() first"
        return [input_key(self._identity_key, x) for x in inputs]

    def _cached(self, inputs: Sequence[Any], counters: Counters | None = None) -> tuple[list[bytes], dict[bytes, Any]]:
        """``(keys, {key: stored output})`` for ``inputs``; both empty when no cache is in use.
        Counts hits and misses into ``counters`` (default: the backend's; without a cache every input is a miss: it
        is computed)."""
        c = self.counters if counters is None else counters
        if self.cache is None:
            c.cache_misses += len(inputs)
            return [], {}
        keys = self._keys(inputs)
        hits = self.cache.get_many(keys)
        c.cache_hits += len(hits)
        c.cache_misses += len(keys) - len(hits)
        return keys, hits

    def _merge_cached(
        self,
        keys: list[bytes],
        hits: dict[bytes, Any],
        n: int,
        compute: Callable[[list[int]], Any],
        *,
        store: Callable[[Any], Any] | None = None,
        load: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The outputs of ``n`` inputs, in order: the cache's for ``hits`` (``load(stored)``), the rest from
        ``compute(missing positions)`` (a sequence aligned with them), stored (``store(output)``) in one
        transaction. The one place where cached and computed outputs meet, for every kind.

        ``keys`` and ``hits`` come from :meth:`_cached` (both empty without a cache: all is computed).
        When nothing was a hit, what ``compute`` returned comes back as is (an array stays an array);
        otherwise a list.
        """
        miss = [i for i in range(n) if not keys or keys[i] not in hits]
        fresh = compute(miss) if miss else []
        if keys and miss:
            self.cache.put_many((keys[i], store(v) if store else v) for i, v in zip(miss, fresh, strict=True))
        if len(miss) == n:
            return fresh
        out: list[Any] = [None] * n
        for i, key in enumerate(keys):
            if key in hits:
                out[i] = load(hits[key]) if load else hits[key]
        for i, v in zip(miss, fresh, strict=True):
            out[i] = v
        return out


class PoolingBackendBase(BackendBase):
    """Base of the pooling kinds (encoder, reranker): mteb metadata, prompts, token limit, tokenizer.

    Args:
        meta: mteb ``ModelMeta`` (names the result folder; ``name`` is taken from it).
        prompting: the task prompts (see :func:`vllm_eval.models.prompts.resolve_prompting`).
        max_length: token limit including special tokens (None: unknown, e.g. a server that does not say).
        tokenizer: required when the class declares :attr:`tokenizes_locally`, ignored otherwise.
        model, chunk_size, show_progress_bar, model_ref: see :class:`BackendBase`.

    Raises:
        UsageError: a bad ``chunk_size``, or no tokenizer for a backend that tokenizes locally.
    """

    #: The backend tokenizes here, so truncation is counted locally (and a reranker's template
    #: document is cut to fit); False when the server tokenizes and truncates (remote backends).
    tokenizes_locally: ClassVar[bool] = True

    def __init__(
        self,
        *,
        model: str,
        meta: Any,
        prompting: Any,
        max_length: int | None,
        tokenizer: Any = None,
        chunk_size: int,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        super().__init__(model=model, chunk_size=chunk_size, show_progress_bar=show_progress_bar, model_ref=model_ref)
        if self.tokenizes_locally and tokenizer is None:
            raise UsageError(f"{type(self).__name__} tokenizes locally and needs a tokenizer")
        self.mteb_model_meta = meta
        self.name = meta.name
        self.prompting = prompting
        self.max_length = max_length
        self.tokenizer = tokenizer if self.tokenizes_locally else None

    def identity(self) -> dict[str, Any]:
        """The base identity plus the token limit in force (it decides truncation)."""
        return {**super().identity(), "max_length": self.max_length}
