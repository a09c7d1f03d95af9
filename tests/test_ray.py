"""Replicas as Ray actors on a loopback cluster (CPU only): the same outputs and scores as one engine here,
an actor killed mid-run costs time, not results; refusals before any engine starts."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest

from vllm_eval.testing import ray_cluster, row_cosines
from vllm_eval.utils.errors import ReplicaError, UsageError

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(num_cpus=2) as address:
        yield address


def test_without_ray_or_a_cluster_the_option_is_one_line(monkeypatch):
    from vllm_eval.replicas.ray import connect

    with pytest.raises(UsageError, match=r"--ray-address 'x:y': expected auto, HOST:PORT"):
        connect("x:y")
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"--ray-address '127.0.0.1:1': nothing answers there"):
        connect("127.0.0.1:1")
    assert time.monotonic() - started < 10
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UsageError, match=r"needs Ray: pip install 'vllm-eval\[ray\]'"):
        connect("auto")


def test_a_cluster_too_small_is_refused_before_any_engine(cluster, cli_in_process):
    code, err = cli_in_process("run", "--tasks", "WordSim353", "--ray-address", cluster, "--data-parallel-size", "3")
    assert code == 2 and "3 replicas need a CPU each; the Ray cluster has 2" in err, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def ray_encoder(cluster):
    from vllm_eval import VllmEncoder

    # Small chunks, so both actors get several jobs from short task data.
    enc = VllmEncoder(ray_address=cluster, data_parallel_size=2, chunk_size=40, show_progress_bar=False)
    yield enc
    enc.close()


def test_two_actors_score_as_one_engine(cluster, ray_encoder, vllm_encoder, tmp_path):
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks import get_tasks

    tasks = ["WordSim353", "LeeDocSimilarity"]
    rows = evaluate(ray_encoder, get_tasks(tasks), output_dir=tmp_path, show_progress_bar=False)
    reference = evaluate(vllm_encoder, get_tasks(tasks), show_progress_bar=False)
    deltas = {r.task: abs(r.main_score - ref.main_score) for r, ref in zip(rows, reference, strict=True)}
    print("\nRay (2 actors) vs 1 engine |delta main score|:", deltas)
    assert sorted(deltas) == sorted(tasks) and max(deltas.values()) <= 1e-4
    summary = json.loads((tmp_path / "summary.json").read_text())
    replicas = summary["replicas"]
    assert replicas["where"] == f"ray {cluster}" and sorted(replicas["ready_seconds"]) == ["0", "1"]
    assert all(n > 0 for n in replicas["jobs_done"].values()) and replicas["lost"] == {}
    assert 0 < max(replicas["ready_seconds"].values()) <= ray_encoder.pool.start_seconds


def test_an_actor_killed_mid_run_costs_time_not_results(ray_encoder, vllm_encoder):
    # Last test using the fixture: it kills its actors.
    enc = ray_encoder
    pool = enc.pool
    victim = pool._actors[1]
    done_before = sum(pool.jobs_done.values())

    def kill_after_first_jobs() -> None:
        deadline = time.monotonic() + 120
        while sum(pool.jobs_done.values()) < done_before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        ray.kill(victim, no_restart=True)

    killer = threading.Thread(target=kill_after_first_jobs, daemon=True)
    texts = [f"sentence number {i} about {w}" for i, w in enumerate(["cats", "rivers", "engines"] * 200)]
    killer.start()
    with pytest.warns(RuntimeWarning, match=r"replica 1 \(Ray actor on node \w+\) was lost"):
        got = enc.encode_texts(texts)
    killer.join(10)
    state = pool.state()
    print(f"\nactor killed mid-run: jobs {state.jobs_done}, redone {state.redone}, lost {state.lost}")
    assert list(state.lost) == [1] and state.redone >= 1
    cos = row_cosines(got, vllm_encoder.encode_texts(texts))
    assert got.shape == (600, 384) and cos.min() >= 0.99999
    # The survivor carries on; with none left, the error says so.
    np.testing.assert_allclose(enc.encode_texts(texts[:5]), got[:5], atol=1e-6)
    ray.kill(pool._actors[0], no_restart=True)
    with pytest.warns(RuntimeWarning), pytest.raises(ReplicaError, match="every replica has been lost"):
        enc.encode_texts([f"new text {i}" for i in range(50)])
