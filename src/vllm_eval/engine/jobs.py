"""What runs on an engine: each kind's ``setup(llm) -> info`` and its jobs ``fn(llm, payload) -> result``.

The single code path of the in-process engine and of every replica (local process or Ray actor), which
receives these functions pickled by name. They live here, apart from the backends, because unpickling a
function imports its module: a backend's module imports mteb (its base classes are mteb's), and a
replica that imported mteb, datasets, pandas and scikit-learn with it spent 1.8 of its 2.2 s of
interpreter start on this 2-core machine before vLLM's own import. This module imports NumPy and
(lazily) vLLM only.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy as np

from .outputs import check_outputs, refusals_as_usage_errors
from .pipeline import engine_pipeline


def pooling_info(llm: Any) -> dict[str, Any]:
    """What a classifier, token classifier or token embedder needs from an engine: tokenizer, limits,
    pooling tasks, the HF config (labels), dtype, the image placeholder of a vision-language model (picklable: a
    replica sends it to the parent)."""
    config = llm.model_config
    encoder_config = getattr(config, "encoder_config", None) or {}
    return {
        "tokenizer": plain_tokenizer(llm.get_tokenizer()),
        "max_model_len": int(config.max_model_len),
        "do_lower_case": bool(encoder_config.get("do_lower_case", False)),
        "supported_tasks": list(llm.supported_tasks),
        "hf_config": config.hf_config.to_dict(),
        "dtype": str(config.dtype),
        "quantization": config.quantization,
        "image_placeholder": image_placeholder(config),
        "is_multimodal": bool(config.is_multimodal_model),
    }


def plain_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer inside vLLM's wrappers (``get_cached_tokenizer``, ``maybe_make_thread_pool`` in
    ``vllm.tokenizers.hf``), whose pickles are calls into vLLM: a parent unpickling a replica's tokenizer imported
    vLLM and torch for it (2.5 s on the 2-core CPU, after the replicas were ready). Any other tokenizer as it is."""
    for _ in range(4):  # wrappers may nest
        try:
            rebuild, args = tokenizer.__reduce__()[:2]
        except Exception:  # not picklable this way: as it is
            return tokenizer
        if not str(getattr(rebuild, "__module__", "")).startswith("vllm.") or not args:
            return tokenizer
        tokenizer = args[0]
    return tokenizer


def image_placeholder(config: Any) -> str | None:
    """The image placeholder of a vision-language model that takes prompts around its images (what vLLM's chat
    parser writes for one image), or None: a text model, or CLIP / SigLIP (an image alone, no prompt)."""
    if not config.is_multimodal_model or getattr(config.hf_config, "model_type", None) in ("clip", "siglip"):
        return None
    from vllm.model_executor.model_loader import get_model_cls

    try:
        return get_model_cls(config).get_placeholder_str("image", 1)
    except ValueError:  # a model without an image placeholder (audio or video only): prompts do not apply
        return None


def encoder_info(llm: Any) -> dict[str, Any]:
    """What an encoder needs from an engine: :func:`pooling_info` plus its
    matryoshka support, width and pooler (picklable, for replicas)."""
    config = llm.model_config
    return {
        **pooling_info(llm),
        "is_matryoshka": bool(config.is_matryoshka),
        "matryoshka_dimensions": list(config.matryoshka_dimensions or []),
        "embedding_size": int(config.embedding_size),
        "pooler": repr(getattr(config, "pooler_config", None)),
        "is_multimodal": bool(config.is_multimodal_model),
        "pads_text": getattr(config.hf_config, "model_type", None) == "siglip",
    }


def _embed_request(payload: tuple[list[Any], int | None, bool | None]) -> tuple[list[Any], Any, dict | None]:
    """One chunk's ``embed`` request as vLLM takes it: the prompts (token ids as ``TokensPrompt``s; texts and
    prompts with images as they are), the ``PoolingParams`` and the tokenization options (texts: vLLM tokenizes,
    without truncation; else None)."""
    from vllm import PoolingParams
    from vllm.inputs import TokensPrompt

    inputs, dimensions, normalize = payload
    params = PoolingParams(dimensions=dimensions, use_activation=normalize)
    if inputs and isinstance(inputs[0], str):
        return inputs, params, {"truncate_prompt_tokens": -1}
    if inputs and not isinstance(inputs[0], dict):  # token ids (a dict is a prompt with images)
        return [TokensPrompt(prompt_token_ids=x) for x in inputs], params, None
    return inputs, params, None


def embed_job(llm: Any, payload: tuple[list[Any], int | None, bool | None]) -> np.ndarray:
    """Embed one chunk on ``llm``: token-id lists, texts, or prompts with ``multi_modal_data`` -> float32 (n, dim).

    The single code path of the in-process engine and of every replica. ``LLM.encode(pooling_task="embed")``, which
    ``LLM.embed`` wraps, without ``LLM.embed``'s conversion of each vector into a list of Python floats (rows are
    read from the pooled tensors by :func:`embedding_rows`: the same values). On an H100 that conversion and ours
    back into an array were 32 % of a BERT-base replica's busy time (py-spy, docs/bench/h100-profile).

    Raises:
        RequestFailed: vLLM failed on an input (its index in the chunk and vLLM's reason).
    """
    prompts, params, tokenization = _embed_request(payload)
    kwargs = {"tokenization_kwargs": tokenization} if tokenization is not None else {}
    return embedding_rows(llm.encode(prompts, pooling_params=params, use_tqdm=False, pooling_task="embed", **kwargs))


class TokenizedRows(NamedTuple):
    """What :func:`embed_texts_job` gives back: the rows, and what tokenizing the texts found (the command counts it
    as it would have counted its own tokenization). Parts of one split join field by field."""

    #: float32 (n, dim), in the texts' order.
    rows: np.ndarray
    #: int32 (n,): tokens of each text as embedded (after truncation).
    lengths: np.ndarray
    #: bool (n,): the texts cut to the token limit.
    truncated: np.ndarray


#: Each engine's tokenizers by :meth:`~vllm_eval.engine.tokenizing.BatchTokenizer.settings`, made on first use and
#: gone with the engine (as the pipelines of :func:`~vllm_eval.engine.pipeline.engine_pipeline`).
_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def embed_texts_job(llm: Any, payload: tuple[list[str], int | None, bool | None, tuple]) -> TokenizedRows:
    """Tokenize texts here, as the command would (:class:`~vllm_eval.engine.tokenizing.BatchTokenizer` with the
    command's ``settings`` around this engine's tokenizer, the same files), then :func:`embed_job` the token ids.

    A replica runs this so that the command's process, which feeds every replica under one GIL, does no per-token
    work: on four H100s its tokenizing thread was the busiest thread of a whole-benchmark run and set the pace of all
    16 replicas (docs/bench/h100x4-scaling). The ids, and so the rows, are the ones the command would have sent.

    Raises:
        RequestFailed: vLLM failed on an input (its index in the chunk and vLLM's reason).
    """
    from .tokenizing import BatchTokenizer

    texts, dimensions, normalize, settings = payload
    made = _TOKENIZERS.setdefault(llm, {})
    tokenizer = made.get(settings)
    if tokenizer is None:
        max_length, lower, specials, pads = settings
        tokenizer = BatchTokenizer(
            plain_tokenizer(llm.get_tokenizer()), max_length, lower, add_special_tokens=specials, pad_to_max_length=pads
        )
        made[settings] = tokenizer
    ids, over = tokenizer.with_truncated(texts)
    rows = embed_job(llm, (ids, dimensions, normalize))
    cut = np.zeros(len(ids), dtype=bool)
    cut[over] = True
    return TokenizedRows(rows, np.fromiter(map(len, ids), dtype=np.int32, count=len(ids)), cut)


def submit_embed(
    llm: Any, payload: tuple[list[Any], int | None, bool | None], named: Callable[[Callable[[], Any]], Any]
) -> Future | None:
    """:func:`embed_job` without waiting, on the in-process engine's :mod:`~vllm_eval.engine.pipeline`: a future of the
    same float32 (n, dim) rows (computed through ``named``, which names a failed request), or None where the
    pipeline does not apply (then ``embed_job`` runs): images (prompts with ``multi_modal_data`` go through
    ``LLM.encode``), no inputs, an engine without the pipeline's APIs.

    Raises:
        VLLMValidationError: vLLM refused an input before it ran (none of the chunk is left in the engine).
    """
    inputs = payload[0]
    pipeline = engine_pipeline(llm, "embed") if inputs and not isinstance(inputs[0], dict) else None
    if pipeline is None:
        return None
    prompts, params, tokenization = _embed_request(payload)

    def finish(outputs: list[Any]) -> np.ndarray:
        return named(lambda: embedding_rows(outputs))

    return pipeline.submit(prompts, params, "embed", finish, tokenization)


def embedding_rows(outputs: list[Any]) -> np.ndarray:
    """Finished ``PoolingRequestOutput``s of ``embed`` requests -> float32 (n, dim): the values ``LLM.embed`` would
    give (``EmbeddingOutput.from_base`` reads each pooled vector into Python floats; here they are cast to float32
    without that round trip, which changes no value).

    Raises:
        RequestFailed: vLLM failed on an output (its index and reason).
        ValueError: a pooled output that is not one vector.
    """
    import torch

    data = [o.outputs.data for o in check_outputs(outputs)]
    if any(d.ndim != 1 for d in data):
        raise ValueError("pooled_data should be a 1-D embedding vector")
    if data and all(isinstance(d, torch.Tensor) for d in data):
        return torch.stack([d.detach().cpu() for d in data]).to(torch.float32).numpy()
    return np.asarray([np.asarray(d, dtype=np.float32) for d in data], dtype=np.float32)


def generator_info(llm: Any) -> dict[str, Any]:
    """What a generator needs from an engine: its tokenizer, limits and what changes outputs
    (picklable: a replica sends it to the parent)."""
    config = llm.model_config
    return {
        "tokenizer": plain_tokenizer(llm.get_tokenizer()),
        "max_model_len": int(config.max_model_len),
        "is_multimodal": bool(config.is_multimodal_model),
        "dtype": str(config.dtype),
        "quantization": config.quantization,
        "hf_chat_template": _resolved_chat_template(llm),
    }


def _resolved_chat_template(llm: Any) -> str | None:
    """The chat template vLLM resolves for the model (the tokenizer's, or vLLM's fallback for its type), as
    lm-evaluation-harness's vLLM backend reads it (``resolve_hf_chat_template``); None where vLLM finds none."""
    try:
        from vllm.renderers.hf import resolve_chat_template
    except ImportError:  # before vLLM moved it (vllm-project/vllm#30200)
        from vllm.entrypoints.chat_utils import resolve_hf_chat_template as resolve_chat_template
    try:
        return resolve_chat_template(llm.get_tokenizer(), chat_template=None, tools=None, model_config=llm.model_config)
    except Exception:  # a tokenizer without templates of any kind: the model has none
        return None


def call_job(llm: Any, payload: tuple[str, list[Any], Any, str, dict[str, Any]]) -> list[Any]:
    """One engine call: ``(method, prompts, params, what, kwargs)`` -> vLLM's outputs, in order. The single
    code path of the in-process engine and of every replica.

    Raises:
        UsageError: vLLM refused a request before it ran (``what`` names it).
        RequestFailed: vLLM failed on a request (its index and vLLM's reason).
    """
    method, prompts, params, what, kwargs = payload
    with refusals_as_usage_errors(what):
        return check_outputs(getattr(llm, method)(prompts, params, use_tqdm=False, **kwargs))


def submit_generate(
    llm: Any, payload: tuple[str, list[Any], Any, str, dict[str, Any]], named: Callable[[Callable[[], Any]], Any]
) -> Future | None:
    """:func:`call_job` of ``LLM.generate`` without waiting, on the in-process engine's
    :mod:`~vllm_eval.engine.pipeline`: a future of the same outputs in order (checked through ``named``, which
    names a failed request), or None where the pipeline does not apply (then ``call_job`` runs): another method,
    call options, prompts with images, no prompts, an engine without the pipeline's APIs.

    Raises:
        VLLMValidationError: vLLM refused a request before it ran (none of the chunk is left in the engine).
    """
    method, prompts, params, _, kwargs = payload
    if method != "generate" or kwargs or not prompts:
        return None
    if any(isinstance(p, dict) and p.get("multi_modal_data") for p in prompts):
        return None
    pipeline = engine_pipeline(llm, "generate")
    if pipeline is None:
        return None
    return pipeline.submit(prompts, params, "generate", lambda outputs: named(lambda: check_outputs(outputs)))


def reranker_info(llm: Any) -> dict[str, Any]:
    """What a reranker needs from an engine: :func:`pooling_info` plus the
    architecture and number of labels (picklable: a replica sends it to the parent)."""
    hf = llm.model_config.hf_config
    return {
        **pooling_info(llm),
        "architectures": list(getattr(hf, "architectures", None) or []),
        "num_labels": getattr(hf, "num_labels", None),
    }


def score_job(llm: Any, payload: tuple[list[Any], list[Any]]) -> np.ndarray:
    """Score one chunk of (query, document) pairs on ``llm``: float32 (n,). The single code path of the
    in-process engine and of every replica. An :class:`~vllm_eval.models.images.ImageInput` goes as vLLM's
    ``ScoreMultiModalParam`` (its prompt, which holds the image placeholder, and the image).

    Raises:
        RequestFailed: vLLM failed on a pair (its index in the chunk and vLLM's reason).
    """
    queries, documents = ([_score_input(x) for x in side] for side in payload)
    outputs = llm.score(queries, documents, use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": -1})
    return np.asarray([o.outputs.score for o in check_outputs(outputs)], dtype=np.float32)


def _score_input(x: Any) -> Any:
    """A text as it is; an image input as vLLM's ``ScoreMultiModalParam``. Its prompt already holds the model's
    placeholder, so vLLM's parser leaves the text as written and adds the image at that place."""
    if isinstance(x, str):
        return x
    return {"content": [{"type": "text", "text": x.prompt}, {"type": "image_pil", "image_pil": x.image}]}


def token_pooling_job(llm: Any, payload: tuple[str, list[Any]]) -> list[np.ndarray]:
    """One float32 (n_tokens, width) array per token-id sequence (or prompt with ``multi_modal_data``: an image's
    tokens count) from a token-level pooling task (``token_classify``: label probabilities; ``token_embed``:
    token vectors). The single code path of the in-process engine and of every replica.

    Raises:
        RequestFailed: vLLM failed on a sequence (its index in the chunk and vLLM's reason).
    """
    from vllm.inputs import TokensPrompt

    task, ids = payload
    prompts = [x if isinstance(x, dict) else TokensPrompt(prompt_token_ids=x) for x in ids]
    outputs = llm.encode(prompts, pooling_task=task, use_tqdm=False)
    return [np.asarray(o.outputs.data, dtype=np.float32) for o in check_outputs(outputs)]


def classify_job(llm: Any, payload: tuple[list[list[int]], bool, str]) -> np.ndarray:
    """Class probabilities (or logits, ``use_activation=False``) of token-id sequences: float32 (n, labels).
    ``token_classify`` models (a per-token reward head) are read at the last token, where a sequence
    classifier pools. The single code path of the in-process engine and of every replica.

    Raises:
        RequestFailed: vLLM failed on a text (its index in the chunk and vLLM's reason).
    """
    from vllm import PoolingParams
    from vllm.inputs import TokensPrompt

    ids, use_activation, pooling_task = payload
    prompts = [TokensPrompt(prompt_token_ids=x) for x in ids]
    params = PoolingParams(use_activation=use_activation)
    if pooling_task == "classify":
        outputs = check_outputs(llm.classify(prompts, pooling_params=params, use_tqdm=False))
        return np.asarray([o.outputs.probs for o in outputs], dtype=np.float32)
    outputs = check_outputs(llm.encode(prompts, pooling_params=params, pooling_task="token_classify", use_tqdm=False))
    return np.stack([np.asarray(o.outputs.data[-1], dtype=np.float32) for o in outputs])


def pack_sparse_row(ids: Any, weights: Any, max_active_dims: int | None = None) -> np.ndarray:
    """One sparse vector from token ids and their weights: weights <= 0 dropped, a repeated id kept at its
    largest weight (FlagEmbedding's ``_process_token_weights``), the ``max_active_dims`` largest kept
    (sentence-transformers' top-k; ties: the lower id), ids ascending.

    Returns:
        int32 (2, nnz): the ids, then the float32 weights' bits (8 bytes per non-zero, cached as they are).
    """
    ids = np.asarray(ids, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float32)
    keep = weights > 0
    ids, weights = ids[keep], weights[keep]
    if len(ids):
        order = np.lexsort((-weights, ids))  # by id, each id's largest weight first
        ids, weights = ids[order], weights[order]
        first = np.concatenate([[True], ids[1:] != ids[:-1]])
        ids, weights = ids[first], weights[first]
    if max_active_dims is not None and len(ids) > max_active_dims:
        top = np.sort(np.argsort(-weights, kind="stable")[:max_active_dims])
        ids, weights = ids[top], weights[top]
    return np.stack([ids.astype(np.int32), weights.view(np.int32)])


def splade_job(llm: Any, payload: tuple[list[list[int]], int | None]) -> list[np.ndarray]:
    """SPLADE vectors (vLLM's ``BertSpladeSparseEmbeddingModel``, ``embed``: one vocabulary-sized vector per text)
    of token-id sequences, kept sparse here (:func:`pack_sparse_row`), so a replica sends back non-zeros only.

    Raises:
        RequestFailed: vLLM failed on a sequence (its index in the chunk and vLLM's reason).
    """
    from vllm.inputs import TokensPrompt

    ids, max_active_dims = payload
    outputs = llm.encode([TokensPrompt(prompt_token_ids=x) for x in ids], pooling_task="embed", use_tqdm=False)
    rows = []
    for out in check_outputs(outputs):
        dense = np.asarray(out.outputs.data, dtype=np.float32)
        nz = np.flatnonzero(dense)
        rows.append(pack_sparse_row(nz, dense[nz], max_active_dims))
    return rows


def lexical_weights_job(llm: Any, payload: tuple[list[list[int]], int | None, list[int]]) -> list[np.ndarray]:
    """BGE-M3's lexical weights (``token_classify``: one ReLU weight per token, vLLM's ``BOSEOSFilter`` having
    dropped the first token when it is BOS and the last when it is EOS) of token-id sequences, summed up per token
    id as FlagEmbedding does: the largest weight of each id, the ids of ``special`` (its CLS, EOS, PAD, UNK)
    dropped (:func:`pack_sparse_row`).

    Raises:
        RequestFailed: vLLM failed on a sequence (its index in the chunk and vLLM's reason).
        ValueError: an output whose length does not match its tokens (another vLLM filtering).
    """
    from vllm.inputs import TokensPrompt

    ids, max_active_dims, special = payload
    hf = llm.model_config.hf_config
    bos, eos = getattr(hf, "bos_token_id", None), getattr(hf, "eos_token_id", None)
    prompts = [TokensPrompt(prompt_token_ids=x) for x in ids]
    outputs = check_outputs(llm.encode(prompts, pooling_task="token_classify", use_tqdm=False))
    rows = []
    for seq, out in zip(ids, outputs, strict=True):
        weights = np.asarray(out.outputs.data, dtype=np.float32).reshape(-1)
        lo = 1 if seq and seq[0] == bos else 0
        hi = len(seq) - 1 if len(seq) > lo and seq[-1] == eos else len(seq)
        tokens = np.asarray(seq[lo:hi], dtype=np.int64)
        if len(tokens) != len(weights):
            raise ValueError(f"{len(weights)} lexical weights for {len(tokens)} tokens")
        kept = ~np.isin(tokens, np.asarray(special, dtype=np.int64))
        rows.append(pack_sparse_row(tokens[kept], weights[kept], max_active_dims))
    return rows


def reload_job(llm: Any, model: str) -> None:
    """A replica's engine loads ``model``'s weights in place (:func:`vllm_eval.engine.build.reload_engine`).

    Raises:
        EngineError: the engine is shared in the replica's process (it never is), or vLLM failed to load them.
    """
    from ..utils.errors import EngineError
    from .build import reload_engine

    if not reload_engine(llm, model):
        raise EngineError(f"the replica's engine is shared: {model!r}'s weights were not loaded into it")
