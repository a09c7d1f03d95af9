"""Replicas as Ray actors on a loopback cluster (CPU only): the same outputs and scores as one engine here,
an actor killed mid-run costs time, not results; refusals before any engine starts. Tasks scored in Ray actors
(``--ray-address`` with several tasks at once): the same scores as here, a lost actor named with its task."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from functools import partial

import numpy as np
import pytest

from vllm_eval.testing import RAY_KV_BYTES, ray_cluster, row_cosines, thread_pools
from vllm_eval.utils.errors import ReplicaError, UsageError

ray = pytest.importorskip("ray")

TASKS = ["WordSim353", "LeeDocSimilarity"]


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
    # Two tasks at once score in two actors of a CPU each, placed first: no core is left for the replica.
    code, err = cli_in_process("run", "--tasks", *TASKS, "--ray-address", cluster, "--concurrent-tasks", "2")
    assert code == 2 and "1 replicas need a CPU each; the Ray cluster has 2, 2 of them held by" in err, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def one_engine_rows(vllm_encoder):
    """The rows of :data:`TASKS` from one engine here, one task at a time: what the Ray runs must score."""
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks import get_tasks

    return evaluate(vllm_encoder, get_tasks(TASKS), show_progress_bar=False)


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="52 s of CI's 30 minutes: Ray actors run in CI as replicas (test_two_actors_score_as_one_engine, a killed"
    " actor); task processes are scored in CI in tests/test_task_processes.py; VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_tasks_scored_in_ray_actors_score_as_here(cluster, vllm_encoder, one_engine_rows, tmp_path):
    """Before the replicas' fixture, which holds every CPU of the cluster until the module ends."""
    from vllm_eval.evaluation.ray_tasks import RayTaskProcesses
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.evaluation.task_processes import TaskProcessError, start_for
    from vllm_eval.replicas.ray import _bundle, held_cpus
    from vllm_eval.tasks import get_tasks

    tasks = get_tasks(TASKS)
    processes = start_for(tasks, 2, type(vllm_encoder), start=partial(RayTaskProcesses, cluster))
    rows = evaluate(
        vllm_encoder, tasks, output_dir=tmp_path, show_progress_bar=False, concurrent_tasks=2, processes=processes
    )
    assert [(r.task, r.status) for r in rows] == [(t, "computed") for t in TASKS]
    assert [r.main_score for r in rows] == [r.main_score for r in one_engine_rows]
    print("\nscored in:", processes.ran)
    ran = {t: re.fullmatch(r"Ray actor (\d+) on node (\w+)", w) for t, w in processes.ran.items()}
    assert sorted(ran) == sorted(TASKS) and all(ran.values()), processes.ran
    assert len({m[1] for m in ran.values()}) == 2 and str(os.getpid()) not in {m[1] for m in ran.values()}
    assert {m[2] for m in ran.values()} == {n["NodeID"] for n in ray.nodes()}
    written = sorted(p.name for p in tmp_path.glob("results/**/*.json") if p.name != "model_meta.json")
    assert written == sorted(f"{t}.json" for t in TASKS)  # by the driver, from the actors' replies
    (settings,) = tmp_path.glob("results/**/run_settings.jsonl")  # mteb's file of every task, merged
    assert sorted(json.loads(line)["task"] for line in settings.read_text().splitlines()) == sorted(TASKS)

    lone = RayTaskProcesses(cluster, 1)
    # An actor's BLAS and OpenMP pools have its CPUs' threads (NumPy was loaded before it was told), as a task
    # process's have one.
    pools = lone.evaluate(vllm_encoder, get_tasks(TASKS[:1])[0], thread_pools, ())
    assert {api for api, _, _ in pools} >= {"openblas", "openmp"}
    assert {threads for _, _, threads in pools} == {1}, pools
    # On a CPU-only cluster the replicas share the cores the task actors (placed first) left them.
    with pytest.raises(UsageError, match=r"^2 replicas need a CPU each; the Ray cluster has 2, 1 of them held by"):
        _bundle(ray.cluster_resources(), ray.nodes(), 2, 1, 1, held_cpus(ray))
    assert _bundle(ray.cluster_resources(), ray.nodes(), 1, 1, 1, held_cpus(ray)) == {"CPU": 1}
    ray.kill(lone._workers[0].actor, no_restart=True)  # its node or process gone
    with pytest.raises(TaskProcessError, match=r"^the Ray actor evaluating WordSim353 was lost \(\w+Error: [^\n]+\)$"):
        evaluate(vllm_encoder, get_tasks(TASKS[:1]), show_progress_bar=False, processes=lone)


@pytest.fixture(scope="module")
def ray_encoder(cluster):
    from vllm_eval import VllmEncoder

    # Small chunks, so both actors get several jobs from short task data.
    enc = VllmEncoder(
        ray_address=cluster,
        data_parallel_size=2,
        chunk_size=40,
        kv_cache_memory_bytes=RAY_KV_BYTES,
        show_progress_bar=False,
    )
    yield enc
    enc.close()


def test_two_actors_score_as_one_engine(cluster, ray_encoder, one_engine_rows, tmp_path):
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks import get_tasks

    rows = evaluate(ray_encoder, get_tasks(TASKS), output_dir=tmp_path, show_progress_bar=False)
    deltas = {r.task: abs(r.main_score - ref.main_score) for r, ref in zip(rows, one_engine_rows, strict=True)}
    print("\nRay (2 actors) vs 1 engine |delta main score|:", deltas)
    assert sorted(deltas) == sorted(TASKS) and max(deltas.values()) <= 1e-4
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
