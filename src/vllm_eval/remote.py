"""Already-served models: OpenAI-compatible ``vllm serve`` endpoints as an encoder backend.

:class:`RemoteEncoder` runs the same mteb tasks against one or several running servers through
``POST /v1/embeddings``, with the prompts, chunking and deduplication of every other encoder here.
Requests carry ``batch_size`` inputs each, run concurrently (at most ``max_concurrency`` in
flight), are spread round-robin over the endpoints, retried with exponential backoff on connection
errors, time-outs, 429 and 5xx, and their results are put back in input order. An endpoint that
keeps failing is skipped with a warning; when every endpoint is dead the call fails with a clear
error. A 400 (for instance an over-long input) is narrowed down to the offending input, which the
error names. HTTP is httpx's; nothing here opens sockets itself.
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from .encoder import TextEncoder
from .modelinfo import build_model_meta
from .prompts import PromptResolver

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


class RemoteEncoder(TextEncoder):
    """mteb ``EncoderProtocol`` over OpenAI-compatible ``/v1/embeddings`` endpoints (``vllm serve``).

    Args:
        endpoints: base URLs, e.g. ``["http://127.0.0.1:8000"]`` (``/v1`` is appended).
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        api_key: bearer token for servers started with ``--api-key``.
        dimensions: matryoshka width, sent as the request's ``dimensions``.
        encoding_format: ``"float"`` or ``"base64"`` (float32 little-endian, smaller responses).
        batch_size: inputs per HTTP request.
        max_concurrency: requests in flight at once, over all endpoints.
        timeout: seconds per request.
        retries: attempts per endpoint before it is skipped.
        backoff: first retry delay in seconds, doubled each attempt.
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
        import httpx

        if encoding_format not in ("float", "base64"):
            raise ValueError(f"encoding_format must be 'float' or 'base64', got {encoding_format!r}")
        self.prompting = PromptResolver(prompts=prompts, instruction_template=instruction_template,
                                        instructions=instructions,
                                        apply_instruction_to_documents=apply_instruction_to_documents)
        self.endpoints = _Endpoints([endpoints] if isinstance(endpoints, str) else list(endpoints))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers)
        self.dimensions, self.encoding_format = dimensions, encoding_format
        self.batch_size, self.max_concurrency = int(batch_size), int(max_concurrency)
        self.retries, self.backoff = int(retries), float(backoff)
        self.chunk_size, self.show_progress_bar = int(chunk_size), show_progress_bar
        self.tokenize = None  # the server tokenizes and truncates (truncate_prompt_tokens=-1)
        info = self._request("GET", "/v1/models")["data"][0]
        self.model = model or info["id"]
        self.max_length = int(info.get("max_model_len") or 0)
        self.mteb_model_meta = build_model_meta(self.model, model_name=model_name or self.model,
                                                embed_dim=dimensions, max_model_len=self.max_length or None,
                                                framework=["API"])
        self.name = self.mteb_model_meta.name

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One request with retries, moving to the next endpoint when one is exhausted."""
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
                        raise _ClientError(resp.status_code, _message(resp))
                    last = f"HTTP {resp.status_code}: {_message(resp)}"
                time.sleep(self.backoff * 2**attempt)
            self.endpoints.kill(url, last)

    def _embed_request(self, texts: list[str]) -> np.ndarray:
        payload: dict[str, Any] = {"model": self.model, "input": texts, "encoding_format": self.encoding_format,
                                   "truncate_prompt_tokens": -1}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        try:
            data = self._request("POST", "/v1/embeddings", payload)["data"]
        except _ClientError as exc:
            if len(texts) == 1:
                raise EndpointError(f"server refused input {texts[0]!r:.80} (HTTP {exc.status}): {exc.message}") from None
            # Narrow a refused batch down to the input the server objects to.
            half = len(texts) // 2
            return np.concatenate([self._embed_request(texts[:half]), self._embed_request(texts[half:])])
        data = sorted(data, key=lambda d: d["index"])
        if self.encoding_format == "base64":
            return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])
        return np.asarray([d["embedding"] for d in data], dtype=np.float32)

    def _embed_chunk(self, texts: list[str], ids: Any) -> np.ndarray:
        batches = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        with ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="vllm-eval-http") as pool:
            parts = list(pool.map(self._embed_request, batches))  # map keeps input order
        return np.concatenate(parts).astype(np.float32, copy=False)

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self.client.close()


class _ClientError(Exception):
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
