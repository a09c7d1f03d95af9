"""``TokenEmbedderBase``: multi-vector encoders (vLLM's ``token_embed`` pooling task) as mteb models.

ColBERT (Khattab & Zaharia 2020, arXiv:2004.12832) keeps one vector per token and scores a query q
against a document d by late interaction, MaxSim: ``sum over q's tokens of max over d's tokens of
q_i · d_j``. Here a backend implements :meth:`TokenEmbedderBase._embed_tokens_chunk` (distinct texts
in, one float32 (n_tokens, dim) array per text out); the base is an mteb encoder whose ``encode``
returns those arrays (a list, rows in input order) and whose ``similarity`` is MaxSim (mteb's own
``max_sim``), so mteb's retrieval and reranking tasks run unchanged.

Memory: vectors are kept as ``store_dtype`` (float16 halves it) and scored in batches of
``score_batch_size`` documents, each upcast to float32 only while it is scored; mteb's retrieval
search encodes and scores the corpus in chunks of 50,000 documents.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ..encoder.base import EncoderBase
from ..ranked import refuse_other_task_types

#: vLLM's late-interaction architectures (``token_embed`` pooler): ColBERT on text, ColPali-style on images too.
TOKEN_EMBED_ARCHITECTURES = frozenset(
    {
        "HF_ColBERT",
        "ColBERTModernBertModel",
        "ColBERTJinaRobertaModel",
        "ColBERTLfm2Model",
        "ColModernVBertForRetrieval",
        "ColPaliForRetrieval",
        "ColQwen3",
        "OpsColQwen3Model",
        "ColQwen3_5",
    }
)
#: mteb task types a multi-vector model can be scored on (MaxSim ranks documents for a query; image-text
#: retrieval is typed Any2Any*, ViDoRe's visual document retrieval DocumentUnderstanding).
TOKEN_EMBED_TASK_TYPES = (
    "Retrieval",
    "Reranking",
    "InstructionRetrieval",
    "InstructionReranking",
    "Any2AnyRetrieval",
    "Any2AnyMultilingualRetrieval",
    "Any2AnyReranking",
    "DocumentUnderstanding",
)
STORE_DTYPES = ("float32", "float16")


def max_sim_meta(meta: Any) -> Any:
    """``meta`` (an mteb ``ModelMeta``) with MaxSim as its similarity function."""
    from mteb.models.model_meta import ScoringFunction

    return meta.model_copy(update={"similarity_fn_name": ScoringFunction.MAX_SIM, "model_type": ["late-interaction"]})


def check_task_types(tasks: list[Any]) -> None:
    """Refuse tasks a multi-vector model cannot be scored on, before any engine starts.

    Raises:
        UsageError: naming the first such task and its type.
    """
    reason = "a token_embed (multi-vector) model ranks documents by MaxSim: retrieval and reranking tasks only"
    refuse_other_task_types(tasks, TOKEN_EMBED_TASK_TYPES, reason)


class TokenEmbedderBase(EncoderBase, ABC):
    """Base of the token-embedder backends: ``encode`` gives one (n_tokens, dim) array per text.

    Args:
        store_dtype: ``float32`` (default) or ``float16``: the dtype vectors are kept (and cached) in.
        score_batch_size: documents upcast and scored at once in :meth:`similarity`.
        model, meta, prompting, max_length, tokenizer, chunk_size, show_progress_bar, model_ref:
            as for :class:`~vllm_eval.models.encoder.base.EncoderBase`; ``prompting`` carries the query and
            document markers (e.g. ``{"query": "[unused0] ", "document": "[unused1] "}``).

    Raises:
        UsageError: an unknown ``store_dtype`` or a ``score_batch_size`` < 1.
    """

    kind: ClassVar[str] = "token_embedder"
    experiment_output: ClassVar[str | None] = "multi-vector"
    ragged: ClassVar[bool] = True
    #: mteb sees a search model, as it sees its own ``MultiVectorWrapper``: a method of mteb's ``EncoderProtocol`` set
    #: to None (Python's protocol check reads it as not implemented), ``index``/``search`` given, so ``mteb.mock_run``
    #: and mteb's task filters offer it the search tasks only. The pairwise MaxSim is :meth:`pairwise_max_sim`.
    similarity_pairwise: ClassVar[None] = None

    def __init__(self, *, store_dtype: str = "float32", score_batch_size: int = 1024, **kwargs: Any) -> None:
        if store_dtype not in STORE_DTYPES:
            raise UsageError(f"store_dtype must be one of {', '.join(STORE_DTYPES)}, got {store_dtype!r}")
        if isinstance(score_batch_size, bool) or not isinstance(score_batch_size, int) or score_batch_size < 1:
            raise UsageError(f"score_batch_size must be a positive int, got {score_batch_size!r}")
        self.store_dtype = store_dtype
        self.score_batch_size = score_batch_size
        kwargs["meta"] = max_sim_meta(kwargs["meta"])
        super().__init__(**kwargs)

    def identity(self) -> dict[str, Any]:
        """The base identity plus the storage dtype (cached vectors are kept in it)."""
        return {**super().identity(), "store_dtype": self.store_dtype}

    @abstractmethod
    def _embed_tokens_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        """Per-token vectors of distinct ``texts`` (token ids when :attr:`tokenizes_locally`, else ``[]``).

        Returns:
            One float32 array (n_tokens, dim) per text, in order, L2-normalised per token.
        """

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        dtype = np.dtype(self.store_dtype)
        return [np.ascontiguousarray(x, dtype=dtype) for x in self._embed_tokens_chunk(texts, ids)]

    def _output_width(self) -> int:
        return 0

    def encode(self, inputs: Any, *, task_metadata: Any = None, **kwargs: Any) -> Any:
        """One (n_tokens, dim) array per input (see the class doc), for a task MaxSim can score.

        Raises:
            UsageError: ``task_metadata`` names a task of another type (what mteb would otherwise fail on deep in
                its scoring, e.g. "inhomogeneous shape").
        """
        kind = getattr(task_metadata, "type", None)
        if kind is not None and kind not in TOKEN_EMBED_TASK_TYPES:
            raise UsageError(
                f"task {task_metadata.name} is {kind}: a token_embed (multi-vector) model ranks documents by MaxSim, "
                "retrieval and reranking tasks only"
            )
        return super().encode(inputs, task_metadata=task_metadata, **kwargs)

    def _searchers(self) -> dict[int, Any]:
        """Each thread's mteb ``SearchEncoderWrapper`` over this model, from its ``index`` to its ``search``."""
        return self.__dict__.setdefault("_search_wrappers", {})

    def index(self, corpus: Any, **kwargs: Any) -> None:
        """mteb's ``SearchProtocol.index``: mteb's own search over :meth:`encode` and MaxSim (its
        ``SearchEncoderWrapper``, as for any encoder), kept for this thread's next :meth:`search`."""
        import threading

        from mteb.models.search_wrappers import SearchEncoderWrapper

        searcher = SearchEncoderWrapper(_MaxSimEncoder(self))
        searcher.index(corpus, **kwargs)
        self._searchers()[threading.get_ident()] = searcher

    def search(self, queries: Any, **kwargs: Any) -> Any:
        """mteb's ``SearchProtocol.search`` of the corpus this thread indexed (the corpus let go after).

        Raises:
            ValueError: :meth:`index` was not called first on this thread (as mteb's wrapper).
        """
        import threading

        searcher = self._searchers().pop(threading.get_ident(), None)
        if searcher is None:
            raise ValueError("Corpus must be indexed before searching.")
        return searcher.search(queries, **kwargs)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Any:
        """MaxSim of every query (``embeddings1``) against every document (``embeddings2``).

        Args:
            embeddings1, embeddings2: sequences of (n_tokens, dim) arrays (float16 or float32).

        Returns:
            float32 torch tensor (len(embeddings1), len(embeddings2)).
        """
        import torch
        from mteb.similarity_functions import max_sim

        queries = [torch.as_tensor(np.asarray(q, dtype=np.float32)) for q in embeddings1]
        if not queries or not len(embeddings2):
            return torch.zeros((len(queries), len(embeddings2)), dtype=torch.float32)
        parts = []
        for lo in range(0, len(embeddings2), self.score_batch_size):
            docs = [
                torch.as_tensor(np.asarray(d, dtype=np.float32)) for d in embeddings2[lo : lo + self.score_batch_size]
            ]
            parts.append(torch.as_tensor(max_sim(queries, docs)).float().cpu())
        return torch.cat(parts, dim=1)

    def pairwise_max_sim(self, embeddings1: Any, embeddings2: Any) -> Any:
        """MaxSim of each pair (``embeddings1[i]``, ``embeddings2[i]``): float32 tensor (n,)."""
        import torch
        from mteb.similarity_functions import pairwise_max_sim

        a = [torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in embeddings1]
        b = [torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in embeddings2]
        return torch.as_tensor(pairwise_max_sim(a, b)).float()


class _MaxSimEncoder:
    """A token embedder as mteb's ``EncoderProtocol`` sees an encoder, for mteb's ``SearchEncoderWrapper``."""

    def __init__(self, model: TokenEmbedderBase) -> None:
        self._model = model
        self.mteb_model_meta = model.mteb_model_meta

    def encode(self, inputs: Any, **kwargs: Any) -> Any:
        return self._model.encode(inputs, **kwargs)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Any:
        return self._model.similarity(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> Any:
        return self._model.pairwise_max_sim(embeddings1, embeddings2)
