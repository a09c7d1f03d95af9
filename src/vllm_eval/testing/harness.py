"""Test harness: a real `vllm serve` on loopback, JSON stub servers, CLI runners, agreement helpers."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def serve_model(
    model: str | Path,
    *args: str,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
) -> Iterator[str]:
    """Run ``vllm serve`` (vLLM's OpenAI-compatible server) on ``model`` while the block runs.

    Started as ``python -m vllm.entrypoints.openai.api_server`` (the CPU wheel's ``vllm`` console
    script fails with PackageNotFoundError), with CPU-friendly defaults that ``args`` (server
    flags) can override: fp32, eager, 1 GiB KV reserve. Yields the base URL once ``/health``
    answers 200; the server is terminated (then killed) on exit.

    Raises:
        RuntimeError: the server exited, or was not healthy within ``timeout`` seconds (with the
            tail of its log).
    """
    import httpx

    if port is None:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    defaults = {"--dtype": "float32", "--enforce-eager": None, "--kv-cache-memory-bytes": str(1 << 30)}
    flags = [str(a) for a in args]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
    ]
    for name, value in defaults.items():
        if name not in flags:
            cmd += [name] + ([value] if value is not None else [])
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})}
    if "VLLM_CPU_OMP_THREADS_BIND" not in full_env:
        full_env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd + flags, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://{host}:{port}"

    def tail() -> str:
        log.seek(0)
        return log.read()[-3000:]

    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve {model} exited with code {proc.returncode}:\n{tail()}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve {model} not healthy after {timeout:.0f} s:\n{tail()}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def serve_models(*servers: str | Path | tuple, timeout: float = 300.0) -> Iterator[list[str]]:
    """Several :func:`serve_model` at once while the block runs: each of ``servers`` a model path, or a tuple of
    the model and its server flags. They start side by side (most of a start is one interpreter importing: two
    MiniLM servers were healthy after 35.0 s together against 24.7 s for one, on 2 cores); yields their base URLs in
    the order given; every server is stopped on exit.

    Raises:
        RuntimeError: a server exited or was not healthy within ``timeout`` seconds (the first such error; the
            servers that started are stopped).
    """
    from concurrent.futures import ThreadPoolExecutor

    with contextlib.ExitStack() as stack:
        specs = [s if isinstance(s, tuple) else (s,) for s in servers]
        managers = [serve_model(model, *flags, timeout=timeout) for model, *flags in specs]
        with ThreadPoolExecutor(max_workers=max(len(managers), 1)) as pool:
            entered = [pool.submit(m.__enter__) for m in managers]
        for manager, future in zip(managers, entered):  # stop every server that started, then raise
            if future.exception() is None:
                stack.push(manager.__exit__)
        urls = [future.result() for future in entered]
        yield urls


#: A test replica's KV cache in a Ray actor on the CPU: a quarter GiB instead of the CPU default's 2 GiB (two actors
#: beside a test session holding ~15 GB took the machine to 20 GB of CI's 24 GiB).
RAY_KV_BYTES = 256 * 1024**2


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 2, timeout: float = 90.0) -> Iterator[str]:
    """A one-node Ray cluster on loopback (``ray start --head --node-ip-address 127.0.0.1``, CPU only, a
    small object store, no dashboard, no usage stats) while the block runs; yields its ``HOST:PORT`` for
    ``--ray-address``. Stopped with ``ray stop --force`` on exit (which stops every Ray process of this user).

    Raises:
        RuntimeError: ``ray start`` failed or took longer than ``timeout`` seconds (with its output).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    start = [ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port)]
    start += [f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats"]
    start += ["--object-store-memory", str(256 * 1024**2)]
    try:
        done = subprocess.run(start, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"ray start exited with code {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ImportError):
            import ray as ray_module

            ray_module.shutdown()  # the driver's connection first, then the cluster
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=timeout)


class JsonStubHandler(BaseHTTPRequestHandler):
    """Base of the tests' scripted HTTP servers: no request log, JSON in and out."""

    def log_message(self, *args: object) -> None:
        pass

    def read_json(self) -> object:
        """The request body, parsed."""
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def send_json(self, code: int, body: object) -> None:
        """Reply ``body`` (JSON-encoded unless already bytes) with status ``code``."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@contextlib.contextmanager
def stub_server(handler: type[BaseHTTPRequestHandler], **attrs: object) -> Iterator[ThreadingHTTPServer]:
    """A threaded HTTP server on a free loopback port running ``handler``; ``attrs`` are set on the
    server (the handler reads them as ``self.server.<name>``). Its URL is ``url_of(server)``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attrs.items():
        setattr(srv, name, value)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def url_of(srv: ThreadingHTTPServer) -> str:
    """``http://127.0.0.1:<port>`` of a :func:`stub_server`."""
    return f"http://127.0.0.1:{srv.server_address[1]}"


def cli_command(*args: str) -> list[str]:
    """The argv that runs ``vllm-eval ARGS`` with this interpreter (``python -m vllm_eval.cli``).

    Not ``-m vllm_eval``: multiprocessing's spawn does not re-import a package's ``__main__`` in the
    engine processes, so the CLI's early-log silencing would not reach them (the console script and
    ``-m vllm_eval.cli`` are re-imported there).
    """
    return [sys.executable, "-m", "vllm_eval.cli", *args]


def offline_env() -> dict[str, str]:
    """This process's environment with the hub libraries in offline mode (tests never reach the hub)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``vllm-eval ARGS`` in a fresh process, offline; stdout and stderr captured as text."""
    return subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=timeout, env=offline_env())


def text_loader(texts: list, batch_size: int = 2):
    """The shape mteb hands to ``encode()``: a ``DataLoader`` of ``{"text": [...]}`` batches."""
    from torch.utils.data import DataLoader

    return DataLoader(
        [{"text": t} for t in texts], batch_size=batch_size, collate_fn=lambda b: {"text": [x["text"] for x in b]}
    )


def row_cosines(a, b):
    """Cosine similarity of each row of ``a`` with the same row of ``b``: float (n,) for (n, dim) inputs."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def score_deltas(model, reference, task_names: list[str]) -> dict[str, float]:
    """|main score of ``model`` - main score of ``reference``| per task, both run through mteb here."""
    from ..evaluation.results import evaluate
    from ..tasks import get_tasks

    got = evaluate(model, get_tasks(task_names), show_progress_bar=False)
    ref = evaluate(reference, get_tasks(task_names), show_progress_bar=False)
    return {g.task: abs(g.main_score - r.main_score) for g, r in zip(got, ref)}


def stalled_job(llm: Any, payload: Any) -> None:
    """A replica job that ends as a stalled engine does (:class:`~vllm_eval.engine.watchdog.EngineStalled`, what the
    watchdog raises in the process's main thread), for tests of a replica lost that way.

    Raises:
        EngineStalled: always.
    """
    from ..engine.watchdog import EngineStalled

    raise EngineStalled(f"the vLLM engine for {payload!r} made no progress (a test's stall)")


def thread_pools(model: object, task: object) -> list[tuple[str, str, int]]:
    """``(internal_api, library path, threads)`` of each BLAS and OpenMP pool of the process it runs in, once
    scikit-learn and SciPy are loaded as mteb loads them: a ``run`` for ``TaskProcesses.evaluate`` (``model`` and
    ``task`` unused), to check what a task process or Ray task actor scores with."""
    import scipy.linalg  # noqa: F401
    import sklearn.cluster  # noqa: F401
    from threadpoolctl import threadpool_info

    return [(pool["internal_api"], pool["filepath"], pool["num_threads"]) for pool in threadpool_info()]
