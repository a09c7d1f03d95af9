"""``RerankerBase``: what every reranker backend shares (mteb's ``CrossEncoderProtocol``).

Three ways a model scores a (query, document) pair, picked from the model's files by
:func:`reranker_mode`:

* **cross-encoder** — a ``*ForSequenceClassification`` with one label (BERT-style rerankers):
  the pair is tokenized as ``[CLS] q [SEP] d [SEP]`` and the head's sigmoid is the score, exactly
  like sentence-transformers' ``CrossEncoder.predict``;
* **template** — a causal LM turned into a classifier by a recipe (``hf_overrides``) plus a
  :class:`~vllm_eval.models.presets.ScoreTemplate`, e.g. the built-in ``qwen3-reranker`` preset.
  mteb's own wrapper has ``# TODO: support score prompt``; here the template is applied;
* **bi-encoder** — an embedding model: cosine of the two embeddings, as vLLM's score API does
  for embed models.

A backend implements one hook, :meth:`RerankerBase._score_chunk`; the base applies prompts and
templates, checks inputs, streams pairs in chunks (the next chunk formatted while the current one
is scored), shows progress and reports truncation.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from mteb.types import PromptType

from ...utils.errors import UsageError
from ...utils.progress import input_bar
from ..base import PoolingBackendBase
from ..images import ImageInput, cache_form, prompt_of, texts_or_images, with_prompt
from ..presets import ScoreTemplate
from ..prompts import PromptResolver, inputs_from
from ..streaming import chunked, flatten, loader_len, prefetched, private_tokenizer, warn_truncated

Mode = Literal["cross-encoder", "template", "bi-encoder"]


def reranker_mode(
    architectures: Sequence[str],
    *,
    has_template: bool,
    is_sentence_transformer: bool,
    num_labels: int | None,
    model: str,
) -> Mode:
    """How ``model`` scores pairs, from its architectures and what recipe it was given.

    Raises:
        UsageError: a classifier with more than one label, or a model with neither a classifier
            head nor a score template (e.g. a plain causal LM).
    """
    if has_template:
        return "template"
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        if num_labels not in (None, 1):
            raise UsageError(f"reranker {model!r} has {num_labels} labels; vLLM's score API needs exactly one")
        return "cross-encoder"
    if is_sentence_transformer or any(a.endswith(("Model", "ForMaskedLM")) for a in architectures):
        return "bi-encoder"
    raise UsageError(
        f"model {model!r} ({', '.join(architectures) or 'unknown architecture'}) has neither a classifier "
        "head nor a registered reranker recipe; pass preset= (see `vllm-eval models`), or a score_template "
        "with hf_overrides that give it a classifier head, or use a sequence-classification reranker"
    )


def num_labels(config: dict[str, Any]) -> int | None:
    """Number of labels a ``config.json`` declares (``id2label``, else ``num_labels``), or None."""
    if "id2label" in config:
        return len(config["id2label"])
    return config.get("num_labels")


def _pairs(queries: Iterable[Any], docs: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    # Not zip(strict=True): its ValueError would also swallow an input's own error (a UsageError is one).
    docs, end = iter(docs), object()
    for query in queries:
        doc = next(docs, end)
        if doc is end:
            break
        yield query, doc
    else:
        if next(docs, end) is end:
            return
    raise UsageError("predict() got different numbers of queries and documents")


class RerankerBase(PoolingBackendBase, ABC):
    """Base of the reranker backends: mteb ``predict`` over one hook, :meth:`_score_chunk`.

    Args:
        model: the resolved model path, hub id or served name.
        meta: mteb ``ModelMeta`` (``model_type=["cross-encoder"]``).
        prompting: query/document prefixes and instructions.
        mode: ``cross-encoder``, ``template`` or ``bi-encoder`` (see :func:`reranker_mode`).
        template: the score template (``mode="template"``), else None.
        max_length: token limit (None: unknown).
        tokenizer: a Hugging Face tokenizer; required when the class declares ``tokenizes_locally``.
        chunk_size: pairs handed to the backend per step.
        show_progress_bar: show a progress bar over each call's pairs.

    Raises:
        UsageError: ``chunk_size`` < 1; a template without ``mode="template"``; no tokenizer for a
            backend that tokenizes locally.
    """

    kind: ClassVar[str] = "reranker"

    def __init__(
        self,
        *,
        model: str,
        meta: Any,
        prompting: PromptResolver,
        mode: Mode,
        template: ScoreTemplate | None = None,
        max_length: int | None,
        tokenizer: Any = None,
        chunk_size: int = 512,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        if (template is not None) != (mode == "template"):
            raise UsageError(f"a score template goes with mode='template', got mode={mode!r}")
        super().__init__(
            model=model,
            model_ref=model_ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            # Used on the look-ahead thread while the backend may tokenize with its own.
            tokenizer=private_tokenizer(tokenizer),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )
        self.mode = mode
        self.template = template
        #: The model's image placeholder when it takes images in its prompt (a vision-language reranker), else None.
        self.image_placeholder: str | None = None

    def identity(self) -> dict[str, Any]:
        """The base identity plus the scoring mode (the template is part of each input)."""
        return {**super().identity(), "mode": self.mode}

    @abstractmethod
    def _score_chunk(self, queries: list[Any], documents: list[Any]) -> np.ndarray:
        """Score ``queries[i]`` against ``documents[i]`` (already prefixed or templated; str, or an
        :class:`~vllm_eval.models.images.ImageInput` whose prompt holds the image placeholder).

        Returns:
            float32 array (len(queries),).
        """

    def predict(
        self,
        inputs1: Any,
        inputs2: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Score aligned (query, document) pairs from two mteb ``DataLoader``s.

        Returns:
            float32 array of shape (n_pairs,): sigmoid probability (cross-encoder), P(yes)
            (Qwen3-style template) or cosine (bi-encoder). Higher is more relevant.

        Raises:
            OptionError: a query or document that is not a str (named by index).
            UsageError: the two loaders hold different numbers of items.
        """
        q_prefix = self.prompting.prefix(task_metadata, PromptType.query)
        d_prefix = self.prompting.prefix(task_metadata, PromptType.document)
        instruction = self.prompting.task_instruction(task_metadata)
        # Progress is the backend's own setting: mteb's encode_kwargs show_progress_bar drives mteb's bars.
        show = self.show_progress_bar
        queries = flatten(inputs_from(inputs1, q_prefix, self._model_inputs))
        pairs = _pairs(queries, flatten(inputs_from(inputs2, d_prefix, self._model_inputs)))
        return self._score_stream(pairs, instruction, loader_len(inputs1), show)

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        """One side's batch as model inputs: texts as they are; an image (with its text, if any) as an
        :class:`~vllm_eval.models.images.ImageInput` whose prompt is the model's image placeholder, then the text.

        Raises:
            UsageError: images for a reranker that takes text only.
        """
        if images is None:
            return texts or []
        if self.image_placeholder is None:
            raise UsageError(f"{self.name} scores texts only; this task's inputs have images")
        mark = self.image_placeholder
        if texts is None:
            return [ImageInput(im, mark) for im in images]
        return [ImageInput(im, mark + t) for t, im in zip(texts, images, strict=True)]

    def score_pairs(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        *,
        instruction: str | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """Score ``queries[i]`` against ``documents[i]`` with no task prompts; float32 (n_pairs,). An item may be
        an :class:`~vllm_eval.models.images.ImageInput` whose prompt holds the image placeholder (a vision-language
        model).

        Raises:
            OptionError: an item that is neither a str nor an image input.
            UsageError: different numbers of queries and documents.
        """
        queries, documents = texts_or_images(queries), texts_or_images(documents)
        if len(queries) != len(documents):
            raise UsageError(f"{len(queries)} queries but {len(documents)} documents")
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        return self._score_stream(zip(queries, documents, strict=True), instruction, len(queries), show)

    def _score_stream(
        self, pairs: Iterable[tuple[str, str]], instruction: str | None, total: int | None, show: bool
    ) -> np.ndarray:
        # Chunk k+1 is formatted, its lengths counted and looked up in the cache on a worker thread
        # while the backend scores chunk k (the fast tokenizer and SQLite release the GIL).
        parts: list[np.ndarray] = []
        n = n_cut = 0

        def prepare(chunk: list[tuple[str, str]]) -> tuple[list[str], list[str], int, list[bytes], dict[bytes, Any]]:
            qs, ds = [q for q, _ in chunk], [d for _, d in chunk]
            self._record(chunk)
            cut = 0
            if self.template is not None:
                qs, ds, cut = self._apply_template(qs, ds, instruction)
            lengths, over = self._pair_lengths(qs, ds)
            keys, hits = self._cached([[cache_form(q), cache_form(d)] for q, d in zip(qs, ds)])  # as the model sees it
            c = self.counters
            c.inputs += len(chunk)
            c.distinct += len(chunk)
            c.tokens += sum(lengths)
            c.compute_tokens += sum(n for n, k in zip(lengths, keys or [None] * len(lengths)) if k not in hits)
            return qs, ds, cut + over, keys, hits

        start = time.perf_counter()
        with input_bar("rerank", total, "pairs", enabled=show) as advance:
            for qs, ds, cut, keys, hits in prefetched(chunked(pairs, self.chunk_size), prepare):
                parts.append(self._score_cached(qs, ds, keys, hits))
                n += len(qs)
                n_cut += cut
                advance(len(qs))
        self.counters.add_compute(time.perf_counter() - start)
        self.counters.truncated += n_cut
        warn_truncated(n_cut, n, self.max_length, self.name, what="pairs")
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros((0,), dtype=np.float32)

    def _score_cached(self, qs: list[str], ds: list[str], keys: list[bytes], hits: dict[bytes, Any]) -> np.ndarray:
        """Scores of one chunk: the cache's, and the backend's for the rest (then stored)."""
        scores = self._merge_cached(
            keys,
            hits,
            len(qs),
            lambda miss: self._score_chunk([qs[i] for i in miss], [ds[i] for i in miss]),
            store=lambda score: np.asarray([score], dtype=np.float32),
            load=lambda stored: stored[0],
        )
        return np.asarray(scores, dtype=np.float32)

    def _lengths(self, texts: list[str], pairs: list[str] | None = None) -> list[int]:
        """Token counts, capped at ``max_length + 1`` (enough to tell "too long" without tokenizing
        whole documents, and without the tokenizer's over-length warning)."""
        enc = self.tokenizer(
            texts,
            pairs,
            add_special_tokens=self.template is None,
            truncation=True,
            max_length=self.max_length + 1,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return [len(x) for x in enc["input_ids"]]

    def _pair_lengths(self, qs: list[Any], ds: list[Any]) -> tuple[list[int], int]:
        """Tokens per pair after truncation, and how many pairs are over the limit (``[], 0`` when the
        server tokenizes). A bi-encoder's query and document count separately; an image's prompt counts
        (its placeholder as written, not the image's tokens)."""
        if self.tokenizer is None or self.max_length is None:
            return [], 0
        qs, ds = [prompt_of(q) for q in qs], [prompt_of(d) for d in ds]
        cap = self.max_length
        if self.mode == "bi-encoder":
            q_len, d_len = self._lengths(qs), self._lengths(ds)
            over = sum(n > cap for n in q_len + d_len)
            return [min(a, cap) + min(b, cap) for a, b in zip(q_len, d_len, strict=True)], over
        lengths = self._lengths([q + d for q, d in zip(qs, ds)]) if self.template else self._lengths(qs, ds)
        return [min(n, cap) for n in lengths], sum(n > cap for n in lengths)

    def _apply_template(
        self, qs: list[Any], ds: list[Any], instruction: str | None
    ) -> tuple[list[Any], list[Any], int]:
        """Format pairs with the score template; cut over-long documents inside ``{document}``.

        The template's head and tail (for Qwen3-Reranker: the assistant turn the score is read
        from) must survive truncation, so the document text is shortened by the excess tokens,
        never the prompt's end. Without a local tokenizer the pairs are formatted only. An image input's
        prompt is formatted the same way, and never cut.

        Raises:
            UsageError: a query whose templated part alone exceeds ``max_length``.
        """
        head, tail = self.template.document_parts()
        fq = [with_prompt(q, self.template.query(prompt_of(q), instruction)) for q in qs]
        fd = [with_prompt(d, head + prompt_of(d) + tail) for d in ds]
        if self.tokenizer is None or self.max_length is None:
            return fq, fd, 0
        lengths = self._lengths([prompt_of(q) + prompt_of(d) for q, d in zip(fq, fd, strict=True)])
        cut = 0
        for i, n in enumerate(lengths):
            if n <= self.max_length or not isinstance(ds[i], str) or not isinstance(fq[i], str):
                continue
            cut += 1
            fixed = len(self.tokenizer(fq[i] + head + tail, add_special_tokens=False)["input_ids"])
            budget = self.max_length - fixed - 8  # margin for merges across the cut
            if budget < 0:
                raise UsageError(
                    f"query {qs[i]!r:.60} with its template is longer than max_model_len={self.max_length} tokens"
                )
            ids = self.tokenizer(ds[i], add_special_tokens=False, truncation=True, max_length=max(budget, 1))[
                "input_ids"
            ]
            fd[i] = head + self.tokenizer.decode(ids[:budget]) + tail
        return fq, fd, cut
