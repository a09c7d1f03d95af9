"""The backend table: every CLI choice resolves to a class of its kind, unknown names get close names."""

from __future__ import annotations

import argparse
import json
from typing import ClassVar

import numpy as np
import pytest

from vllm_eval.models import backends
from vllm_eval.models.backends import (
    BACKENDS,
    KINDS,
    backend_class,
    backend_names,
    engine_options,
    is_remote,
    load_backend,
)
from vllm_eval.models.encoder.base import EncoderBase
from vllm_eval.models.http import HttpClient, RemoteBackend, expect
from vllm_eval.models.prompts import resolve_prompting
from vllm_eval.testing import JsonStubHandler, stub_server, url_of
from vllm_eval.utils.errors import UnknownNameError, UsageError
from vllm_eval.utils.modelinfo import build_model_meta, served_model_ref

BASES = {
    "encoder": "vllm_eval.models.encoder.base:EncoderBase",
    "reranker": "vllm_eval.models.reranker.base:RerankerBase",
    "generator": "vllm_eval.models.generator.base:GeneratorBase",
    "classifier": "vllm_eval.models.classifier.base:ClassifierBase",
    "token_classifier": "vllm_eval.models.token_classifier.base:TokenClassifierBase",
    "token_embedder": "vllm_eval.models.token_embedder.base:TokenEmbedderBase",
}


def _base(kind: str) -> type:
    import importlib

    module, _, name = BASES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def _choices(parser: argparse.ArgumentParser, command: str, dest: str) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices[command]._actions if a.dest == dest).choices


def test_every_cli_choice_resolves_to_a_class_of_its_kind():
    from vllm_eval.cli import build_parser

    parser = build_parser()
    commands = (
        ("run", ("encoder", "token_embedder")),  # --pooling-task embed / token_embed
        ("rerank", ("reranker",)),
        ("generate", ("generator",)),
        ("classify", ("classifier",)),
        ("token-classify", ("token_classifier",)),
    )
    for command, kinds in commands:
        choices = _choices(parser, command, "backend")
        assert choices == list(dict.fromkeys(n for k in kinds for n in backend_names(k))), command
        for kind in kinds:
            for name in backend_names(kind):
                cls = backend_class(kind, name)
                assert issubclass(cls, _base(kind)), (kind, name)
                assert not getattr(cls, "__abstractmethods__", None), (kind, name, cls.__abstractmethods__)
    # reward models are one-output classifiers read without activation; no remote form (the chat
    # template is rendered here)
    assert _choices(parser, "reward", "backend") == ["vllm", "hf"]
    assert set(_choices(parser, "bench", "backends")) == {*backend_names("encoder"), "mteb-vllm"}
    assert {k for k, _ in BACKENDS} == set(KINDS)


def test_capabilities_are_declared_on_the_classes():
    assert engine_options("encoder", "vllm") is None and engine_options("encoder", "remote") == frozenset()
    assert engine_options("reranker", "st") == {"max_model_len", "trust_remote_code", "dtype"}
    assert is_remote("generator", "remote") and not is_remote("generator", "vllm")
    from vllm_eval.models.backends import SERVED_BACKENDS

    assert {n for k, n in BACKENDS if is_remote(k, n)} == SERVED_BACKENDS
    assert backend_class("generator", "vllm").supports_loglikelihood
    assert not backend_class("generator", "remote").supports_loglikelihood
    assert not backend_class("encoder", "remote").tokenizes_locally and backend_class("encoder", "st").tokenizes_locally


def test_unknown_names_suggest_close_ones():
    with pytest.raises(UnknownNameError, match=r"unknown encoder backend 'vlm' \(did you mean 'vllm'\?\)"):
        backend_class("encoder", "vlm")
    with pytest.raises(UnknownNameError, match="unknown kind 'encoders'"):
        backend_names("encoders")
    with pytest.raises(UsageError, match="needs endpoints"):
        load_backend("encoder", "remote", None)
    with pytest.raises(UsageError, match="endpoints are for the remote backend"):
        load_backend("encoder", "st", None, http=object())


def test_a_new_backend_is_one_table_line(monkeypatch):
    """A server type added by one line shows up as a CLI choice and loads through the table."""
    from vllm_eval.cli import build_parser

    monkeypatch.setitem(BACKENDS, ("encoder", "tei"), "vllm_eval.models.encoder.remote:RemoteEncoder")
    assert "tei" in _choices(build_parser(), "run", "backend")
    assert backends.is_remote("encoder", "tei")


# --- docs/architecture.md's example backend, verbatim, run through the CLI ---------------------------------


class TeiEncoder(RemoteBackend, EncoderBase):
    tokenizes_locally: ClassVar[bool] = False  # the server tokenizes and truncates

    def __init__(self, http, model=None, *, show_progress_bar=True, **prompt_options):
        self.http = HttpClient(http)
        info = self.http.request("GET", "/info", parse=lambda body: (body["model_id"], body["max_input_length"]))
        served = model or info[0]
        prompting, self.preset = resolve_prompting(served, "encoder", **prompt_options)
        meta = build_model_meta(served_model_ref(served), model_name=served, framework=["API"])
        super().__init__(
            model=served, meta=meta, prompting=prompting, max_length=info[1], show_progress_bar=show_progress_bar
        )

    def _request(self, batch):  # one request: a batch of texts -> one vector each
        def parse(body):
            expect(isinstance(body, list) and len(body) == len(batch), "one vector per input")
            return [np.asarray(v, dtype=np.float32) for v in body]

        return self.http.request("POST", "/embed", {"inputs": batch, "truncate": True}, parse=parse)

    def _embed_chunk(self, texts, ids):
        return np.stack(self._post_all(texts))  # batches, concurrency, retries, refused inputs named


class _TeiStub(JsonStubHandler):
    """text-embeddings-inference's two routes: /info and /embed (bag-of-characters vectors)."""

    def do_GET(self):
        self.send_json(200, {"model_id": "intfloat/e5-small-v2", "max_input_length": 512})

    def do_POST(self):
        inputs = self.read_json()["inputs"]
        self.server.seen.extend(inputs)
        vecs = [[t.count(c) + 0.1 for c in "aeiou query"] for t in inputs]
        self.send_json(200, [(np.asarray(v) / np.linalg.norm(v)).tolist() for v in vecs])


def test_the_readme_backend_runs_through_the_cli(monkeypatch, cli_in_process, tmp_path):
    monkeypatch.setitem(BACKENDS, ("encoder", "tei"), "test_backends:TeiEncoder")
    with stub_server(_TeiStub, seen=[]) as srv:
        code, err = cli_in_process(
            "run",
            "--backend",
            "tei",
            "--endpoint",
            url_of(srv),
            "--tasks",
            "LeeKnownItemRetrieval",
            "--no-progress",
            "--output-dir",
            str(tmp_path),
        )
    assert code == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["backend"] == "tei" and summary["preset"] == "e5"  # matched on the served name
    assert 0.0 <= summary["scores"][0]["main_score"] <= 1.0
    assert any(t.startswith("query: ") for t in srv.seen) and any(t.startswith("passage: ") for t in srv.seen)
