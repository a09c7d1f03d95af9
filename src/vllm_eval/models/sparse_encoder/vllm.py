"""``VllmSparseEncoder``: SPLADE and BGE-M3's lexical weights through vLLM, kept sparse, searched by sparse products.

* SPLADE (``naver/splade-v3``-style: a BERT masked-LM with sentence-transformers' ``SpladePooling``) runs as
  vLLM's ``BertSpladeSparseEmbeddingModel`` (``embed``: ``max over tokens of log(1 + ReLU(MLM logits))``, one
  vocabulary-sized vector per text); its non-zeros are kept.
* BGE-M3 (``sparse_linear.pt`` next to the weights) runs as vLLM's ``BgeM3EmbeddingModel`` with
  ``pooler_config={"task": "token_classify"}``: one ReLU weight per token, kept per token id at its largest,
  CLS/EOS/PAD/UNK dropped (FlagEmbedding's ``_process_token_weights``).

The architecture and task are set through ``hf_overrides`` / ``pooler_config`` (the user's own win). The other
BGE-M3 outputs (dense, ColBERT) are the encoder and token-embedder kinds with :func:`bge_m3_engine_options`; with
``bge_m3_weights`` (BGE-M3's "all" mode, :mod:`~vllm_eval.models.sparse_encoder.hybrid`) a search starts their
engines itself, one after the other (the dense one for the first stage, released, then the ColBERT one), beside
this backend's own sparse engine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs, merge_engine_kwargs
from ...engine.jobs import lexical_weights_job, pooling_info, splade_job
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta, model_json
from ..prompts import PromptResolver
from ..streaming import BatchTokenizer
from ..vllm_backend import VllmBackend
from .base import SparseEncoderBase, sparse_flavour
from .checkpoint import loadable_splade
from .hybrid import HybridSearch, check_weights

logger = logging.getLogger(__name__)

#: vLLM's pooling task of each BGE-M3 output (``BgeM3EmbeddingModel``'s ``DispatchPooler``).
BGE_M3_TASKS = {"dense": "embed", "sparse": "token_classify", "colbert": "token_embed"}


def bge_m3_engine_options(mode: str) -> dict[str, Any]:
    """The engine options that make vLLM run a BGE-M3 checkpoint for one of its outputs: the
    ``BgeM3EmbeddingModel`` architecture and the pooling task of ``mode`` (:data:`BGE_M3_TASKS`); vLLM 0.32 serves
    one pooling task per engine (``LLM.encode`` refuses the others), so each mode is an engine of its own.

    Raises:
        UsageError: an unknown mode.
    """
    if mode not in BGE_M3_TASKS:
        raise UsageError(f"BGE-M3 mode must be one of {', '.join(BGE_M3_TASKS)} or all, not {mode!r}")
    return {"hf_overrides": {"architectures": ["BgeM3EmbeddingModel"]}, "pooler_config": {"task": BGE_M3_TASKS[mode]}}


def _splade_options(ref: ModelRef) -> dict[str, Any]:
    """``hf_overrides`` that run a SPLADE checkpoint as vLLM's ``BertSpladeSparseEmbeddingModel`` with the pooling of
    sentence-transformers' ``SpladePooling``: vLLM's pooler drops the first and last positions when the config names
    ``cls_token_id`` / ``sep_token_id`` (it reads them with ``getattr``), which ``SpladePooling`` keeps, so those
    are cleared.

    Raises:
        UsageError: a ``SpladePooling`` vLLM's pooler does not compute (sum pooling, ``log1p_relu``).
    """
    pooling = Path(ref.path) / "1_SpladePooling" / "config.json"
    if pooling.is_file():
        cfg = model_json(pooling)
        if cfg.get("pooling_strategy", "max") != "max" or cfg.get("activation_function", "relu") != "relu":
            raise UsageError(
                f"{ref.path}: SpladePooling {cfg} — vLLM's BertSpladeSparseEmbeddingModel computes max pooling of "
                "log(1 + ReLU) only"
            )
    overrides: dict[str, Any] = {"architectures": ["BertSpladeSparseEmbeddingModel"]}
    overrides.update({k: None for k in ("cls_token_id", "sep_token_id") if ref.config.get(k) is not None})
    return {"hf_overrides": overrides}


def special_ids(tokenizer: Any) -> list[int]:
    """The token ids FlagEmbedding leaves out of BGE-M3's lexical weights: its CLS, EOS, PAD and UNK tokens."""
    names = ("cls_token", "eos_token", "pad_token", "unk_token")
    found = [getattr(tokenizer, f"{n}_id", None) for n in names]
    return sorted({int(i) for i in found if i is not None})


class VllmSparseEncoder(VllmBackend, HybridSearch, SparseEncoderBase):
    """Sparse vectors from a vLLM engine (see the module doc); retrieval by sparse products
    (:class:`~vllm_eval.models.sparse_encoder.search.SparseSearch`), or for BGE-M3 with ``bge_m3_weights`` by its
    weighted dense + sparse + ColBERT score (:class:`~vllm_eval.models.sparse_encoder.hybrid.HybridSearch`).

    Args:
        model: a SPLADE or BGE-M3 model directory (or hub id).
        revision: hub revision.
        prompts: static prefixes, ``{"query": "...", "document": "..."}``.
        max_active_dims: keep each vector's largest weights only (sentence-transformers' top-k; None: all non-zeros).
        bge_m3_weights: BGE-M3's "all" mode: (w_dense, w_sparse, w_colbert) of retrieval's weighted score
            (FlagEmbedding's default ``(1, 1, 1)``); None: the sparse search.
        chunk_size, show_progress_bar, model_name, trust_remote_code, data_parallel_size, replicas_per_gpu,
            ray_address: as for :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`.
        **engine_kwargs: vLLM ``EngineArgs`` (``max_model_len``, ``io_processor_plugin`` ...).

    Raises:
        UsageError: a model that is neither SPLADE nor BGE-M3; a SPLADE pooling vLLM does not compute; a bad
            ``max_active_dims``; ``bge_m3_weights`` that are not three numbers >= 0 with a positive sum, or given
            for a model that is not BGE-M3.
        ModelNotFoundError, OptionError, EngineError, ReplicaError: as the other vLLM backends.
    """

    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        max_active_dims: int | None = None,
        bge_m3_weights: Sequence[float] | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        trust_remote_code: bool = False,
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        self.flavour = sparse_flavour(ref)
        if self.flavour is None:
            raise UsageError(
                f"{ref.path}: not a sparse model vLLM runs (a SPLADE masked-LM with SpladePooling, or BGE-M3 with "
                "sparse_linear.pt)"
            )
        self.bge_m3_weights = check_weights(bge_m3_weights)
        if self.bge_m3_weights is not None and self.flavour != "bge-m3":
            raise UsageError(
                f"{ref.path}: --bge-m3-weights (BGE-M3's all mode) needs a BGE-M3 model, not {self.flavour}"
            )
        # The dense and ColBERT engines of "all" mode take the user's engine options and layout as this one does.
        self._peer_options = {
            **engine_kwargs, "revision": revision, "trust_remote_code": trust_remote_code,
            "data_parallel_size": data_parallel_size, "replicas_per_gpu": replicas_per_gpu, "ray_address": ray_address,
        }  # fmt: skip
        self._peer: Any = None
        own = bge_m3_engine_options("sparse") if self.flavour == "bge-m3" else _splade_options(ref)
        self.engine_kwargs = backend_engine_kwargs(
            "pooling", own, engine_kwargs, trust_remote_code=trust_remote_code, revision=revision
        )
        engine_ref, self.checkpoint_changes = ref, []
        if self.flavour == "splade":  # an older checkpoint format: the engine loads a normalised copy
            path, self.checkpoint_changes = loadable_splade(ref.path)
            if self.checkpoint_changes:
                logger.info("%s: vLLM loads a copy with %s (%s)", ref.path, ", ".join(self.checkpoint_changes), path)
                engine_ref = ModelRef.resolve(path)
        with self.closed_on_error():
            info = self.start(engine_ref, pooling_info, data_parallel_size, replicas_per_gpu, ray_address)
            max_length = info["max_model_len"]
            self._special = special_ids(info["tokenizer"])
            super().__init__(
                model=ref.path,
                model_ref=ref,
                meta=build_model_meta(ref, revision=revision, model_name=model_name, max_model_len=max_length),
                prompting=PromptResolver(prompts=prompts),
                max_length=max_length,
                tokenizer=BatchTokenizer(info["tokenizer"], max_length, info["do_lower_case"]),
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
                vocab_size=int(info["hf_config"]["vocab_size"]),
                max_active_dims=max_active_dims,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization and overrides."""
        return {
            **super().identity(),
            **self.engine_identity(),
            "pooler_config": self.engine_kwargs.get("pooler_config"),
        }

    @contextmanager
    def _hybrid_phase(self, mode: str) -> Iterator[None]:
        """``dense`` / ``colbert``: that output's engine (``BgeM3EmbeddingModel`` with its pooling task), started
        now and released when the phase ends, so at most two engines live at once (this sparse one and it); an
        engine of the same options already running in this process is shared, not started again."""
        if mode == "sparse":
            yield
            return
        from ..encoder.vllm import VllmEncoder
        from ..token_embedder.vllm import VllmTokenEmbedder

        cls = VllmEncoder if mode == "dense" else VllmTokenEmbedder
        engine = merge_engine_kwargs(bge_m3_engine_options(mode), self._peer_options)
        with cls(self.model_ref, show_progress_bar=False, chunk_size=self._chunk_size, **engine) as peer:
            peer.use_cache(self.cache)
            self._peer = peer
            try:
                yield
            finally:
                self._peer = None

    def _hybrid_dense(self, texts: list[str]) -> np.ndarray:
        return self._peer.encode_texts(texts) if texts else np.zeros((0, 0), dtype=np.float32)

    def _hybrid_colbert(self, texts: list[str]) -> list[np.ndarray]:
        return list(self._peer.encode_texts(texts)) if texts else []

    def _sparse_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        if self.flavour == "bge-m3":
            job, payload = lexical_weights_job, lambda lo, hi: (ids[lo:hi], self.max_active_dims, self._special)
        else:
            job, payload = splade_job, lambda lo, hi: (ids[lo:hi], self.max_active_dims)
        return self.run_split(job, len(ids), payload, lambda i: f"input {texts[i]!r:.80}")
