"""``RemoteTokenClassifier``: a token classifier served by ``vllm serve`` (``/pooling``, task ``token_classify``)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta, served_model_ref
from ..classifier.base import labels_of
from ..http import HttpOptions, RemoteBackend
from ..prompts import PromptResolver
from ..token_embedder.remote import parse_pooling
from .base import TokenClassifierBase


class RemoteTokenClassifier(RemoteBackend, TokenClassifierBase):
    """Per-token label probabilities from vLLM's ``/pooling`` endpoint with ``"task": "token_classify"``.

    Words are tokenized here, as for every token classifier (their sub-tokens must map back to
    words), and sent as token ids, so the server sees exactly the ids the other backends see. The
    model's tokenizer and labels are read from its files: the served name must be a local
    directory or a cached hub id, or ``tokenizer`` must name one.

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        tokenizer: directory or hub id to read the tokenizer and labels from (default: the served name).
        chunk_size, show_progress_bar, model_name: as for
            :class:`~vllm_eval.models.token_classifier.vllm.VllmTokenClassifier`.

    Raises:
        UsageError: the tokenizer or labels cannot be read here.
        EndpointError: no endpoint answers, a server refuses an input (named), or a reply is malformed.
    """

    tokenizes_locally: ClassVar[bool] = True
    route: ClassVar[str] = "/pooling"

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        tokenizer: str | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        served, max_length = self._connect(http, model)
        with self.closed_on_error():
            source = tokenizer or served
            try:
                ref = ModelRef.resolve(source)
                from transformers import AutoTokenizer

                hf_tokenizer = AutoTokenizer.from_pretrained(ref.path)
            except Exception as exc:  # the files are on the server only
                raise UsageError(
                    f"the tokenizer of served model {source!r} is not readable here ({type(exc).__name__}); "
                    "pass tokenizer=DIR (--tokenizer) with the model's files"
                ) from None
            limit = max_length or int(getattr(hf_tokenizer, "model_max_length", 512))
            super().__init__(
                model=served,
                labels=labels_of(ref.config),
                meta=build_model_meta(
                    served_model_ref(served),
                    model_name=model_name or served,
                    max_model_len=limit,
                    framework=["API"],
                    cross_encoder=True,
                ),
                prompting=PromptResolver(),
                max_length=limit,
                tokenizer=hf_tokenizer,
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity (the served name) plus the server's version."""
        return {**super().identity(), "server": self.http.server_version()}

    def _request(self, batch: list[list[int]]) -> list[np.ndarray]:
        payload = {"model": self.model, "input": batch, "task": "token_classify"}
        return self.http.request("POST", self.route, payload, parse=lambda body: parse_pooling(body, len(batch)))

    def _describe(self, item: Any) -> str:
        return f"a sequence of {len(item)} tokens"

    def _token_probs(self, ids: list[list[int]]) -> list[np.ndarray]:
        return self._post_all(ids)
