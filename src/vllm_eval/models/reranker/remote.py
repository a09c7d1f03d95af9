"""``RemoteReranker``: a reranker served by ``vllm serve`` (``POST /score`` or ``/rerank``); image queries and
documents go as vLLM's ``ScoreMultiModalParam`` (content parts holding PNG data URLs)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import build_model_meta, served_model_ref
from ..http import HttpOptions, RemoteBackend, expect
from ..images import ImageInput, content_parts
from ..presets import ModelPreset, ScoreTemplate
from ..prompts import resolve_prompting
from .base import RerankerBase


class RemoteReranker(RemoteBackend, RerankerBase):
    """mteb ``CrossEncoderProtocol`` over a served reranker's ``/score`` (default) or ``/rerank``.

    ``/score`` gets ``batch_size`` aligned pairs per request (``text_1[i]`` with ``text_2[i]``);
    ``/rerank`` gets one query with its consecutive documents per request and its
    ``relevance_score`` values are put back by ``index``. Both return what the server's model computes
    (sigmoid of a cross-encoder head, or the cosine of an embedding model), so scores match
    :class:`~vllm_eval.models.reranker.vllm.VllmReranker` on the same model. A score template (given, or
    from the preset matching the served name) is applied here, before sending, for servers of a
    causal LM started with the template's ``hf_overrides``; the server truncates, so an over-long
    prompt comes back as a named 400 instead of being cut inside ``{document}``.

    Images: when the server scores an image document (asked once at start; vLLM's ``/v1/models`` does not
    say), the model declares mteb's ``["text", "image"]`` modalities and an image (with its text, if any) goes
    as ``{"content": [image_url, text]}``: vLLM puts the model's image placeholder in front of the text, as the
    vLLM backend does. A vision-language reranker's judge prompt is then the server's own score template
    (``--chat-template``, as vLLM's Qwen3-VL reranker example starts it), not one applied here.

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        api: ``"score"`` or ``"rerank"``.
        preset, score_template, prompts, instructions, chunk_size, show_progress_bar, model_name: as
            for :class:`~vllm_eval.models.reranker.vllm.VllmReranker`.

    Raises:
        EndpointError: no endpoint answers, a server refuses a pair (named), or a reply is malformed.
        UsageError: an unknown ``api``; a bad endpoint URL; images with a score template applied here.
    """

    tokenizes_locally: ClassVar[bool] = False

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        api: Literal["score", "rerank"] = "score",
        preset: str | ModelPreset | None = None,
        score_template: ScoreTemplate | None = None,
        prompts: dict[str, str] | None = None,
        instructions: dict[str, str] | None = None,
        chunk_size: int = 512,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        if api not in ("score", "rerank"):
            raise UsageError(f"api must be 'score' or 'rerank', got {api!r}")
        self.api = api
        served, max_length = self._connect(http, model)
        with self.closed_on_error():
            takes_images = self._takes_images(served)
            prompting, self.preset = resolve_prompting(
                served, "reranker", preset=preset, prompts=prompts, instructions=instructions
            )
            template = score_template or (self.preset.score_template if self.preset else None)
            meta = build_model_meta(
                served_model_ref(served),
                model_name=model_name or served,
                max_model_len=max_length or None,
                framework=["API"],
                cross_encoder=True,
                modalities=["text", "image"] if takes_images else None,
            )
            super().__init__(
                model=served,
                meta=meta,
                prompting=prompting,
                mode="template" if template is not None else "cross-encoder",
                template=template,
                max_length=max_length or None,
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )
            # vLLM's score path puts the placeholder in front of the text itself.
            self.image_placeholder = "" if takes_images else None

    def _takes_images(self, served: str) -> bool:
        image = {"content": content_parts(ImageInput(np.zeros((8, 8), dtype=np.uint8)))}
        if self.api == "score":
            body = {"model": served, "text_1": "a", "text_2": image}
            return self.http.accepts("/score", body, lambda reply: _indexed(reply, "data", "score", 1))
        body = {"model": served, "query": "a", "documents": [image]}
        return self.http.accepts("/rerank", body, lambda reply: _indexed(reply, "results", "relevance_score", 1))

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        if images is not None and self.template is not None and self.image_placeholder is not None:
            raise UsageError(
                "a score template applied here cannot place an image; start the server with it "
                "(--chat-template) and pass no score_template or preset"
            )
        return super()._model_inputs(texts, images)

    def identity(self) -> dict[str, Any]:
        """The base identity (the served name) plus the server's version and the API used."""
        return {**super().identity(), "server": self.http.server_version(), "api": self.api}

    def _describe(self, pair: tuple[str, str]) -> str:
        return f"pair (query {pair[0]!r:.60}, document {pair[1]!r:.60})"

    def _request(self, pairs: list[tuple[str, str]]) -> list[float]:
        common = {"model": self.model, "truncate_prompt_tokens": -1}
        if self.api == "score":
            body = {**common, "text_1": [_item(q) for q, _ in pairs], "text_2": [_item(d) for _, d in pairs]}
            return self.http.request("POST", "/score", body, parse=lambda r: _indexed(r, "data", "score", len(pairs)))
        # /rerank: one query per request; the batch holds runs of the same query.
        out: list[float] = []
        i = 0
        while i < len(pairs):
            j = i
            while j < len(pairs) and pairs[j][0] == pairs[i][0]:
                j += 1
            documents = [_item(d) for _, d in pairs[i:j]]
            body = {**common, "query": _item(pairs[i][0]), "documents": documents, "top_n": j - i}
            out.extend(
                self.http.request(
                    "POST", "/rerank", body, parse=lambda r, n=j - i: _indexed(r, "results", "relevance_score", n)
                )
            )
            i = j
        return out

    def _score_chunk(self, queries: list[str], documents: list[str]) -> np.ndarray:
        return np.asarray(self._post_all(list(zip(queries, documents, strict=True))), dtype=np.float32)


def _item(x: Any) -> Any:
    """A text as it is; an image input as vLLM's ``ScoreMultiModalParam``."""
    return {"content": content_parts(x)} if isinstance(x, ImageInput) else x


def _indexed(body: Any, key: str, field: str, n: int) -> list[float]:
    """``n`` scores from ``body[key]``, a list of ``{"index": i, field: score}`` items, put in index order."""
    items = body.get(key) if isinstance(body, dict) else None
    expect(isinstance(items, list), f"no {key!r} list")
    expect(len(items) == n, f"{len(items)} scores for {n} pairs")
    expect(
        all(isinstance(d, dict) and "index" in d and field in d for d in items), f"an item without 'index' or {field!r}"
    )
    scores: list[float | None] = [None] * n
    for d in items:
        i = d["index"]
        expect(isinstance(i, int) and 0 <= i < n and scores[i] is None, f"index {i!r} out of range or repeated")
        scores[i] = float(d[field])
    return scores  # type: ignore[return-value]
