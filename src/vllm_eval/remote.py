"""Already-served models: OpenAI-compatible ``vllm serve`` endpoints as backends.

* :class:`RemoteEncoder` — mteb encoder over ``POST /v1/embeddings``;
* :class:`RemoteCrossEncoder` — mteb cross-encoder over ``POST /score`` (or ``/rerank``);
* :class:`RemoteGenerator` — chat generation over ``POST /v1/chat/completions`` (images as
  data URLs), ``/v1/completions`` for raw prompts.

Each uses the prompts, chunking and result handling of its in-process counterpart. Requests
carry ``batch_size`` inputs each, run concurrently (at most ``max_concurrency`` in flight), are
spread round-robin over the endpoints, retried with exponential backoff on connection errors,
time-outs, 429 and 5xx, and their results are put back in input order. An endpoint that keeps
failing is skipped with a warning; when every endpoint is dead the call fails with a clear error.
A 400 (for instance an over-long input) is narrowed down to the offending input, which the error
names. HTTP is httpx's; nothing here opens sockets itself.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from .encoder import TextEncoder
from .generator import ChatPrompter, Generation
from .modelinfo import build_model_meta
from .prompts import PromptResolver
from .reranker import PairScorer

logger = logging.getLogger(__name__)


class EndpointError(RuntimeError):
    """No endpoint could serve a request, or a server refused an input (named in the message)."""


class _Endpoints:
    """Round-robin over live endpoints; an endpoint that exhausts its retries is marked dead."""

    def __init__(self, urls: list[str]):
        self.urls = [u.rstrip("/") for u in urls]
        self.dead: set[str] = set()
        self.used: dict[str, int] = {u: 0 for u in self.urls}
        self._cycle = itertools.cycle(self.urls)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            for _ in range(len(self.urls)):
                url = next(self._cycle)
                if url not in self.dead:
                    self.used[url] += 1
                    return url
        raise EndpointError(f"every endpoint is unreachable: {', '.join(self.urls)}")

    def kill(self, url: str, reason: str) -> None:
        with self._lock:
            if url not in self.dead:
                self.dead.add(url)
                warnings.warn(f"endpoint {url} skipped after retries: {reason}", RuntimeWarning, stacklevel=2)


class RemoteClient:
    """The HTTP side shared by the remote backends: endpoints, retries, failover, bounded concurrency.

    Args:
        endpoints: base URLs, e.g. ``["http://127.0.0.1:8000"]``.
        api_key: bearer token for servers started with ``--api-key``.
        timeout: seconds per request.
        retries: attempts per endpoint before it is skipped.
        backoff: first retry delay in seconds, doubled each attempt.
        max_concurrency: requests in flight at once, over all endpoints.
    """

    def __init__(self, endpoints: list[str] | str, *, api_key: str | None = None, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 0.5, max_concurrency: int = 8) -> None:
        import httpx

        urls = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not urls:
            raise ValueError("at least one endpoint URL is needed")
        self.endpoints = _Endpoints(urls)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers,
                                   limits=httpx.Limits(max_connections=max(int(max_concurrency), 1) + 2))
        self.retries, self.backoff = int(retries), float(backoff)
        self.max_concurrency = int(max_concurrency)

    def request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One request with retries, moving to the next endpoint when one is exhausted.

        Raises:
            EndpointError: every endpoint is dead.
            RequestRefused: the server answered 4xx other than 429 (the input is at fault).
        """
        import httpx

        while True:
            url = self.endpoints.next()
            last = ""
            for attempt in range(self.retries):
                try:
                    resp = self.client.request(method, url + path, json=payload)
                except (httpx.TransportError, httpx.TimeoutException) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if resp.status_code == 200:
                        return resp.json()
                    if resp.status_code != 429 and resp.status_code < 500:
                        raise RequestRefused(resp.status_code, _message(resp))
                    last = f"HTTP {resp.status_code}: {_message(resp)}"
                time.sleep(self.backoff * 2**attempt)
            self.endpoints.kill(url, last)

    def models(self) -> dict:
        """The first entry of ``GET /v1/models`` (id, max_model_len) of the first live endpoint."""
        return self.request("GET", "/v1/models")["data"][0]

    def served_model(self, model: str | None) -> tuple[str, int]:
        """``(model name, max_model_len or 0)``: ``model`` or the server's; the client is closed on failure."""
        try:
            info = self.models()
        except BaseException:
            self.close()
            raise
        return model or info["id"], int(info.get("max_model_len") or 0)

    def map(self, fn: Any, items: list[Any]) -> list[Any]:
        """``fn`` over ``items`` with at most ``max_concurrency`` at once; results in input order."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="vllm-eval-http") as pool:
            return list(pool.map(fn, items))

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self.client.close()


def bisect_refused(fn: Any, items: list[Any], name: Any) -> list[Any]:
    """``fn(items)`` (a list result per item); when the server refuses the batch, narrow it down.

    A refused batch is split in halves until the single refused item is found, and
    :class:`EndpointError` names it with ``name(item)`` and the server's reason.
    """
    try:
        return fn(items)
    except RequestRefused as exc:
        if len(items) == 1:
            raise EndpointError(f"server refused {name(items[0])} (HTTP {exc.status}): {exc.message}") from None
        half = len(items) // 2
        return bisect_refused(fn, items[:half], name) + bisect_refused(fn, items[half:], name)


class RemoteEncoder(TextEncoder):
    """mteb ``EncoderProtocol`` over OpenAI-compatible ``/v1/embeddings`` endpoints (``vllm serve``).

    Args:
        endpoints: base URLs, e.g. ``["http://127.0.0.1:8000"]`` (``/v1`` is appended).
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        api_key: bearer token for servers started with ``--api-key``.
        dimensions: matryoshka width, sent as the request's ``dimensions``.
        encoding_format: ``"float"`` or ``"base64"`` (float32 little-endian, smaller responses).
        batch_size: inputs per HTTP request.
        max_concurrency, timeout, retries, backoff: see :class:`RemoteClient`.
        prompts, instruction_template, instructions, apply_instruction_to_documents: as for
            :class:`~vllm_eval.encoder.VllmEncoder`.

    Raises:
        EndpointError: no endpoint answers, or a server refuses an input.
    """

    def __init__(
        self,
        endpoints: list[str] | str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        dimensions: int | None = None,
        encoding_format: Literal["float", "base64"] = "float",
        batch_size: int = 64,
        max_concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        prompts: dict[str, str] | None = None,
        instruction_template: Any = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        if encoding_format not in ("float", "base64"):
            raise ValueError(f"encoding_format must be 'float' or 'base64', got {encoding_format!r}")
        self.prompting = PromptResolver(prompts=prompts, instruction_template=instruction_template,
                                        instructions=instructions,
                                        apply_instruction_to_documents=apply_instruction_to_documents)
        self.http = RemoteClient(endpoints, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff,
                                 max_concurrency=max_concurrency)
        self.dimensions, self.encoding_format = dimensions, encoding_format
        self.batch_size = int(batch_size)
        self.chunk_size, self.show_progress_bar = int(chunk_size), show_progress_bar
        self.tokenize = None  # the server tokenizes and truncates (truncate_prompt_tokens=-1)
        self.model, self.max_length = self.http.served_model(model)
        self.mteb_model_meta = build_model_meta(self.model, model_name=model_name or self.model,
                                                embed_dim=dimensions, max_model_len=self.max_length or None,
                                                framework=["API"])
        self.name = self.mteb_model_meta.name

    def _post(self, texts: list[str]) -> list[np.ndarray]:
        payload: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": self.encoding_format,
                                   "truncate_prompt_tokens": -1}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        data = sorted(self.http.request("POST", "/v1/embeddings", payload)["data"], key=lambda d: d["index"])
        if self.encoding_format == "base64":
            return [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
        return [np.asarray(d["embedding"], dtype=np.float32) for d in data]

    def _embed_request(self, texts: list[str]) -> np.ndarray:
        return np.stack(bisect_refused(self._post, texts, lambda t: f"input {t!r:.80}"))

    def _embed_chunk(self, texts: list[str], ids: Any) -> np.ndarray:
        batches = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        return np.concatenate(self.http.map(self._embed_request, batches)).astype(np.float32, copy=False)

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self.http.close()


class RemoteCrossEncoder(PairScorer):
    """mteb ``CrossEncoderProtocol`` over a served reranker's ``/score`` (default) or ``/rerank``.

    ``/score`` gets ``batch_size`` aligned pairs per request (``text_1[i]`` with ``text_2[i]``);
    ``/rerank`` gets one query with its consecutive documents per request and its
    ``relevance_score`` values are put back by ``index``. Both return what the server's model computes
    (sigmoid of a cross-encoder head, or the cosine of an embedding model), so scores match
    :class:`~vllm_eval.reranker.VllmCrossEncoder` on the same model. A
    :class:`~vllm_eval.registry.ScoreTemplate` is applied here, before sending, for servers of a
    causal LM started with the template's ``hf_overrides``; the server truncates, so an over-long
    prompt comes back as a named 400 instead of being cut inside ``{document}``.

    Args:
        endpoints, model, api_key, batch_size, max_concurrency, timeout, retries, backoff: as for
            :class:`RemoteEncoder`.
        api: ``"score"`` or ``"rerank"``.
        score_template, prompts, instructions: as for :class:`~vllm_eval.reranker.VllmCrossEncoder`.

    Raises:
        EndpointError: no endpoint answers, or a server refuses a pair (named).
        ValueError: an unknown ``api``.
    """

    def __init__(self, endpoints: list[str] | str, model: str | None = None, *, api: Literal["score", "rerank"] = "score",
                 api_key: str | None = None, batch_size: int = 64, max_concurrency: int = 8, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 0.5, score_template: Any = None,
                 prompts: dict[str, str] | None = None, instructions: dict[str, str] | None = None,
                 chunk_size: int = 512, show_progress_bar: bool = True, model_name: str | None = None) -> None:
        if api not in ("score", "rerank"):
            raise ValueError(f"api must be 'score' or 'rerank', got {api!r}")
        self.api = api
        self.prompting = PromptResolver(prompts=prompts, instructions=instructions)
        self.template = score_template
        self.mode = "template" if score_template is not None else "cross-encoder"
        self.tokenizer = None  # the server tokenizes and truncates
        self.batch_size = int(batch_size)
        self.chunk_size, self.show_progress_bar = int(chunk_size), show_progress_bar
        self.http = RemoteClient(endpoints, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff,
                                 max_concurrency=max_concurrency)
        self.model, self.max_length = self.http.served_model(model)
        meta = build_model_meta(self.model, model_name=model_name or self.model, max_model_len=self.max_length or None,
                                framework=["API"])
        self.mteb_model_meta = meta.model_copy(update={"model_type": ["cross-encoder"], "embed_dim": None,
                                                       "similarity_fn_name": None})
        self.name = self.mteb_model_meta.name

    def _count_over_length(self, qs: list[str], ds: list[str]) -> int:
        return 0  # the server truncates (truncate_prompt_tokens=-1); no local tokenizer to count with

    def _format(self, qs: list[str], ds: list[str], instruction: str | None) -> tuple[list[str], list[str], int]:
        head, tail = self.template.document_parts()
        return [self.template.query(q, instruction) for q in qs], [head + d + tail for d in ds], 0

    _apply_template = _format

    def _score(self, pairs: list[tuple[str, str]]) -> list[float]:
        common = {"model": self.model, "truncate_prompt_tokens": -1}
        if self.api == "score":
            body = {**common, "text_1": [q for q, _ in pairs], "text_2": [d for _, d in pairs]}
            data = sorted(self.http.request("POST", "/score", body)["data"], key=lambda d: d["index"])
            return [float(d["score"]) for d in data]
        # /rerank: one query per request; the batch holds runs of the same query.
        out: list[float] = []
        i = 0
        while i < len(pairs):
            j = i
            while j < len(pairs) and pairs[j][0] == pairs[i][0]:
                j += 1
            body = {**common, "query": pairs[i][0], "documents": [d for _, d in pairs[i:j]], "top_n": j - i}
            scores = [0.0] * (j - i)
            for r in self.http.request("POST", "/rerank", body)["results"]:
                scores[int(r["index"])] = float(r["relevance_score"])
            out.extend(scores)
            i = j
        return out

    def _score_batch(self, pairs: list[tuple[str, str]]) -> list[float]:
        return bisect_refused(self._score, pairs, lambda p: f"pair (query {p[0]!r:.60}, document {p[1]!r:.60})")

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:
        pairs = list(zip(queries, documents))
        batches = [pairs[i : i + self.batch_size] for i in range(0, len(pairs), self.batch_size)]
        return np.asarray([s for part in self.http.map(self._score_batch, batches) for s in part], dtype=np.float32)

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self.http.close()


def image_data_url(image: Any) -> str:
    """A PNG ``data:`` URL of a PIL image or an array (as accepted by the generator)."""
    import io

    from .generator import to_pil

    buf = io.BytesIO()
    to_pil(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class RemoteGenerator(ChatPrompter):
    """Generation against served chat models: ``/v1/chat/completions`` (``/v1/completions`` raw).

    Messages are built by the same code as :class:`~vllm_eval.generator.VllmGenerator`'s
    (:class:`~vllm_eval.generator.ChatPrompter`); images travel as PNG data URLs. Sampling uses the
    same evaluation defaults, sent by their ``SamplingParams`` names (vLLM's server accepts them
    in the request body). When the server's chat template refuses a system turn (a 400 that says
    so), the system prompt is merged into the user turn from then on, as in-process.
    Log-likelihood scoring needs prompt log-probabilities of exact token ids and is not offered
    remotely.

    Args:
        endpoints, model, api_key, max_concurrency, timeout, retries, backoff: as for
            :class:`RemoteEncoder`.
        system_prompt, raw_prompts, image_position, sampling, chunk_size: as for ``VllmGenerator``.

    Raises:
        EndpointError: no endpoint answers, or a server refuses a sample (named).
        TypeError: an unknown sampling option.
    """

    def __init__(self, endpoints: list[str] | str, model: str | None = None, *, api_key: str | None = None,
                 system_prompt: str | None = None, raw_prompts: bool = False,
                 image_position: Literal["before", "after"] = "before", sampling: dict[str, Any] | None = None,
                 max_concurrency: int = 8, timeout: float = 300.0, retries: int = 3, backoff: float = 0.5,
                 chunk_size: int = 256, show_progress_bar: bool = True) -> None:
        from .generator import DEFAULT_SAMPLING, sampling_params

        if image_position not in ("before", "after"):
            raise ValueError(f"image_position must be 'before' or 'after', got {image_position!r}")
        self.system_prompt, self.raw_prompts, self.image_position = system_prompt, raw_prompts, image_position
        self.system_role = not raw_prompts
        self.sampling = sampling_params(sampling)  # validates the names
        self.sampling_overrides = dict(sampling or {})
        self.request_sampling = {**DEFAULT_SAMPLING, **self.sampling_overrides}
        self.chunk_size, self.show_progress_bar = int(chunk_size), show_progress_bar
        self.http = RemoteClient(endpoints, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff,
                                 max_concurrency=max_concurrency)
        self.model, _ = self.http.served_model(model)

    def image_part(self, image: Any) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": image_data_url(image)}}

    def render(self, text: str) -> str:
        """The prompt as recorded: the text itself for raw prompts, else the chat messages as JSON
        (the server applies its chat template)."""
        if self.raw_prompts:
            return text
        return json.dumps(self.messages(text), ensure_ascii=False)

    def _one(self, sample: tuple[str, Sequence[Any]]) -> Generation:
        text, images = sample
        if self.raw_prompts:
            if images:
                raise ValueError("raw prompts carry no images remotely; use the chat API (no --raw-prompts)")
            body = {"model": self.model, "prompt": text, **self.request_sampling}
            out = self.http.request("POST", "/v1/completions", body)
            answer = out["choices"][0]["text"]
            prompt = text
        else:
            try:
                out = self.http.request("POST", "/v1/chat/completions",
                                        {"model": self.model, "messages": self.messages(text, images),
                                         **self.request_sampling})
            except RequestRefused as exc:
                if not (self.system_prompt and self.system_role and "system" in exc.message.lower()):
                    raise
                logger.info("server's chat template rejects a system turn (%s); merging it into the user turn",
                            exc.message)
                self.system_role = False
                return self._one(sample)
            answer = out["choices"][0]["message"]["content"] or ""
            prompt = self.render(text) + (f" [+ {len(images)} image(s)]" if images else "")
        usage = out.get("usage") or {}
        return Generation(prompt=prompt, output=answer, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          output_tokens=int(usage.get("completion_tokens") or 0))

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        def one(k: int) -> Generation:
            try:
                return self._one(chunk[k])
            except RequestRefused as exc:
                raise EndpointError(f"server refused sample {offset + k} ({chunk[k][0]!r:.60}) "
                                    f"(HTTP {exc.status}): {exc.message}") from None

        return self.http.map(one, list(range(len(chunk))))

    def loglikelihoods(self, contexts: Sequence[str], continuations: Sequence[str]) -> np.ndarray:
        """Not offered remotely (exact prompt token log-probabilities need the engine's tokens).

        Raises:
            ValueError: always; use generation scoring with a remote backend.
        """
        raise ValueError("log-likelihood scoring needs the in-process engine; use --scoring generate "
                         "with --backend remote")

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self.http.close()


class RequestRefused(Exception):
    """The server answered 4xx (not 429): the request itself is at fault."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


def _message(resp: Any) -> str:
    try:
        body = resp.json()
        return str(body.get("error", {}).get("message") if isinstance(body.get("error"), dict)
                   else body.get("message") or body.get("detail") or body)
    except Exception:  # not JSON: the text is the message
        return resp.text[:300]
