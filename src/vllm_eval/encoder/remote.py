"""``RemoteEncoder``: an encoder served by ``vllm serve`` (``POST /v1/embeddings``, OpenAI-compatible)."""

from __future__ import annotations

import base64
from typing import Any, ClassVar, Literal

import numpy as np

from ..errors import EndpointError, UsageError
from ..http import HttpOptions, RemoteBackend, expect
from ..modelinfo import build_model_meta, served_model_ref
from ..prompts import InstructionTemplate, resolve_prompting
from .base import EncoderBase


class RemoteEncoder(RemoteBackend, EncoderBase):
    """mteb ``EncoderProtocol`` over OpenAI-compatible ``/v1/embeddings`` endpoints (``vllm serve``).

    The server tokenizes and truncates (``truncate_prompt_tokens=-1``); prompts, chunking, order
    and deduplication are those of :class:`~vllm_eval.encoder.base.EncoderBase`, the transport
    (batches, retries, failover, refused inputs named) is :mod:`vllm_eval.http`'s.

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        dimensions: matryoshka width, sent as the request's ``dimensions``.
        encoding_format: ``"float"`` or ``"base64"`` (float32 little-endian, smaller responses).
        preset, prompts, instruction_template, instructions, apply_instruction_to_documents,
        chunk_size, show_progress_bar, model_name: as for :class:`~vllm_eval.encoder.vllm.VllmEncoder`
            (the preset is matched on the served name).

    Raises:
        EndpointError: no endpoint answers, a server refuses an input (named), or a reply is malformed.
        UsageError: a bad ``encoding_format`` or ``dimensions``; a bad endpoint URL.
    """

    tokenizes_locally: ClassVar[bool] = False
    route: ClassVar[str] = "/v1/embeddings"

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        preset: Any = None,
        dimensions: int | None = None,
        encoding_format: Literal["float", "base64"] = "float",
        prompts: dict[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        if encoding_format not in ("float", "base64"):
            raise UsageError(f"encoding_format must be 'float' or 'base64', got {encoding_format!r}")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise UsageError(f"dimensions must be a positive int, got {dimensions!r}")
        self.dimensions, self.encoding_format = dimensions, encoding_format
        served, max_length = self._connect(http, model)
        with self.closed_on_error():
            prompting, self.preset = resolve_prompting(
                served,
                "encoder",
                preset=preset,
                prompts=prompts,
                instruction_template=instruction_template,
                instructions=instructions,
                apply_instruction_to_documents=apply_instruction_to_documents,
            )
            meta = build_model_meta(
                served_model_ref(served),
                model_name=model_name or served,
                embed_dim=dimensions,
                max_model_len=max_length or None,
                framework=["API"],
                use_instructions=prompting.instruction_template is not None,
            )
            super().__init__(
                model=served,
                meta=meta,
                prompting=prompting,
                max_length=max_length or None,
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity (the served name) plus the server's version and ``dimensions``."""
        return {**super().identity(), "server": self.http.server_version(), "dimensions": self.dimensions}

    def _request(self, batch: list[str]) -> list[np.ndarray]:
        payload: dict[str, Any] = {
            "model": self.model,
            "input": batch,
            "encoding_format": self.encoding_format,
            "truncate_prompt_tokens": -1,
        }
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        return self.http.request("POST", self.route, payload, parse=lambda body: self._parse(body, len(batch)))

    def _parse(self, body: Any, n: int) -> list[np.ndarray]:
        data = body.get("data") if isinstance(body, dict) else None
        expect(isinstance(data, list), "no 'data' list")
        expect(len(data) == n, f"{len(data)} embeddings for {n} inputs")
        expect(
            all(isinstance(d, dict) and "embedding" in d and "index" in d for d in data),
            "an item without 'embedding' or 'index'",
        )
        data = sorted(data, key=lambda d: d["index"])
        expect([d["index"] for d in data] == list(range(n)), f"indices are not 0..{n - 1}")
        if self.encoding_format == "base64":
            rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
        else:
            rows = [np.asarray(d["embedding"], dtype=np.float32) for d in data]
        expect(
            len({r.shape for r in rows}) == 1 and rows[0].ndim == 1 and rows[0].size > 0,
            "embeddings of different or empty widths",
        )
        if self.dimensions is not None:
            expect(rows[0].size == self.dimensions, f"width {rows[0].size}, asked for dimensions={self.dimensions}")
        return rows

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        rows = self._post_all(texts)
        widths = {r.size for r in rows}
        if len(widths) != 1:  # each reply was consistent, but the endpoints disagree
            raise EndpointError(
                f"the endpoints ({', '.join(self.http.options.endpoints)}) returned embeddings of "
                f"different widths: {sorted(widths)}"
            )
        return np.stack(rows).astype(np.float32, copy=False)
