"""A vLLM IO-processor plugin for the tests (registered by tests/test_sparse.py through a dist-info on sys.path).

``vllm_eval_sparse_rows``: a request's ``data`` is a list of texts; each becomes one ``embed`` request, and the
response is each text's non-zero (token id, weight) pairs, as vLLM's sparse-output plugin returns them.
``vllm_eval_broken``: an entry point that fails, for the one-line error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from vllm import PoolingParams
from vllm.plugins.io_processors.interface import IOProcessor

#: How many processors vLLM built (the engine loaded the plugin).
BUILT: list[str] = []


class SparseRowsProcessor(IOProcessor):
    """Texts in, ``{"token_ids": [...], "weights": [...]}`` per text out."""

    def __init__(self, vllm_config: Any, renderer: Any) -> None:
        super().__init__(vllm_config, renderer)
        BUILT.append(type(self).__name__)

    def parse_data(self, data: object) -> list[str]:
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise ValueError("data must be a list of texts")
        return data

    def merge_pooling_params(self, params: PoolingParams | None = None) -> PoolingParams:
        params = params or PoolingParams()
        params.task = "embed"
        return params

    def pre_process(self, prompt: list[str], request_id: str | None = None, **kwargs: Any) -> list[str]:
        return list(prompt)

    def post_process(self, model_output: Any, request_id: str | None = None, **kwargs: Any) -> list[dict]:
        out = []
        for item in model_output:
            dense = np.asarray(item.outputs.data, dtype=np.float32)
            ids = np.flatnonzero(dense)
            out.append({"token_ids": ids.tolist(), "weights": dense[ids].tolist()})
        return out


def register() -> str:
    return "sparse_io_plugin.SparseRowsProcessor"


def broken() -> str:
    raise RuntimeError("this plugin fails on purpose")
