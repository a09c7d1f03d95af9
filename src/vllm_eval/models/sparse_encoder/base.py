"""``SparseEncoderBase``: learned sparse retrievers as mteb models, their vectors kept sparse.

A sparse encoder maps a text to a vector over its vocabulary with few non-zero weights: SPLADE (Formal et al.
2021, arXiv:2107.05720; max pooling since SPLADE v2, arXiv:2109.10086) gives ``max over tokens of
log(1 + ReLU(MLM logits))``; BGE-M3 (Chen et al. 2024, arXiv:2402.03216) gives each token of the text a ReLU
weight, kept per token id at its largest (FlagEmbedding's ``_process_token_weights``). Texts are scored by
the dot product of their vectors, as mteb scores sentence-transformers' ``SparseEncoder`` (``splade_models.py``
declares ``ScoringFunction.DOT_PRODUCT``).

What is kept: each text's non-zero weights, as a *row*: an int32 array (2, nnz) of token ids (ascending) and
the float32 weights' bits (:func:`pack_row`, :func:`unpack_row`), 8 bytes per non-zero, which is also what the
output cache stores. ``max_active_dims`` keeps each row's largest weights only (sentence-transformers'
``SparseEncoder.encode(max_active_dims=...)``: a top-k per vector; default: every non-zero, as the reference
does when the model sets none). ``encode`` gives a ``scipy.sparse.csr_matrix`` (n, vocab) float32 to retrieval
tasks (the sparse search of :mod:`vllm_eval.models.sparse_encoder.search`) and the dense (n, vocab) array to
every other task type, as mteb's ``SparseEncoderWrapper`` densifies for tasks that index embeddings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...engine.jobs import pack_sparse_row as pack_row
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, model_modules
from ..encoder.base import EncoderBase

__all__ = [
    "SparseEncoderBase",
    "pack_row",
    "row_cosines",
    "row_max_abs_diff",
    "rows_to_csr",
    "sparse_dot",
    "sparse_flavour",
    "unpack_row",
]


def sparse_flavour(ref: ModelRef) -> str | None:
    """``bge-m3`` (``sparse_linear.pt`` beside the weights), ``splade`` (sentence-transformers' ``SpladePooling``
    in ``modules.json``, vLLM's SPLADE architecture named, or a bare ``*ForMaskedLM`` checkpoint without
    sentence-transformers' files, as SPLADE trainings save one: vLLM runs a masked LM for no pooling task but
    SPLADE's), or None."""
    path = Path(ref.path)
    if (path / "sparse_linear.pt").is_file():
        return "bge-m3"
    architectures = [str(a) for a in ref.config.get("architectures") or ()]
    if "BertSpladeSparseEmbeddingModel" in architectures:
        return "splade"
    if not (path / "modules.json").is_file():
        return "splade" if any(a.endswith("ForMaskedLM") for a in architectures) else None
    if any("SpladePooling" in str(m.get("type") or "") for m in model_modules(path)):
        return "splade"
    return None


def unpack_row(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int32 (nnz,), weights float32 (nnz,))`` of a :func:`pack_row` row."""
    row = np.asarray(row, dtype=np.int32).reshape(2, -1)
    return row[0], row[1].view(np.float32)


def rows_to_csr(rows: Sequence[np.ndarray], width: int) -> Any:
    """Packed rows as a ``scipy.sparse.csr_matrix`` (len(rows), width) float32.

    Raises:
        ValueError: an id outside ``[0, width)``.
    """
    from scipy.sparse import csr_matrix

    parts = [unpack_row(r) for r in rows]
    counts = np.fromiter((len(i) for i, _ in parts), dtype=np.int64, count=len(parts))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ids = np.concatenate([i for i, _ in parts]) if parts else np.zeros(0, np.int32)
    weights = np.concatenate([w for _, w in parts]) if parts else np.zeros(0, np.float32)
    if len(ids) and (ids.min() < 0 or ids.max() >= width):
        raise ValueError(f"a sparse row has an id outside the vocabulary of {width}")
    return csr_matrix((weights, ids, indptr), shape=(len(rows), width), dtype=np.float32)


def row_max_abs_diff(a: Any, b: Any) -> np.ndarray:
    """Per row of two sparse matrices of one shape, the largest |Δ| of a weight over the vocabulary (an id present
    on one side only counts its weight): float64 (n_rows,)."""
    import scipy.sparse as sp

    diff = abs(sp.csr_matrix(a, dtype=np.float64) - sp.csr_matrix(b, dtype=np.float64))
    return diff.max(axis=1).toarray().ravel()


def row_cosines(a: Any, b: Any) -> np.ndarray:
    """Per row of two sparse matrices of one shape, the cosine of the two rows: float64 (n_rows,). Two empty rows
    (BGE-M3 keeps no weight of an empty text) agree: 1; an empty row against a non-empty one: 0."""
    import scipy.sparse as sp

    x, y = sp.csr_matrix(a, dtype=np.float64), sp.csr_matrix(b, dtype=np.float64)

    def row_sums(m: Any) -> np.ndarray:
        return np.asarray(m.sum(axis=1)).ravel()

    squares = row_sums(x.multiply(x)), row_sums(y.multiply(y))
    norms = np.sqrt(squares[0] * squares[1])
    cos = row_sums(x.multiply(y)) / np.where(norms > 0, norms, 1.0)
    return np.where((squares[0] == 0) & (squares[1] == 0), 1.0, cos)


def check_max_active_dims(value: Any) -> int | None:
    """``max_active_dims`` as given, checked.

    Raises:
        UsageError: not a positive int (nor None).
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"max_active_dims must be a positive int, got {value!r}")
    return value


def sparse_dot(a: Any, b: Any) -> Any:
    """Dot products of every row of ``a`` with every row of ``b``: float32 torch tensor (len(a), len(b)).
    ``a`` and ``b`` are scipy sparse matrices, numpy arrays or torch tensors (dense or sparse)."""
    import scipy.sparse as sp
    import torch

    def scipy_or_numpy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            x = x.to_dense() if x.is_sparse else x
            return x.detach().cpu().float().numpy()
        return x if sp.issparse(x) else np.asarray(x, dtype=np.float32)

    x, y = scipy_or_numpy(a), scipy_or_numpy(b)
    product = x @ y.T
    if sp.issparse(product):
        product = product.toarray()
    return torch.as_tensor(np.asarray(product, dtype=np.float32))


class SparseEncoderBase(EncoderBase, ABC):
    """Base of the sparse-encoder backends: one packed row (:func:`pack_row`) per text from
    :meth:`_sparse_chunk`; ``encode`` and the dot-product ``similarity`` mteb calls (see the module doc).

    Args:
        vocab_size: the width of the vectors (the model's vocabulary).
        max_active_dims: keep each vector's largest weights only (None: every non-zero).
        model, meta, prompting, max_length, tokenizer, chunk_size, show_progress_bar, model_ref: as for
            :class:`~vllm_eval.models.encoder.base.EncoderBase` (``meta``'s similarity becomes the dot product).

    Raises:
        UsageError: a ``max_active_dims`` that is not a positive int.
    """

    kind: ClassVar[str] = "sparse_encoder"
    experiment_output: ClassVar[str | None] = "sparse"
    ragged: ClassVar[bool] = True

    def __init__(self, *, vocab_size: int, max_active_dims: int | None = None, **kwargs: Any) -> None:
        from mteb.models.model_meta import ScoringFunction

        self.vocab_size = int(vocab_size)
        self.max_active_dims = check_max_active_dims(max_active_dims)
        kwargs["meta"] = kwargs["meta"].model_copy(
            update={"similarity_fn_name": ScoringFunction.DOT_PRODUCT, "model_type": ["sparse"],
                    "embed_dim": self.vocab_size}
        )  # fmt: skip
        super().__init__(**kwargs)

    def identity(self) -> dict[str, Any]:
        """The base identity plus ``max_active_dims`` (it changes the rows kept)."""
        return {**super().identity(), "max_active_dims": self.max_active_dims}

    @abstractmethod
    def _sparse_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        """Packed rows (:func:`pack_row`, with :attr:`max_active_dims`) of distinct ``texts`` (with their token ids
        when :attr:`tokenizes_locally`), in order."""

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        return self._sparse_chunk(texts, ids)

    def _output_width(self) -> int:
        return 0

    def encode_sparse(self, texts: Sequence[str]) -> Any:
        """``texts`` as given (no prompt) -> ``scipy.sparse.csr_matrix`` (len(texts), vocab) float32."""
        return rows_to_csr(self._pooled_stream(iter(list(texts)), total=len(texts), show_progress_bar=False),
                           self.vocab_size)  # fmt: skip

    def encode_csr(self, inputs: Any, *, task_metadata: Any, hf_split: str, hf_subset: str,
                   prompt_type: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """mteb's inputs (prompts applied as for ``encode``) -> ``scipy.sparse.csr_matrix`` (n, vocab) float32,
        whatever the task type (the sparse search's own call)."""
        rows = super().encode(inputs, task_metadata=task_metadata, hf_split=hf_split, hf_subset=hf_subset,
                              prompt_type=prompt_type, **kwargs)  # fmt: skip
        return rows_to_csr(rows, self.vocab_size)

    def encode(self, inputs: Any, *, task_metadata: Any, hf_split: str, hf_subset: str,
               prompt_type: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """mteb's ``encode``: a ``scipy.sparse.csr_matrix`` (n, vocab) float32 for a retrieval task (not
        reranking), else the dense float32 array (n, vocab) (mteb's ``_is_sparse_compatible_task``)."""
        matrix = self.encode_csr(inputs, task_metadata=task_metadata, hf_split=hf_split, hf_subset=hf_subset,
                                 prompt_type=prompt_type, **kwargs)  # fmt: skip
        sparse_ok = task_metadata.simplified_task_type == "retrieval" and "Reranking" not in task_metadata.type
        return matrix if sparse_ok else matrix.toarray()

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Any:
        """Dot product of every row of ``embeddings1`` with every row of ``embeddings2`` (sparse or dense):
        float32 torch tensor (n1, n2)."""
        return sparse_dot(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> Any:
        """Dot product of each pair of rows: float32 torch tensor (n,)."""
        import scipy.sparse as sp
        import torch

        a, b = embeddings1, embeddings2
        if sp.issparse(a) or sp.issparse(b):
            a, b = sp.csr_matrix(a), sp.csr_matrix(b)
            return torch.as_tensor(np.asarray(a.multiply(b).sum(axis=1), dtype=np.float32).ravel())
        a, b = (torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in (a, b))
        return (a * b).sum(dim=1)
