"""``RemoteEncoder``: an encoder served by ``vllm serve`` (``POST /v1/embeddings``, OpenAI-compatible); texts go as
``input``, images (and images with text) as chat ``messages`` holding PNG data URLs."""

from __future__ import annotations

import base64
from typing import Any, ClassVar, Literal

import numpy as np

from ...utils.errors import EndpointError, UsageError
from ...utils.modelinfo import build_model_meta, served_model_ref
from ..http import HttpOptions, RemoteBackend, expect
from ..images import ImageInput, content_parts
from ..prompts import InstructionTemplate, resolve_prompting
from .base import EncoderBase


class RemoteEncoder(RemoteBackend, EncoderBase):
    """mteb ``EncoderProtocol`` over OpenAI-compatible ``/v1/embeddings`` endpoints (``vllm serve``).

    The server tokenizes and truncates (``truncate_prompt_tokens=-1``); prompts, chunking, order
    and deduplication are those of :class:`~vllm_eval.models.encoder.base.EncoderBase`, the transport
    (batches, retries, failover, refused inputs named) is :mod:`vllm_eval.models.http`'s.

    Images: when the server embeds an image (asked once at start with an 8×8 image; vLLM's ``/v1/models`` does
    not say), the model declares mteb's ``["text", "image"]`` modalities. An image, or an image with its text (a
    fused input), goes as one chat conversation of one user turn: the image as a PNG data URL, then the text;
    the server's chat template makes the prompt (CLIP's and SigLIP's is vLLM's plain one; a vision-language
    embedder's is the model's, or the ``--chat-template`` the server was started with, as in vLLM's
    ``vision_embedding_online.py``). Conversations go many per request (vLLM >= 0.32's batched ``messages``),
    else one per request. SigLIP's texts reach the server unpadded (its text path does not pad them to the 64
    positions SigLIP was trained on): for SigLIP texts use the vLLM backend.

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        dimensions: matryoshka width, sent as the request's ``dimensions``.
        encoding_format: ``"float"`` or ``"base64"`` (float32 little-endian, smaller responses).
        normalize: L2 normalisation on/off, sent as the request's ``use_activation``; None: the server's
            pooler default (normalised). A served CLIP or SigLIP gives the raw projections that the vLLM
            backend, transformers and sentence-transformers give only with ``normalize=False``.
        preset, prompts, instruction_template, instructions, apply_instruction_to_documents,
        chunk_size, show_progress_bar, model_name: as for :class:`~vllm_eval.models.encoder.vllm.VllmEncoder`
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
        normalize: bool | None = None,
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
        self.dimensions, self.encoding_format, self.normalize = dimensions, encoding_format, normalize
        served, max_length = self._connect(http, model)
        with self.closed_on_error():
            self._image_batches = self._image_requests(served)
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
                modalities=["text", "image"] if self._image_batches is not None else None,
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
        """The base identity (the served name) plus the server's version, ``dimensions``, ``normalize`` if set."""
        return {
            **super().identity(),
            "server": self.http.server_version(),
            "dimensions": self.dimensions,
            **({"normalize": self.normalize} if self.normalize is not None else {}),
        }

    def _image_requests(self, served: str) -> bool | None:
        """How the server takes images: True many conversations per request, False one, None not at all."""
        probe = [{"role": "user", "content": content_parts(ImageInput(np.zeros((8, 8), dtype=np.uint8)))}]
        for batched in (True, False):
            body = {"model": served, "messages": [probe] if batched else probe, "encoding_format": self.encoding_format}
            if self.http.accepts(self.route, body, lambda reply: self._parse(reply, 1)):
                return batched
        return None

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        """Texts as they are; images (with their text, a fused input) as image inputs for chat messages.

        Raises:
            UsageError: images for a server that does not embed them.
        """
        if images is None:
            return super()._model_inputs(texts, images)
        if self._image_batches is None:
            raise UsageError(f"{self.model} at {self.http.options.endpoints[0]} does not embed images")
        return [ImageInput(im, t) for im, t in zip(images, texts or [""] * len(images), strict=True)]

    def _request(self, batch: list[Any]) -> list[np.ndarray]:
        if not isinstance(batch[0], ImageInput):  # a chunk holds one kind of input (see pooling)
            return self._post({"input": batch}, len(batch))
        turns = [[{"role": "user", "content": content_parts(x)}] for x in batch]
        if self._image_batches:
            return self._post({"messages": turns}, len(turns))
        return [self._post({"messages": turn}, 1)[0] for turn in turns]  # an older server: one per request

    def _post(self, inputs: dict[str, Any], n: int) -> list[np.ndarray]:
        payload: dict[str, Any] = {"model": self.model, **inputs, "encoding_format": self.encoding_format}
        if "input" in inputs:  # the chat path takes no truncation setting
            payload["truncate_prompt_tokens"] = -1
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        if self.normalize is not None:
            payload["use_activation"] = self.normalize
        return self.http.request("POST", self.route, payload, parse=lambda body: self._parse(body, n))

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
