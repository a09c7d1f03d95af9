"""RemoteEncoder against real `vllm serve` on loopback, and against a scripted stub server for failures."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import time

import numpy as np
import pytest

from vllm_eval.models.encoder.remote import RemoteEncoder
from vllm_eval.models.generator.remote import RemoteGenerator
from vllm_eval.models.http import HttpOptions
from vllm_eval.models.reranker.remote import RemoteReranker
from vllm_eval.testing import JsonStubHandler, stub_server, url_of
from vllm_eval.utils.errors import EndpointError, UsageError


def _http(urls, **kwargs) -> HttpOptions:
    return HttpOptions(tuple([urls] if isinstance(urls, str) else urls), **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vec(text: str) -> list[float]:
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(8).astype(np.float32).tolist()


class _Stub(JsonStubHandler):
    """Deterministic /v1/embeddings: 400 for inputs containing BAD, random latency, request counting."""

    def do_GET(self):
        self.send_json(200, {"data": [{"id": "stub/model", "max_model_len": 128}]})

    def do_POST(self):
        body = self.read_json()
        self.server.requests += 1
        time.sleep(random.uniform(0, 0.02))
        if (self.path == "/v1/embeddings" and "messages" in body) or any(
            not isinstance(t, str) for t in body.get("text_2", [])
        ):
            return self.send_json(400, {"error": {"message": "MultiModalParam is not supported"}})  # text only
        if self.path == "/score":
            if any("BAD" in t for t in body["text_2"]):
                return self.send_json(400, {"error": {"message": "document too long"}})
            return self.send_json(
                200,
                {
                    "data": [
                        {"index": i, "score": _vec(q + d)[0]}
                        for i, (q, d) in enumerate(zip(body["text_1"], body["text_2"]))
                    ]
                },
            )
        if self.path == "/v1/chat/completions":
            text = body["messages"][-1]["content"]
            if "BAD" in text:
                return self.send_json(400, {"error": {"message": "prompt too long"}})
            return self.send_json(200, {"choices": [{"message": {"content": text.upper()}}], "usage": {}})
        if any("BAD" in t for t in body["input"]):
            return self.send_json(400, {"error": {"message": "This model's maximum context length is 128 tokens"}})
        self.send_json(200, {"data": [{"index": i, "embedding": _vec(t)} for i, t in enumerate(body["input"])]})


@pytest.fixture()
def stubs():
    with stub_server(_Stub, requests=0) as one, stub_server(_Stub, requests=0) as two:
        yield [one, two]


_url = url_of


def test_order_kept_and_load_shared(stubs):
    texts = [f"text {i}" for i in range(200)]
    with RemoteEncoder(
        _http([_url(s) for s in stubs], batch_size=7, max_concurrency=6), show_progress_bar=False
    ) as enc:
        out = enc.encode_texts(texts)
    np.testing.assert_allclose(out, np.asarray([_vec(t) for t in texts], dtype=np.float32))
    assert all(s.requests >= 10 for s in stubs), [s.requests for s in stubs]


def test_preset_matching_the_served_name_applies(stubs):
    """A served e5 model gets the e5 preset's prompts (matched on its served name), as in-process."""
    from mteb.types import PromptType

    from vllm_eval.tasks.offline import LeeKnownItemRetrieval
    from vllm_eval.testing import text_loader

    with RemoteEncoder(_http(_url(stubs[0])), "intfloat/e5-small-v2", show_progress_bar=False) as enc:
        assert enc.preset is not None and enc.preset.name == "e5"
        out = enc.encode(
            text_loader(["a", "b"]),
            task_metadata=LeeKnownItemRetrieval.metadata,
            hf_split="test",
            hf_subset="default",
            prompt_type=PromptType.query,
        )
    np.testing.assert_allclose(out, np.asarray([_vec("query: a"), _vec("query: b")], dtype=np.float32))


def test_refused_input_is_named(stubs):
    with RemoteEncoder(_http(_url(stubs[0]), batch_size=16), show_progress_bar=False) as enc:
        with pytest.raises(EndpointError, match=r"refused input 'the BAD one'.*HTTP 400.*maximum context length"):
            enc.encode_texts([f"ok {i}" for i in range(20)] + ["the BAD one"] + ["ok"] * 5)


def test_dead_endpoint_skipped_and_all_dead_fails(stubs):
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.warns(RuntimeWarning, match="skipped after retries"):
        with RemoteEncoder(
            _http([dead, _url(stubs[0])], retries=2, backoff=0.01, timeout=2), show_progress_bar=False
        ) as enc:
            out = enc.encode_texts(["a", "b", "c"])
    np.testing.assert_allclose(out[1], _vec("b"))
    with pytest.warns(RuntimeWarning), pytest.raises(EndpointError, match="every endpoint is unreachable"):
        RemoteEncoder(_http([dead], retries=2, backoff=0.01, timeout=2), show_progress_bar=False)


@pytest.fixture(scope="module")
def servers(test_models):
    """Real `vllm serve` processes on loopback (fp32, eager, small KV reserve), started side by side: two of the
    packaged MiniLM (the second is killed by a test), the seeded MiniLM cross-encoder and the tiny Qwen3."""
    from vllm_eval.testing import serve_models
    from vllm_eval.utils.modelinfo import packaged_model_path

    names = ("minilm", "minilm-2", "cross", "qwen3")
    models = (packaged_model_path(), packaged_model_path(), test_models["cross"], test_models["qwen3"])
    with serve_models(*models, timeout=240) as urls:
        yield dict(zip(names, urls))


@pytest.fixture(scope="module")
def vllm_server(servers):
    """The packaged MiniLM's server."""
    return servers["minilm"]


def test_remote_suite_matches_in_process(vllm_server, vllm_encoder):
    from vllm_eval.testing import score_deltas

    with RemoteEncoder(_http(vllm_server, batch_size=32), encoding_format="base64", show_progress_bar=False) as remote:
        texts = ["The cat sat.", "", "word " * 400]
        np.testing.assert_allclose(remote.encode_texts(texts), vllm_encoder.encode_texts(texts), atol=1e-5)
        assert remote._image_batches is None and remote.mteb_model_meta.modalities == ["text"]  # asked, refused
        with pytest.raises(UsageError, match="does not embed images"):
            remote._model_inputs(None, [np.zeros((8, 8), dtype=np.uint8)])
        deltas = score_deltas(remote, vllm_encoder, ["LeeDocSimilarity", "WordSim353", "PangLeePolarity"])
    print("remote vs in-process |delta|:", deltas)
    assert max(deltas.values()) <= 1e-4


def test_a_server_killed_mid_run_hands_its_requests_to_the_other(servers, vllm_encoder):
    """Two real `vllm serve` processes; one is killed while requests are in flight: the run completes through
    the other with the same vectors."""
    import threading

    import psutil

    vllm_server, second = servers["minilm"], servers["minilm-2"]  # the second dies here; no later test uses it
    port = second.rsplit(":", 1)[1]
    (server,) = [p for p in psutil.Process().children() if port in p.cmdline()]
    texts = [f"request text {i} on {w}" for i, w in enumerate(["rivers", "towers", "birds"] * 150)]
    opts = _http([vllm_server, second], batch_size=8, max_concurrency=4, retries=2, backoff=0.05, timeout=20)
    with RemoteEncoder(opts, show_progress_bar=False) as remote:
        used = remote.http.endpoints.used

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 60
            while used[second] < 4 and time.monotonic() < deadline:
                time.sleep(0.005)
            for proc in [*server.children(recursive=True), server]:
                proc.kill()

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        with pytest.warns(RuntimeWarning, match=f"endpoint {second} skipped after retries"):
            got = remote.encode_texts(texts)
        killer.join(10)
        print(f"\nrequests per endpoint: {dict(used)}")
        assert used[second] >= 4 and used[vllm_server] > used[second]
    np.testing.assert_allclose(got, vllm_encoder.encode_texts(texts), atol=1e-5)


def test_cli_remote_backend(cli_in_process, vllm_server, tmp_path):
    code, err = cli_in_process(
        "run",
        "--backend",
        "remote",
        "--endpoint",
        vllm_server,
        "--tasks",
        "WordSim353",
        "--output-dir",
        str(tmp_path),
        "--no-progress",
    )
    assert code == 0, err[-2000:]
    assert "WordSim353" in cli_in_process.stdout and (tmp_path / "summary.json").is_file()
    code, err = cli_in_process("run", "--backend", "remote", "--tasks", "WordSim353")
    assert code == 2 and "needs at least one --endpoint" in err


def test_reranker_and_generator_share_load_keep_order_and_name_refusals(stubs):
    urls = [_url(s) for s in stubs]
    qs, ds = [f"q{i % 7}" for i in range(90)], [f"d{i}" for i in range(90)]
    with RemoteReranker(_http(urls, batch_size=4, max_concurrency=5), show_progress_bar=False) as rc:
        np.testing.assert_allclose(rc.score_pairs(qs, ds), [_vec(q + d)[0] for q, d in zip(qs, ds)], rtol=1e-6)
        with pytest.raises(EndpointError, match=r"refused pair \(query 'q3', document 'the BAD doc'\).*too long"):
            rc.score_pairs(["q1"] * 9 + ["q3"], ["d"] * 9 + ["the BAD doc"])
    before = [s.requests for s in stubs]
    with RemoteGenerator(_http(urls, max_concurrency=4), show_progress_bar=False) as rg:
        gens = rg.generate([(f"sample {i}", ()) for i in range(40)])
        assert [g.output for g in gens] == [f"SAMPLE {i}" for i in range(40)]
        with pytest.raises(EndpointError, match=r"refused sample 2 \('a BAD one'\).*prompt too long"):
            rg.generate([("ok", ()), ("fine", ()), ("a BAD one", ())])
    assert all(s.requests - b >= 10 for s, b in zip(stubs, before))


def test_images_travel_as_png_data_urls():
    import base64
    import io

    from PIL import Image

    img = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    rg = RemoteGenerator.__new__(RemoteGenerator)  # message building needs no server
    rg.system_prompt, rg.system_role, rg.image_position = "Be brief.", True, "after"
    msgs = rg.messages("What digit?", [img])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    text, part = msgs[1]["content"]
    assert text == {"type": "text", "text": "What digit?"} and part["type"] == "image_url"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    back = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("L"))
    np.testing.assert_array_equal(back, img)


def test_remote_reranker_matches_in_process(cli_in_process, servers, vllm_cross, tmp_path):
    """A real `vllm serve` of the seeded MiniLM cross-encoder: /score and /rerank give the in-process scores."""
    from vllm_eval.tasks.data import lee_documents

    docs = list(lee_documents()[:12])
    qs = [d.split(".")[0] for d in docs[:4] for _ in docs]
    ds = [d for _ in range(4) for d in docs]
    ref = vllm_cross.score_pairs(qs, ds)
    url = servers["cross"]
    for api in ("score", "rerank"):
        with RemoteReranker(_http(url, batch_size=16), api=api, show_progress_bar=False) as rc:
            got = rc.score_pairs(qs, ds)
        print(f"\nremote /{api} vs in-process: max |delta| {np.abs(got - ref).max():.2e}")
        np.testing.assert_allclose(got, ref, atol=1e-5)
    code, err = cli_in_process(
        "rerank",
        "--backend",
        "remote",
        "--endpoint",
        url,
        "--top-k",
        "10",
        "--no-progress",
        "--output-dir",
        str(tmp_path),
    )
    assert code == 0, err[-2000:]
    assert "LeeKnownItemRetrieval" in cli_in_process.stdout and (tmp_path / "stage2").is_dir()


def test_remote_generator_matches_in_process(cli_in_process, servers, generator, tmp_path):
    """A real `vllm serve` of the tiny Qwen3: greedy chat answers equal the in-process ones."""
    samples = [
        (f"Review {i}: the film was {w}. Positive or negative?", ())
        for i, w in enumerate(["dull", "bright", "long", "moving", "flat", "funny"])
    ]
    ref = generator.generate(samples)
    url = servers["qwen3"]
    with RemoteGenerator(
        _http(url), sampling={"max_tokens": 12}, system_prompt="Answer in one word.", show_progress_bar=False
    ) as rg:
        got_sys = rg.generate(samples[:2])
    with RemoteGenerator(_http(url), sampling={"max_tokens": 12}, show_progress_bar=False) as rg:
        got = rg.generate(samples)
    code, err = cli_in_process(
        "generate",
        "--backend",
        "remote",
        "--endpoint",
        url,
        "--task",
        "PangLeePolarity",
        "--limit",
        "6",
        "--max-missing",
        "6",
        "--max-tokens",
        "8",
        "--no-progress",
        "--output-dir",
        str(tmp_path),
    )
    assert [g.output for g in got] == [r.output for r in ref]
    assert [g.prompt_tokens for g in got] == [r.prompt_tokens for r in ref]
    assert all(g.prompt.startswith('[{"role": "system"') for g in got_sys)
    assert code == 0, err[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["target"] for r in rows)


class _ReasoningStub(JsonStubHandler):
    """/v1/chat/completions as vLLM serves it with a reasoning parser: the reasoning in ``reasoning``
    (``reasoning_content`` when asked), ``content`` None while the reasoning is unfinished."""

    def do_GET(self):
        self.send_json(200, {"data": [{"id": "stub/thinker", "max_model_len": 128}]})

    def do_POST(self):
        body = self.read_json()
        self.server.bodies.append(body)
        text = body["messages"][-1]["content"]
        key = "reasoning_content" if "OLD" in text else "reasoning"
        content = None if "CUT" in text else '\n\n{"answer": "B"}'
        message = {"role": "assistant", key: '\nA? {"answer": "A"} no.\n', "content": content}
        self.send_json(200, {"choices": [{"message": message}], "usage": {}})


def test_remote_reasoning_is_kept_and_an_unfinished_one_gives_no_answer():
    from vllm_eval.tasks.multiple_choice import extract_answer, split_reasoning

    with stub_server(_ReasoningStub, bodies=[]) as srv:
        with RemoteGenerator(
            _http(_url(srv)),
            chat_template_kwargs={"enable_thinking": True},
            think_end_token="</think>",
            show_progress_bar=False,
        ) as rg:
            done, old, cut = rg.generate([("Q", ()), ("Q OLD", ()), ("Q CUT", ())])
        assert all(b["chat_template_kwargs"] == {"enable_thinking": True} for b in srv.bodies)
    # Joined back as the model wrote it (what the in-process backend returns for the same model).
    assert done.output == old.output == '<think>\nA? {"answer": "A"} no.\n</think>\n\n{"answer": "B"}'
    thought, answer = split_reasoning(done.output, "</think>")
    assert thought == 'A? {"answer": "A"} no.' and extract_answer(answer, "json", ["A", "B"]) == 1
    assert cut.output == '<think>\nA? {"answer": "A"} no.\n' and split_reasoning(cut.output, "</think>")[1] is None


def _lm_eval_responses(result) -> dict:
    """task -> doc_id -> lm-eval's filtered responses of the document (log-likelihoods and is_greedy, or texts)."""
    out: dict = {}
    for task, rows in result.lm_eval["samples"].items():
        out[task] = {row["doc_id"]: row["filtered_resps"] for row in rows}
    return out


def test_lm_eval_tasks_against_vllm_serve_score_as_our_engine(servers, test_models, generator, lm_include, tmp_path):
    """lm-eval's own ``local-completions`` model against a real `vllm serve` of the tiny Qwen3: ARC-Easy's options
    (several tokens: ``echo`` with ``logprobs``) within 1e-4 nats of our engine's log-likelihoods with the same
    ``is_greedy``, GSM8K's greedy generations equal, the same metrics."""
    import vllm_eval

    model = str(test_models["qwen3"])
    common = dict(
        tasks=["arc_easy", "gsm8k"],
        include_path=lm_include,
        limit=2,
        gen_kwargs="max_gen_toks=12",
        show_progress=False,
        no_cache=True,
    )
    served = vllm_eval.generate(
        model=model, backend="remote", endpoint=[servers["qwen3"]], output_dir=str(tmp_path / "remote"), **common
    )
    ours = vllm_eval.generate(model=model, output_dir=str(tmp_path / "ours"), **common)
    got, want = _lm_eval_responses(served), _lm_eval_responses(ours)
    assert set(got) == set(want) == {"arc_easy", "gsm8k"} and len(got["arc_easy"]) == 2
    for doc, options in want["arc_easy"].items():
        for (ll, greedy), (ll_served, greedy_served) in zip(options, got["arc_easy"][doc], strict=True):
            assert abs(float(ll) - float(ll_served)) < 1e-4 and bool(greedy) == bool(greedy_served)
    assert got["gsm8k"] == want["gsm8k"]
    assert served.scores == ours.scores
    summary = json.loads((tmp_path / "remote" / "summary.json").read_text())
    assert summary["task_framework"] == "lm-eval" and summary["model"] == model


class _NoEchoStub(JsonStubHandler):
    """A completions server that refuses ``echo`` (as servers that give no prompt log-probabilities do)."""

    def do_GET(self):
        self.send_json(200, {"data": [{"id": self.server.model, "max_model_len": 512}]})

    def do_POST(self):
        self.server.bodies.append(self.read_json())
        self.send_json(400, {"error": {"message": "echo is not supported"}})


def test_lm_eval_loglikelihood_tasks_need_a_server_that_echoes_logprobs(test_models, lm_include, tmp_path):
    """A server without prompt log-probabilities: one line naming the tasks that need them, before any of them
    runs; a second endpoint is refused (lm-eval's model sends to one URL)."""
    import vllm_eval

    model = str(test_models["qwen3"])
    with stub_server(_NoEchoStub, model=model, bodies=[]) as srv:
        with pytest.raises(
            UsageError, match=r"no prompt log-probabilities .*HTTP 400: echo is not supported.*arc_easy"
        ):
            vllm_eval.generate(
                model=model, backend="remote", endpoint=[url_of(srv)], tasks=["arc_easy", "gsm8k"],
                include_path=lm_include, limit=1, output_dir=str(tmp_path), show_progress=False, no_cache=True,
            )  # fmt: skip
        assert len(srv.bodies) == 1 and srv.bodies[0]["echo"] is True
        with pytest.raises(UsageError, match="take one --endpoint"):
            vllm_eval.generate(
                backend="remote", endpoint=[url_of(srv), "http://127.0.0.1:9"], tasks=["gsm8k"],
                include_path=lm_include, limit=1, output_dir=str(tmp_path), show_progress=False, no_cache=True,
            )  # fmt: skip
