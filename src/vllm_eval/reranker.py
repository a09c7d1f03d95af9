"""Rerankers: mteb's ``CrossEncoderProtocol`` over vLLM's score API, and the sentence-transformers reference.

Three ways a model scores a (query, document) pair, picked from the model's files:

* **cross-encoder** — a ``*ForSequenceClassification`` with one label (BERT-style rerankers):
  ``LLM.score`` tokenizes the pair as ``[CLS] q [SEP] d [SEP]`` and applies the head's sigmoid,
  exactly like sentence-transformers' ``CrossEncoder.predict``;
* **template** — a causal LM turned into a classifier by a recipe (``hf_overrides``) plus a
  :class:`~vllm_eval.registry.ScoreTemplate`, e.g. the built-in ``qwen3-reranker`` preset.
  mteb's own wrapper has ``# TODO: support score prompt``; here the template is applied;
* **bi-encoder** — an embedding model: cosine of the two embeddings, as vLLM's score API does
  for embed models.

A causal LM with neither a classifier head nor a recipe is refused with a clear error instead of
being silently scored with last-token embeddings.

Empty strings are valid input and get a score. One documented difference: for an empty *document*
a cross-encoder in vLLM sees ``[CLS] q [SEP]`` (HF's single-pair tokenization drops the empty
segment), while sentence-transformers' batched tokenization gives ``[CLS] q [SEP] [SEP]``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
from mteb.types import PromptType
from tqdm.auto import tqdm

from .encoder import TruncationWarning, prefetched
from .engine import (
    EngineUser,
    Resource,
    acquire_engine,
    merge_engine_kwargs,
    raise_on_request_errors,
    resolve_model,
)
from .modelinfo import build_model_meta, local_snapshot
from .prompts import PromptResolver, texts_from
from .registry import ModelPreset, ScoreTemplate, find_preset, get_preset

Mode = Literal["cross-encoder", "template", "bi-encoder"]


def reranker_mode(architectures: Sequence[str], *, has_template: bool, is_sentence_transformer: bool,
                  num_labels: int | None, model: str) -> Mode:
    """How ``model`` scores pairs, from its architectures and what recipe it was given.

    Raises:
        ValueError: a classifier with more than one label, or a model with neither a classifier
            head nor a score template (e.g. a plain causal LM).
    """
    if has_template:
        return "template"
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        if num_labels not in (None, 1):
            raise ValueError(f"reranker {model!r} has {num_labels} labels; vLLM's score API needs exactly one")
        return "cross-encoder"
    if is_sentence_transformer or any(a.endswith(("Model", "ForMaskedLM")) for a in architectures):
        return "bi-encoder"
    raise ValueError(
        f"model {model!r} ({', '.join(architectures) or 'unknown architecture'}) has neither a classifier "
        "head nor a registered reranker recipe; pass preset= (see `vllm-eval models`), or a score_template "
        "with hf_overrides that give it a classifier head, or use a sequence-classification reranker"
    )


def _num_labels(config: dict[str, Any]) -> int | None:
    if "id2label" in config:
        return len(config["id2label"])
    return config.get("num_labels")


def _pairs(inputs1: Any, inputs2: Any, q_prefix: str, d_prefix: str) -> Iterator[tuple[str, str]]:
    queries = (t for batch in texts_from(inputs1, q_prefix) for t in batch)
    docs = (t for batch in texts_from(inputs2, d_prefix) for t in batch)
    try:
        yield from zip(queries, docs, strict=True)
    except ValueError:
        raise ValueError("predict() got different numbers of queries and documents") from None


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[tuple[list[str], list[str]]]:
    qs: list[str] = []
    ds: list[str] = []
    for q, d in pairs:
        qs.append(q)
        ds.append(d)
        if len(qs) == size:
            yield qs, ds
            qs, ds = [], []
    if qs:
        yield qs, ds


class PairScorer(Resource):
    """Shared ``predict`` of our reranker backends: prefixes, templates, streaming, truncation report.

    Subclasses set ``self.prompting``, ``self.mode``, ``self.template``, ``self.tokenizer``,
    ``self.max_length``, ``self.mteb_model_meta`` and implement :meth:`_score_chunk`.
    """

    chunk_size: int = 512
    show_progress_bar: bool = True
    name: str = "reranker"
    template: ScoreTemplate | None = None

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
            TypeError: a query or document that is not a str (named by index).
            ValueError: the two loaders hold different numbers of items.
        """
        q_prefix = self.prompting.prefix(task_metadata, PromptType.query)
        d_prefix = self.prompting.prefix(task_metadata, PromptType.document)
        instruction = self.prompting.task_instruction(task_metadata)
        show = kwargs.get("show_progress_bar", self.show_progress_bar)
        total = None
        try:
            total = len(inputs1.dataset)
        except (AttributeError, TypeError):
            pass
        return self._score_stream(_pairs(inputs1, inputs2, q_prefix, d_prefix), instruction, total, show)

    def score_pairs(self, queries: Sequence[str], documents: Sequence[str], *, instruction: str | None = None,
                    show_progress_bar: bool | None = None) -> np.ndarray:
        """Score ``queries[i]`` against ``documents[i]`` with no task prompts; float32 (n_pairs,)."""
        from .prompts import check_texts

        queries, documents = check_texts(queries), check_texts(documents)
        if len(queries) != len(documents):
            raise ValueError(f"{len(queries)} queries but {len(documents)} documents")
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        return self._score_stream(zip(queries, documents), instruction, len(queries), show)

    def _score_stream(self, pairs: Iterable[tuple[str, str]], instruction: str | None, total: int | None,
                      show: bool) -> np.ndarray:
        # Chunk k+1 is formatted and its lengths counted on a worker thread while the engine scores
        # chunk k (the fast tokenizer releases the GIL), as the encoder does with its tokenization.
        parts: list[np.ndarray] = []
        n = n_cut = 0

        def prepare(chunk: tuple[list[str], list[str]]) -> tuple[list[str], list[str], int]:
            qs, ds = chunk
            if self.template is not None:
                return self._apply_template(qs, ds, instruction)
            return qs, ds, self._count_over_length(qs, ds)

        with tqdm(total=total, desc=f"rerank {self.name}", unit="pair", disable=not show) as bar:
            for qs, ds, cut in prefetched(_chunks(pairs, self.chunk_size), prepare):
                parts.append(self._score_chunk(qs, ds))
                n += len(qs)
                n_cut += cut
                bar.update(len(qs))
        if n_cut:
            warnings.warn(f"{n_cut} of {n} pairs exceeded {self.max_length} tokens and were truncated ({self.name})",
                          TruncationWarning, stacklevel=3)
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros((0,), dtype=np.float32)

    def _lengths(self, texts: list[str], pairs: list[str] | None = None) -> list[int]:
        """Token counts, capped at ``max_length + 1`` (enough to tell "too long" without tokenizing
        whole documents, and without the tokenizer's over-length warning)."""
        enc = self.tokenizer(texts, pairs, add_special_tokens=self.template is None, truncation=True,
                             max_length=self.max_length + 1, return_attention_mask=False,
                             return_token_type_ids=False)
        return [len(x) for x in enc["input_ids"]]

    def _count_over_length(self, qs: list[str], ds: list[str]) -> int:
        if self.mode == "bi-encoder":
            return sum(n > self.max_length for n in self._lengths(qs) + self._lengths(ds))
        return sum(n > self.max_length for n in self._lengths(qs, ds))

    def _apply_template(self, qs: list[str], ds: list[str], instruction: str | None) -> tuple[list[str], list[str], int]:
        """Format pairs with the score template; cut over-long documents inside ``{document}``.

        The template's head and tail (for Qwen3-Reranker: the assistant turn the score is read
        from) must survive truncation, so the document text is shortened by the excess tokens,
        never the prompt's end.
        """
        head, tail = self.template.document_parts()
        fq = [self.template.query(q, instruction) for q in qs]
        fd = [head + d + tail for d in ds]
        lengths = self._lengths([q + d for q, d in zip(fq, fd)])
        cut = 0
        for i, n in enumerate(lengths):
            if n <= self.max_length:
                continue
            cut += 1
            fixed = len(self.tokenizer(fq[i] + head + tail, add_special_tokens=False)["input_ids"])
            budget = self.max_length - fixed - 8  # margin for merges across the cut
            ids = self.tokenizer(ds[i], add_special_tokens=False, truncation=True, max_length=max(budget, 1))["input_ids"]
            keep = budget
            if keep < 0:
                raise ValueError(
                    f"query {qs[i]!r:.60} with its template is longer than max_model_len={self.max_length} tokens"
                )
            fd[i] = head + self.tokenizer.decode(ids[:keep]) + tail
        return fq, fd, cut

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


def _resolve_preset(model: str, preset: str | ModelPreset | None) -> ModelPreset | None:
    if isinstance(preset, ModelPreset):
        return preset
    if preset is not None:
        return get_preset(preset)
    return find_preset(model, kind="reranker")


def _read_config(model: str, revision: str | None) -> tuple[dict[str, Any], bool]:
    snap = local_snapshot(model, revision)
    if snap is None:
        return {}, False
    config = json.loads((snap / "config.json").read_text()) if (snap / "config.json").is_file() else {}
    return config, (snap / "modules.json").is_file()


class VllmCrossEncoder(EngineUser, PairScorer):
    """mteb ``CrossEncoderProtocol`` over vLLM's score API (``LLM.score``, pooling runner).

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        preset: a registered preset name (``"qwen3-reranker"``) or a :class:`ModelPreset`; when
            None, a preset whose pattern matches ``model`` is used (e.g. ``Qwen/Qwen3-Reranker-4B``).
        score_template: a :class:`ScoreTemplate` for any model (overrides the preset's).
        prompts: static query/document prefixes (``{"query": ..., "document": ...}``, mteb keys).
        instructions: per task name / type instruction for templates with ``{instruction}``;
            default: the task's own prompt, else the template's default instruction.
        chunk_size: pairs handed to the engine per call.
        show_progress_bar: tqdm bar per ``predict``.
        model_name: name recorded in results.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len``, ``hf_overrides`` ...);
            merged over the preset's (``hf_overrides`` dicts are merged key by key).

    Raises:
        ValueError: no way to score pairs with this model (see :func:`reranker_mode`).
        FileNotFoundError, TypeError, vllm_eval.engine.EngineError: as for ``VllmEncoder``.
    """

    def __init__(
        self,
        model: str,
        revision: str | None = None,
        *,
        preset: str | ModelPreset | None = None,
        score_template: ScoreTemplate | None = None,
        prompts: dict[str, str] | None = None,
        instructions: dict[str, str] | None = None,
        chunk_size: int = 512,
        show_progress_bar: bool = True,
        model_name: str | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        del device  # mteb protocol signature; vLLM's build decides the device
        self.model = resolve_model(model)
        self.preset = _resolve_preset(model, preset)
        self.template = score_template or (self.preset.score_template if self.preset else None)
        self.prompting = PromptResolver(prompts=prompts, instructions=instructions)
        self.chunk_size = int(chunk_size)
        self.show_progress_bar = show_progress_bar
        # A template makes one prompt of query part + document part; without use_sep_token=False
        # vLLM would tokenize them as a pair with separator tokens between.
        kwargs = merge_engine_kwargs(
            self.preset.engine_kwargs if self.preset else None,
            engine_kwargs,
            {"hf_overrides": {"use_sep_token": False}} if self.template is not None else None,
            {"revision": revision} if revision is not None else None,
        )
        config, is_st = _read_config(self.model, revision)
        archs = (kwargs.get("hf_overrides") or {}).get("architectures") or config.get("architectures") or []
        if config:
            self.mode = reranker_mode(archs, has_template=self.template is not None, is_sentence_transformer=is_st,
                                      num_labels=_num_labels(config), model=model)
            convert = "embed" if self.mode == "bi-encoder" else "classify"
        else:  # a hub id not in the local cache: vLLM decides, checked below
            self.mode, convert = ("template", "classify") if self.template else ("cross-encoder", "auto")
        self.engine_kwargs = {"runner": "pooling", "convert": convert, "trust_remote_code": trust_remote_code, **kwargs}
        self.llm = acquire_engine(self.model, **self.engine_kwargs)
        try:
            if not config:
                hf = self.llm.model_config.hf_config
                self.mode = reranker_mode(getattr(hf, "architectures", None) or [], has_template=self.template is not None,
                                          is_sentence_transformer=False, num_labels=getattr(hf, "num_labels", None),
                                          model=model)
            self.tokenizer = self.llm.get_tokenizer()
            self.max_length = int(self.llm.model_config.max_model_len)
            meta = build_model_meta(self.model, revision=revision, model_name=model_name, max_model_len=self.max_length)
            self.mteb_model_meta = meta.model_copy(update={"model_type": ["cross-encoder"], "embed_dim": None,
                                                           "similarity_fn_name": None})
        except BaseException:
            self.close()
            raise
        self.name = self.mteb_model_meta.name

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:
        outputs = self.llm.score(queries, documents, use_tqdm=False,
                                 tokenization_kwargs={"truncate_prompt_tokens": -1})
        raise_on_request_errors(outputs, lambda i: f"pair {i} (query {queries[i]!r:.60})")
        return np.asarray([o.outputs.score for o in outputs], dtype=np.float32)


class SentenceTransformerCrossEncoder(PairScorer):
    """Reference backend: ``sentence_transformers.CrossEncoder.predict`` behind the same interface.

    Templates are not supported here (a Qwen3-style recipe has no sentence-transformers form);
    the reference for those is a direct transformers computation, see the tests.
    """

    def __init__(self, model: str, revision: str | None = None, *, prompts: dict[str, str] | None = None,
                 batch_size: int = 32, chunk_size: int = 512, show_progress_bar: bool = True,
                 device: str | None = None, model_name: str | None = None, trust_remote_code: bool = False,
                 max_model_len: int | None = None) -> None:
        from sentence_transformers import CrossEncoder

        self.model = resolve_model(model)
        self.ce = CrossEncoder(self.model, revision=revision, device=device, trust_remote_code=trust_remote_code,
                               max_length=max_model_len)
        self.prompting = PromptResolver(prompts=prompts)
        self.mode = "cross-encoder"
        self.tokenizer = self.ce.tokenizer
        self.max_length = int(self.ce.max_seq_length)
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.show_progress_bar = show_progress_bar
        meta = build_model_meta(self.model, revision=revision, model_name=model_name, max_model_len=self.max_length,
                                framework=["Sentence Transformers", "PyTorch"])
        self.mteb_model_meta = meta.model_copy(update={"model_type": ["cross-encoder"], "embed_dim": None,
                                                       "similarity_fn_name": None})
        self.name = self.mteb_model_meta.name

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:
        scores = self.ce.predict(list(zip(queries, documents)), batch_size=self.batch_size, show_progress_bar=False,
                                 convert_to_numpy=True)
        return np.asarray(scores, dtype=np.float32).reshape(-1)

    def close(self) -> None:
        """Drop the model. Idempotent."""
        self.ce = None


def load_reranker(model: str | None, backend: str = "vllm", **kwargs: Any) -> PairScorer:
    """A reranker for ``model`` on ``backend``: ``vllm``, ``st`` or ``remote`` (``endpoints=`` then
    names the servers and ``model`` the served name, None for the server's)."""
    if backend == "remote":
        from .remote import RemoteCrossEncoder

        return RemoteCrossEncoder(kwargs.pop("endpoints"), model, **kwargs)
    if backend == "st":
        return SentenceTransformerCrossEncoder(model, **kwargs)
    if backend == "vllm":
        return VllmCrossEncoder(model, **kwargs)
    raise ValueError(f"unknown reranker backend {backend!r}; use 'vllm', 'st' or 'remote'")
