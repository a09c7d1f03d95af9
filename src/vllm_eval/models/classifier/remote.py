"""``RemoteClassifier``: a sequence classifier served by ``vllm serve`` (``POST /classify``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta, served_model_ref
from ..http import HttpOptions, RemoteBackend, expect
from ..prompts import PromptResolver
from .base import ClassifierBase, labels_of


class RemoteClassifier(RemoteBackend, ClassifierBase):
    """Class probabilities from vLLM's ``/classify`` endpoint (``{"data": [{"index", "label", "probs"}]}``).

    The server tokenizes and truncates; deduplication, chunking and order are those of
    :class:`~vllm_eval.models.classifier.base.ClassifierBase`, the transport :mod:`vllm_eval.models.http`'s.

    Args:
        http: the endpoints and transport settings.
        model: served model name; None asks the first live endpoint's ``/v1/models``.
        labels: class names in index order; None reads ``id2label`` from the model's files when
            the served name is a local directory or a cached hub id.
        use_activation, add_special_tokens, chunk_size, show_progress_bar, model_name: as for
            :class:`~vllm_eval.models.classifier.vllm.VllmClassifier` (sent with each request).

    Raises:
        UsageError: no labels given and none readable.
        EndpointError: no endpoint answers, a server refuses an input (named), or a reply is malformed.
    """

    tokenizes_locally: ClassVar[bool] = False
    route: ClassVar[str] = "/classify"

    def __init__(
        self,
        http: HttpOptions,
        model: str | None = None,
        *,
        labels: Sequence[str] | None = None,
        use_activation: bool = True,
        add_special_tokens: bool = True,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_name: str | None = None,
    ) -> None:
        served, max_length = self._connect(http, model)
        self.add_special_tokens = add_special_tokens
        with self.closed_on_error():
            if labels is None:
                try:
                    config = ModelRef.resolve(served).config
                except Exception:  # not a local directory or cached id: the files are on the server only
                    config = None
                if not config:
                    raise UsageError(
                        f"the labels of served model {served!r} are not known here; pass labels=[...] (--labels)"
                    )
                labels = labels_of(config)
            meta = build_model_meta(
                served_model_ref(served),
                model_name=model_name or served,
                max_model_len=max_length or None,
                framework=["API"],
                cross_encoder=True,
            )
            super().__init__(
                model=served,
                labels=labels,
                use_activation=use_activation,
                meta=meta,
                prompting=PromptResolver(),
                max_length=max_length or None,
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity (the served name) plus the server's version."""
        return {**super().identity(), "server": self.http.server_version()}

    def _request(self, batch: list[str]) -> list[np.ndarray]:
        payload = {
            "model": self.model,
            "input": batch,
            "truncate_prompt_tokens": -1,
            "use_activation": self.use_activation,
            "add_special_tokens": self.add_special_tokens,
        }
        return self.http.request("POST", self.route, payload, parse=lambda body: self._parse(body, len(batch)))

    def _parse(self, body: Any, n: int) -> list[np.ndarray]:
        data = body.get("data") if isinstance(body, dict) else None
        expect(isinstance(data, list), "no 'data' list")
        expect(len(data) == n, f"{len(data)} results for {n} inputs")
        expect(all(isinstance(d, dict) and "probs" in d and "index" in d for d in data), "an item without 'probs'")
        data = sorted(data, key=lambda d: d["index"])
        expect([d["index"] for d in data] == list(range(n)), f"indices are not 0..{n - 1}")
        rows = [np.asarray(d["probs"], dtype=np.float32) for d in data]
        width = len(self.labels)
        expect(all(r.shape == (width,) for r in rows), f"probabilities not of the {width} labels")
        return rows

    def _classify_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return np.stack(self._post_all(texts)).astype(np.float32, copy=False)
