"""``RemoteGenerator``: generation against served chat models (``/v1/chat/completions``, ``/v1/completions``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Literal

from ...utils.errors import EndpointError, UsageError
from ..http import HttpOptions, RemoteBackend, RequestRefused, expect
from ..images import image_data_url
from .base import DEFAULT_SAMPLING, Generation, GeneratorBase, reasoning_opening

logger = logging.getLogger(__name__)


class RemoteGenerator(RemoteBackend, GeneratorBase):
    """Generation against served chat models: ``/v1/chat/completions`` (``/v1/completions`` raw).

    Messages are built by the same code as :class:`~vllm_eval.models.generator.vllm.VllmGenerator`'s
    (:class:`~vllm_eval.models.generator.base.GeneratorBase`); images travel as PNG data URLs. Sampling
    uses the same evaluation defaults, sent by their ``SamplingParams`` names (vLLM's server accepts
    them in the request body). When the server's chat template refuses a system turn (a 400 that says
    so), the system prompt is merged into the user turn from then on, as in-process. Log-likelihood
    scoring needs prompt log-probabilities of exact token ids and is not offered remotely.

    Args:
        http: the endpoints and transport settings (one sample per request).
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        system_prompt, raw_prompts, image_position, sampling, chat_template_kwargs, think_end_token,
            chunk_size, show_progress_bar: as for :class:`~vllm_eval.models.generator.vllm.VllmGenerator`
            (``chat_template_kwargs`` travel in each chat request, for the server's template).

    Raises:
        EndpointError: no endpoint answers, a server refuses a sample (named), or a reply is malformed.
        OptionError: an unknown sampling option.
    """

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        system_prompt: str | None = None,
        raw_prompts: bool = False,
        image_position: Literal["before", "after"] = "before",
        sampling: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        think_end_token: str | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
    ) -> None:
        # Validate everything local before the first request.
        GeneratorBase.__init__(
            self,
            model=model or "",
            system_prompt=system_prompt,
            raw_prompts=raw_prompts,
            image_position=image_position,
            sampling=sampling,
            chat_template_kwargs=chat_template_kwargs,
            think_end_token=think_end_token,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )
        self.request_sampling = {**DEFAULT_SAMPLING, **self.sampling_overrides}
        self.model, _ = self._connect(http, model)

    def identity(self) -> dict[str, Any]:
        """The base identity (the served name) plus the server's version."""
        return {**super().identity(), "server": self.http.server_version()}

    def image_part(self, image: Any) -> dict[str, Any]:
        """One image as an ``image_url`` part holding a PNG data URL."""
        return {"type": "image_url", "image_url": {"url": image_data_url(image)}}

    def render(self, text: str, images: Sequence[Any] = (), **template_kwargs: Any) -> str:
        """The prompt as recorded: the text itself for raw prompts, else the chat messages as JSON
        (the server applies its chat template, with :attr:`chat_template_kwargs`; images as
        ``{"type": "image"}`` parts)."""
        if self.raw_prompts:
            return text
        return json.dumps(self.messages(text, images, placeholders=True), ensure_ascii=False)

    def _one(self, sample: tuple[str, Sequence[Any]]) -> Generation:
        text, images = sample
        if self.raw_prompts:
            if images:
                raise UsageError("raw prompts carry no images remotely; use the chat API (no --raw-prompts)")
            body = {"model": self.model, "prompt": text, **self.request_sampling}
            answer, usage = self.http.request("POST", "/v1/completions", body, parse=lambda r: _choice(r, "text"))
            prompt = text
        else:
            body = {"model": self.model, "messages": self.messages(text, images), **self.request_sampling}
            if self.chat_template_kwargs:
                body["chat_template_kwargs"] = self.chat_template_kwargs
            try:
                answer, usage = self.http.request(
                    "POST", "/v1/chat/completions", body, parse=lambda r: _choice(r, "message", self.think_end_token)
                )
            except RequestRefused as exc:
                if not (self.system_prompt and self.system_role and "system" in exc.message.lower()):
                    raise
                logger.info(
                    "server's chat template rejects a system turn (%s); merging it into the user turn", exc.message
                )
                self.system_role = False
                return self._one(sample)
            prompt = self.render(text) + (f" [+ {len(images)} image(s)]" if images else "")
        return Generation(
            prompt=prompt,
            output=answer,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
        )

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        def one(k: int) -> Generation:
            try:
                return self._one(chunk[k])
            except RequestRefused as exc:
                raise EndpointError(
                    f"server refused sample {offset + k} ({chunk[k][0]!r:.60}) (HTTP {exc.status}): {exc.message}"
                ) from None

        return self.http.map(one, list(range(len(chunk))))


def _choice(body: Any, kind: str, think_end_token: str | None = None) -> tuple[str, dict[str, Any]]:
    """The first choice's text (``kind="text"``) or message (``"message"``), and the usage dict.

    A server started with a reasoning parser returns the reasoning apart (``reasoning``, vLLM
    before 0.11 ``reasoning_content``) and ``content`` None while the reasoning is unfinished; the
    two are joined back the way the model wrote them (``<think>`` reasoning ``</think>`` content, with
    ``think_end_token``'s tags), so samples keep the reasoning and the answer is read as in-process.
    """
    choices = body.get("choices") if isinstance(body, dict) else None
    expect(isinstance(choices, list) and choices and isinstance(choices[0], dict), "no 'choices'")
    if kind == "text":
        answer = choices[0].get("text")
    else:
        message = choices[0].get("message")
        expect(isinstance(message, dict), "a choice without 'message'")
        content = message.get("content")
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            end = think_end_token or "</think>"
            answer = (reasoning_opening(end) or "") + reasoning + ("" if content is None else end + str(content))
        else:
            answer = content or ""
    expect(isinstance(answer, str), f"a choice without {kind} text")
    usage = body.get("usage") or {}
    expect(isinstance(usage, dict), "'usage' is not an object")
    return answer, usage
