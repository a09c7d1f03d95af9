"""The one HTTP layer of the remote backends: endpoints, retries, failover, concurrency, refused inputs, reply checks.

A remote backend (``encoder/remote.py``, ``reranker/remote.py``, ``generator/remote.py``) keeps only
what its protocol decides: the route, the request body, and how a reply becomes results. Everything
about getting a reply is here:

* requests are spread round-robin over the endpoints, at most ``max_concurrency`` in flight;
* connection errors, time-outs, 429 and 5xx are retried with exponential backoff; an endpoint that
  exhausts its retries is skipped with a warning; when every endpoint is dead the call fails;
* a 4xx other than 429 means the input is at fault: the batch is bisected down to the refused
  input, which the error names with the server's reason;
* a reply that does not have the promised shape (a missing field, the wrong number of results)
  is an :class:`~vllm_eval.utils.errors.EndpointError` naming the endpoint, never a ``KeyError`` later.

HTTP is httpx's; nothing here opens sockets itself. The layering follows lm-evaluation-harness's
``TemplateAPI`` (one transport, per-API payload and parse hooks).
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlparse

from ..utils.errors import EndpointError, UsageError

T = TypeVar("T")


def check_endpoint(url: str) -> str:
    """``url`` without a trailing slash, after checking it is an ``http(s)://host[:port]`` base URL.

    Raises:
        UsageError: no scheme (``localhost:8000``), another scheme, or no host.
    """
    if not isinstance(url, str) or not url.strip():
        raise UsageError("an endpoint URL is empty")
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        hint = f"; did you mean http://{url.strip()}?" if "://" not in url else ""
        raise UsageError(f"endpoint {url!r} is not an http:// or https:// URL{hint}")
    try:
        parsed.port  # noqa: B018 - urlparse checks the port only when it is read
    except ValueError as exc:
        raise UsageError(f"endpoint {url!r}: {exc}") from None
    return url.strip().rstrip("/")


@dataclass(frozen=True)
class HttpOptions:
    """How to reach a served model: endpoints and transport settings, shared by every remote backend.

    Attributes:
        endpoints: base URLs, e.g. ``("http://127.0.0.1:8000",)``.
        api_key: bearer token for servers started with ``--api-key``.
        timeout: seconds per request.
        retries: attempts per endpoint before it is skipped.
        backoff: first retry delay in seconds, doubled each attempt.
        max_concurrency: requests in flight at once, over all endpoints.
        batch_size: inputs per request.

    Raises:
        UsageError: no endpoint, a malformed URL, or a number out of range.
    """

    endpoints: tuple[str, ...]
    api_key: str | None = None
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.5
    max_concurrency: int = 8
    batch_size: int = 64

    def __post_init__(self) -> None:
        urls = (self.endpoints,) if isinstance(self.endpoints, str) else tuple(self.endpoints or ())
        if not urls:
            raise UsageError("at least one endpoint URL is needed")
        urls = tuple(check_endpoint(u) for u in urls)
        if len(set(urls)) != len(urls):
            raise UsageError(f"an endpoint is given twice: {', '.join(urls)}")
        object.__setattr__(self, "endpoints", urls)
        for name in ("retries", "max_concurrency", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        for name in ("timeout", "backoff"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0 or (name == "timeout" and value == 0):
                raise UsageError(f"{name} must be a positive number of seconds, got {value!r}")


class RequestRefused(Exception):
    """The server answered 4xx (not 429): the request itself is at fault."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class BadReply(Exception):
    """A reply without the promised shape; :class:`HttpClient` makes it an ``EndpointError`` naming the endpoint."""


def expect(condition: Any, what: str) -> None:
    """Raise :class:`BadReply` saying ``what`` was wrong unless ``condition`` holds (for parse hooks)."""
    if not condition:
        raise BadReply(what)


def _message(resp: Any) -> str:
    try:
        body = resp.json()
        error = body.get("error")
        return str(
            error.get("message") if isinstance(error, dict) else body.get("message") or body.get("detail") or body
        )
    except Exception:  # not JSON (or not a dict): the text is the message
        return resp.text[:300]


class _Endpoints:
    """Round-robin over live endpoints; an endpoint that exhausts its retries is marked dead."""

    def __init__(self, urls: Sequence[str]):
        self.urls = list(urls)
        self.dead: set[str] = set()
        self.used: dict[str, int] = dict.fromkeys(self.urls, 0)
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


class HttpClient:
    """Requests to a set of endpoints with retries, failover and bounded concurrency (see the module docstring).

    Args:
        options: the endpoints and transport settings.
    """

    def __init__(self, options: HttpOptions) -> None:
        import httpx

        self.options = options
        self.endpoints = _Endpoints(options.endpoints)
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self.client = httpx.Client(
            timeout=options.timeout, headers=headers, limits=httpx.Limits(max_connections=options.max_concurrency + 2)
        )

    def request(
        self,
        method: str,
        path: str,
        payload: dict | None = None,
        parse: Callable[[Any], T] | None = None,
        files: dict[str, Any] | None = None,
    ) -> T | Any:
        """One request with retries, moving to the next endpoint when one is exhausted: ``payload`` as JSON, or
        with ``files`` (name -> (file name, bytes, content type)) a multipart form of ``payload``'s fields and the
        files (OpenAI's ``/v1/audio/*`` uploads).

        ``parse(body)`` turns the JSON reply into results; a :class:`BadReply` (or a ``KeyError``,
        ``IndexError``, ``TypeError`` or ``ValueError``) it raises becomes an ``EndpointError``
        naming the endpoint and route.

        Raises:
            EndpointError: every endpoint is dead, or a reply was malformed.
            RequestRefused: the server answered 4xx other than 429 (the input is at fault).
        """
        import httpx

        while True:
            url = self.endpoints.next()
            last = ""
            for attempt in range(self.options.retries):
                try:
                    if files is None:
                        resp = self.client.request(method, url + path, json=payload)
                    else:
                        resp = self.client.request(method, url + path, data=payload, files=files)
                except httpx.HTTPError as exc:  # transport errors and time-outs
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if resp.status_code == 200:
                        return self._parse(url + path, resp, parse)
                    if resp.status_code != 429 and resp.status_code < 500:
                        raise RequestRefused(resp.status_code, _message(resp))
                    last = f"HTTP {resp.status_code}: {_message(resp)}"
                if attempt + 1 < self.options.retries:
                    time.sleep(self.options.backoff * 2**attempt)
            self.endpoints.kill(url, last)

    @staticmethod
    def _parse(where: str, resp: Any, parse: Callable[[Any], T] | None) -> T | Any:
        try:
            body = resp.json()
        except ValueError:
            raise EndpointError(f"{where} replied with something that is not JSON: {resp.text[:120]!r}") from None
        if parse is None:
            return body
        try:
            return parse(body)
        except BadReply as exc:
            raise EndpointError(f"{where} sent a malformed reply: {exc}") from None
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EndpointError(f"{where} sent a malformed reply ({type(exc).__name__}: {exc})") from None

    def served_model(self, model: str | None) -> tuple[str, int]:
        """``(model name, max_model_len or 0)`` from ``GET /v1/models``: ``model`` or the server's first.

        The client is closed when this fails.

        Raises:
            EndpointError: no endpoint answers, or the reply lists no model.
        """

        def parse(body: Any) -> tuple[str, int]:
            data = body.get("data") if isinstance(body, dict) else None
            expect(
                isinstance(data, list) and data and isinstance(data[0], dict) and "id" in data[0],
                "no model listed under 'data'",
            )
            return str(data[0]["id"]), int(data[0].get("max_model_len") or 0)

        try:
            served, max_len = self.request("GET", "/v1/models", parse=parse)
        except BaseException:
            self.close()
            raise
        return model or served, max_len

    def server_version(self) -> str:
        """The server's ``GET /version`` (vLLM's OpenAI server has it), or ``"unknown"``."""
        try:
            return str(self.request("GET", "/version", parse=lambda body: body["version"]))
        except (EndpointError, RequestRefused):
            return "unknown"

    def accepts(self, path: str, payload: dict, parse: Callable[[Any], Any]) -> bool:
        """Whether the first live endpoint answers ``POST path`` with ``payload`` by 200 and a reply ``parse``
        takes (it raises on one it does not): one request, no retry.

        What a server takes (images, a request shape) is asked this way because ``/v1/models`` does not say;
        any other answer, or none within the time-out, is False.
        """
        import httpx

        live = [u for u in self.endpoints.urls if u not in self.endpoints.dead]
        try:
            resp = self.client.post(live[0] + path, json=payload) if live else None
            if resp is None or resp.status_code != 200:
                return False
            parse(resp.json())
        except (httpx.HTTPError, BadReply, KeyError, IndexError, TypeError, ValueError):
            return False
        return True

    def map(self, fn: Callable[[Any], T], items: list[Any]) -> list[T]:
        """``fn`` over ``items`` with at most ``max_concurrency`` at once; results in input order."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=self.options.max_concurrency, thread_name_prefix="vllm-eval-http") as pool:
            return list(pool.map(fn, items))

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self.client.close()


def bisect_refused(fn: Callable[[list[Any]], list[T]], items: list[Any], name: Callable[[Any], str]) -> list[T]:
    """``fn(items)`` (one result per item); when the server refuses the batch, narrow it down.

    A refused batch is split in halves until the single refused item is found, and
    :class:`~vllm_eval.utils.errors.EndpointError` names it with ``name(item)`` and the server's reason.
    """
    try:
        return fn(items)
    except RequestRefused as exc:
        if len(items) == 1:
            raise EndpointError(f"server refused {name(items[0])} (HTTP {exc.status}): {exc.message}") from None
        half = len(items) // 2
        return bisect_refused(fn, items[:half], name) + bisect_refused(fn, items[half:], name)


class RemoteBackend:
    """Mixin of the remote backends: one :class:`HttpClient`, batched requests, per-protocol hooks.

    A subclass implements :meth:`_request` (one batch of inputs -> one result per input, using
    ``self.http.request(..., parse=...)``) and :meth:`_describe` (how an error names one input);
    :meth:`_post_all` does batching, concurrency, order and the bisection of refused inputs.
    """

    http: HttpClient

    def _connect(self, options: HttpOptions, model: str | None) -> tuple[str, int]:
        """Open the client and ask the servers what they serve: ``(model name, max_model_len or 0)``."""
        if not isinstance(options, HttpOptions):
            raise UsageError(f"http must be an HttpOptions, got {type(options).__name__}")
        self.http = HttpClient(options)
        return self.http.served_model(model)

    def _request(self, batch: list[Any]) -> list[Any]:  # pragma: no cover - every remote backend overrides it
        raise NotImplementedError

    def _describe(self, item: Any) -> str:
        return f"input {item!r:.80}"

    def _post_all(self, items: list[Any]) -> list[Any]:
        """One result per item, in order: batches of ``batch_size`` sent concurrently."""
        size = self.http.options.batch_size
        batches = [items[i : i + size] for i in range(0, len(items), size)]
        parts = self.http.map(lambda b: bisect_refused(self._request, b, self._describe), batches)
        return [r for part in parts for r in part]

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        http = getattr(self, "http", None)
        if http is not None:
            http.close()
