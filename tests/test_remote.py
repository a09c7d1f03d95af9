"""RemoteEncoder against real `vllm serve` on loopback, and against a scripted stub server for failures."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from vllm_eval.remote import EndpointError, RemoteEncoder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vec(text: str) -> list[float]:
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(8).astype(np.float32).tolist()


class _Stub(BaseHTTPRequestHandler):
    """Deterministic /v1/embeddings: 400 for inputs containing BAD, random latency, request counting."""

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._send(200, {"data": [{"id": "stub/model", "max_model_len": 128}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests += 1
        time.sleep(random.uniform(0, 0.02))
        if any("BAD" in t for t in body["input"]):
            return self._send(400, {"error": {"message": "This model's maximum context length is 128 tokens"}})
        self._send(200, {"data": [{"index": i, "embedding": _vec(t)} for i, t in enumerate(body["input"])]})


@pytest.fixture()
def stubs():
    servers = []
    for _ in range(2):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
        srv.requests = 0
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    yield servers
    for srv in servers:
        srv.shutdown()


def _url(srv) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_order_kept_and_load_shared(stubs):
    texts = [f"text {i}" for i in range(200)]
    with RemoteEncoder([_url(s) for s in stubs], batch_size=7, max_concurrency=6, show_progress_bar=False) as enc:
        out = enc.encode_texts(texts)
    np.testing.assert_allclose(out, np.asarray([_vec(t) for t in texts], dtype=np.float32))
    assert all(s.requests >= 10 for s in stubs), [s.requests for s in stubs]


def test_refused_input_is_named(stubs):
    with RemoteEncoder(_url(stubs[0]), batch_size=16, show_progress_bar=False) as enc:
        with pytest.raises(EndpointError, match=r"refused input 'the BAD one'.*HTTP 400.*maximum context length"):
            enc.encode_texts([f"ok {i}" for i in range(20)] + ["the BAD one"] + ["ok"] * 5)


def test_dead_endpoint_skipped_and_all_dead_fails(stubs):
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.warns(RuntimeWarning, match="skipped after retries"):
        with RemoteEncoder([dead, _url(stubs[0])], retries=2, backoff=0.01, timeout=2,
                           show_progress_bar=False) as enc:
            out = enc.encode_texts(["a", "b", "c"])
    np.testing.assert_allclose(out[1], _vec("b"))
    with pytest.warns(RuntimeWarning), pytest.raises(EndpointError, match="every endpoint is unreachable"):
        RemoteEncoder([dead], retries=2, backoff=0.01, timeout=2, show_progress_bar=False)


@pytest.fixture(scope="module")
def vllm_server():
    """A real `vllm serve` of the packaged MiniLM on loopback (fp32, eager, small KV reserve)."""
    from vllm_eval.encoder import packaged_model_path

    port = _free_port()
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", packaged_model_path(), "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("vllm serve did not become healthy in 240 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_remote_suite_matches_in_process(vllm_server, vllm_encoder):
    from vllm_eval.results import evaluate
    from vllm_eval.tasks import get_tasks

    tasks = ["LeeDocSimilarity", "WordSim353", "LeeKnownItemRetrieval"]
    with RemoteEncoder(vllm_server, encoding_format="base64", batch_size=32, show_progress_bar=False) as remote:
        texts = ["The cat sat.", "", "word " * 400]
        np.testing.assert_allclose(remote.encode_texts(texts), vllm_encoder.encode_texts(texts), atol=1e-5)
        got = evaluate(remote, get_tasks(tasks), show_progress_bar=False)
    ref = evaluate(vllm_encoder, get_tasks(tasks), show_progress_bar=False)
    deltas = {g.task: abs(g.main_score - r.main_score) for g, r in zip(got, ref)}
    print("remote vs in-process |delta|:", deltas)
    assert max(deltas.values()) <= 1e-4


def test_cli_remote_backend(vllm_server, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "vllm_eval.cli", "run", "--backend", "remote", "--endpoint", vllm_server,
                           "--tasks", "WordSim353", "--output-dir", str(tmp_path), "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WordSim353" in proc.stdout and (tmp_path / "summary.json").is_file()
    proc = subprocess.run([sys.executable, "-m", "vllm_eval.cli", "run", "--backend", "remote", "--tasks", "WordSim353"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "needs at least one --endpoint" in proc.stderr
