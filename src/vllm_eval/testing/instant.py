"""Encoders that answer at once, for timing what mteb does around a model: loading, searching, scoring.

A text's vector depends on its bytes only (a CRC-32 picks two rows of a seeded Gaussian table, summed), so
the same text gets the same vector in every process and run, and the vectors cost a table lookup. The
scores mean nothing; two scoring paths given the same vectors must report the same metrics
(``scripts/scoring_bench.py``, ``tests/test_scoring.py``).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder

from ..models.encoder.search import CorpusSearch
from ..models.ranked import on_threads

#: Rows of each lookup table.
_TABLE = 4096
#: Rows filled per thread task.
_CHUNK = 8192


class InstantEncoder(AbsEncoder):
    """mteb's ``EncoderProtocol`` with hashed vectors: ``encode`` returns float32 (n_inputs, ``dim``) rows, unit
    length for ``similarity="cosine"`` (mteb's two similarity names: ``cosine``, ``dot``).

    mteb searches a retrieval task through its own ``SearchEncoderWrapper`` with this class; see
    :class:`InstantSearchEncoder` for this package's search.
    """

    def __init__(self, dim: int = 384, similarity: str = "cosine", seed: int = 0) -> None:
        from mteb.models import ModelMeta
        from mteb.models.model_meta import ScoringFunction

        rng = np.random.default_rng(seed)
        self.dim = dim
        self._tables = rng.standard_normal((2, _TABLE, dim), dtype=np.float32)
        self._normalise = similarity == "cosine"
        self.mteb_model_meta = ModelMeta(
            loader=None, name=f"vllm-eval/instant-{dim}", revision=str(seed), release_date=None, languages=None,
            n_parameters=None, memory_usage_mb=None, max_tokens=None, embed_dim=dim, license=None,
            open_weights=True, public_training_code=None, public_training_data=None, framework=["NumPy"],
            similarity_fn_name=ScoringFunction.COSINE if self._normalise else ScoringFunction.DOT_PRODUCT,
            use_instructions=False, training_datasets=None, reference=None,
        )  # fmt: skip

    def vectors(self, texts: list[str]) -> np.ndarray:
        """float32 (len(texts), dim): each text's hashed vector. Rows are filled in chunks on threads (NumPy
        releases the GIL): MindSmallReranking's 2.4 million queries are 7 GB at 768 dimensions, and an encoder
        that is to cost nothing must not spend half a minute writing them on one core."""
        codes = np.fromiter((zlib.crc32(t.encode()) for t in texts), dtype=np.int64, count=len(texts))
        out = np.empty((len(texts), self.dim), dtype=np.float32)

        def fill(lo: int) -> None:
            part, c = out[lo : lo + _CHUNK], codes[lo : lo + _CHUNK]
            np.take(self._tables[0], c % _TABLE, axis=0, out=part)
            part += self._tables[1][(c >> 12) % _TABLE]
            if self._normalise:
                part /= np.linalg.norm(part, axis=1, keepdims=True)

        on_threads(fill, range(0, len(texts), _CHUNK))
        return out

    def encode(self, inputs: Any, *, task_metadata: Any, hf_split: str, hf_subset: str, **kwargs: Any) -> np.ndarray:
        """mteb's ``encode``: every batch's ``text`` column (a batch without one: its ``image`` items' reprs)."""
        texts: list[str] = []
        for batch in inputs:
            texts.extend(batch["text"] if "text" in batch else map(repr, batch["image"]))
        return self.vectors(texts) if texts else np.zeros((0, self.dim), dtype=np.float32)


class InstantSearchEncoder(CorpusSearch, InstantEncoder):
    """:class:`InstantEncoder` searching as this package's encoder backends do (mteb's ``SearchProtocol``,
    :class:`vllm_eval.models.encoder.search.CorpusSearch`)."""
