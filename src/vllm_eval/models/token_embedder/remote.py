"""``RemoteTokenEmbedder``: a multi-vector model served by ``vllm serve`` (``POST /pooling``, task ``token_embed``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.modelinfo import build_model_meta, served_model_ref
from ..http import HttpOptions, RemoteBackend, expect
from ..prompts import PromptResolver
from .base import TokenEmbedderBase


def parse_pooling(body: Any, n: int) -> list[np.ndarray]:
    """The per-item arrays of a ``/pooling`` reply (``{"data": [{"index", "data"}]}``), in index order.

    Raises:
        EndpointError: a malformed reply (what is wrong named).
    """
    data = body.get("data") if isinstance(body, dict) else None
    expect(isinstance(data, list), "no 'data' list")
    expect(len(data) == n, f"{len(data)} results for {n} inputs")
    expect(all(isinstance(d, dict) and "data" in d and "index" in d for d in data), "an item without 'data'")
    data = sorted(data, key=lambda d: d["index"])
    expect([d["index"] for d in data] == list(range(n)), f"indices are not 0..{n - 1}")
    rows = [np.asarray(d["data"], dtype=np.float32) for d in data]
    expect(all(r.ndim == 2 for r in rows), "an item that is not one vector per token")
    return rows


class RemoteTokenEmbedder(RemoteBackend, TokenEmbedderBase):
    """Per-token vectors from vLLM's ``/pooling`` endpoint with ``"task": "token_embed"``.

    The server tokenizes and truncates; prompts, chunking, order, deduplication and MaxSim are
    those of :class:`~vllm_eval.models.token_embedder.base.TokenEmbedderBase`, the transport
    :mod:`vllm_eval.models.http`'s.

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        prompts, store_dtype, score_batch_size, chunk_size, show_progress_bar, model_name: as for
            :class:`~vllm_eval.models.token_embedder.vllm.VllmTokenEmbedder`.

    Raises:
        EndpointError: no endpoint answers, a server refuses an input (named), or a reply is malformed.
    """

    tokenizes_locally: ClassVar[bool] = False
    route: ClassVar[str] = "/pooling"

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        prompts: dict[str, str] | None = None,
        store_dtype: str = "float32",
        score_batch_size: int = 1024,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        served, max_length = self._connect(http, model)
        with self.closed_on_error():
            super().__init__(
                model=served,
                meta=build_model_meta(
                    served_model_ref(served),
                    model_name=model_name or served,
                    max_model_len=max_length or None,
                    framework=["API"],
                ),
                prompting=PromptResolver(prompts=prompts),
                max_length=max_length or None,
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
                store_dtype=store_dtype,
                score_batch_size=score_batch_size,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity (the served name) plus the server's version."""
        return {**super().identity(), "server": self.http.server_version()}

    def _request(self, batch: list[str]) -> list[np.ndarray]:
        payload = {"model": self.model, "input": batch, "task": "token_embed", "truncate_prompt_tokens": -1}
        return self.http.request("POST", self.route, payload, parse=lambda body: parse_pooling(body, len(batch)))

    def _embed_tokens_chunk(self, texts: list[str], ids: list[list[int]]) -> list[np.ndarray]:
        return self._post_all(texts)
