"""Tasks evaluated at once (:mod:`vllm_eval.evaluation.concurrency`): order, results by index, a failure that stops
the run
at once, each task's own scikit-learn model. The scores of concurrent against sequential evaluation on a real
engine are compared in tests/test_timeline.py (the benchmark replica)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from types import SimpleNamespace

import pytest

from vllm_eval.evaluation.concurrency import in_run_order, own_evaluator, run_tasks, task_workers
from vllm_eval.utils.errors import UsageError


def _task(name: str, size: int = 0, kind: str = "Retrieval", stats: dict | None = None, subsets=None):
    stats = stats or ({"test": {"num_samples": size}} if size else None)
    meta = SimpleNamespace(name=name, descriptive_stats=stats, eval_splits=["test"], type=kind)
    return SimpleNamespace(metadata=meta, hf_subsets=subsets)


def _display(name: str, position: int):
    return contextlib.nullcontext()


def test_tasks_run_at_once_largest_first_and_rows_keep_their_index():
    tasks = [_task("small", 10), _task("none"), _task("large", 1000), _task("mid", 100)]
    assert [t.metadata.name for t in in_run_order(tasks, 2)] == ["large", "mid", "small", "none"]
    assert in_run_order(tasks, 1) == tasks
    # Scoring first: a classification task's logistic regression on 50,000 training samples outweighs the
    # retrieval of 100,000 samples; a subset's own count counts, not the task's every language.
    per = {"hf_subset_descriptive_stats": {"en": {"num_samples": 500}, "de": {"num_samples": 10**6}}}
    lr = _task("lr", kind="Classification", stats={"test": {"num_samples": 10}, "train": {"num_samples": 50000}})
    one_language = _task("en-only", stats={"test": {"num_samples": 10**6, **per}}, subsets=["en"])
    order = in_run_order([_task("retrieval", 100000), lr, one_language], 2)
    assert [t.metadata.name for t in order] == ["lr", "retrieval", "en-only"]
    # A clustering task's k-means draws 10 x 16,384 points however few its samples: it does not start last.
    clustering = _task("clustering", 2048, kind="Clustering")
    clustering.n_clusters, clustering.max_documents_per_cluster = 10, 16_384
    order = in_run_order([_task("sts", 20000), _task("retrieval", 40000), clustering], 2)
    assert [t.metadata.name for t in order] == ["clustering", "retrieval", "sts"]
    started, rows, threads = [], {}, set()

    def run(task):
        started.append(task.metadata.name)
        threads.add(threading.current_thread().name)
        time.sleep(0.2)
        return task.metadata.name.upper()

    run_tasks(tasks, run, workers=2, display=_display, done=rows.__setitem__)
    assert rows == {0: "SMALL", 1: "NONE", 2: "LARGE", 3: "MID"}
    assert started[:2] == ["large", "mid"] and len(threads) == 2


def test_a_failing_task_stops_the_run_without_waiting_for_the_others():
    release = threading.Event()

    def run(task):
        if task.metadata.name == "bad":
            time.sleep(0.1)
            raise ValueError("broken task")
        release.wait(30)  # a long scoring still going on
        return 1

    start = time.perf_counter()
    with pytest.raises(ValueError, match="broken task"):
        run_tasks([_task("slow"), _task("bad"), _task("later")], run, workers=2, display=_display, done=lambda i, r: 0)
    assert time.perf_counter() - start < 5  # the slow task is not waited for
    release.set()


def test_each_task_gets_its_own_sklearn_model_and_workers_are_checked():
    from sklearn.linear_model import LogisticRegression

    class Classification:
        evaluator_model = LogisticRegression(max_iter=7)

    first, second = Classification(), Classification()
    own_evaluator(first)
    own_evaluator(second)
    assert first.evaluator_model is not second.evaluator_model is not Classification.evaluator_model
    assert first.evaluator_model.get_params() == Classification.evaluator_model.get_params()
    assert task_workers(8, 3) == 3 and task_workers(None, 100) >= 1
    with pytest.raises(UsageError, match="concurrent_tasks"):
        task_workers(0, 3)


@pytest.mark.parametrize(("cores", "workers"), [(2, 1), (4, 1), (6, 3), (16, 4), (64, 4)])
def test_default_task_processes_half_the_cores_at_most_four(monkeypatch, cores, workers):
    from vllm_eval.evaluation import concurrency

    monkeypatch.setattr(concurrency, "cores", lambda: cores)
    assert task_workers(None, 100) == workers
    assert task_workers(3, 100) == 3  # asked: as asked


@pytest.mark.parametrize(("cores", "workers"), [(2, 1), (4, 1), (6, 3), (16, 8), (64, 8)])
def test_a_sweep_of_small_models_takes_up_to_eight_task_processes(monkeypatch, cores, workers):
    from vllm_eval.evaluation import concurrency

    monkeypatch.setattr(concurrency, "cores", lambda: cores)
    assert task_workers(None, 100, sweep=True) == workers
    assert task_workers(None, 5, sweep=True) == min(workers, 5) and task_workers(2, 100, sweep=True) == 2


def test_only_a_sweep_of_small_models_is_given_more_task_processes(tmp_path):
    from vllm_eval.api.sweep import _small
    from vllm_eval.utils.modelinfo import ModelRef, packaged_model_path

    assert _small(ModelRef.resolve(packaged_model_path()))  # all-MiniLM-L6-v2: 22 M parameters
    big = tmp_path / "big"
    big.mkdir()
    config = {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 151669,
    }
    (big / "config.json").write_text(json.dumps(config))
    assert not _small(SimpleNamespace(path=str(big)))  # an 8B shape (its config.json alone)
    assert not _small(SimpleNamespace(path=str(tmp_path / "missing")))  # nothing to read: as a run


def test_task_processes_take_the_gpus_in_turn(monkeypatch):
    from vllm_eval.evaluation import task_processes

    launched = []

    class Recorded:
        def __init__(self, k, first, settings):
            launched.append(settings[-1])

    monkeypatch.setattr(task_processes, "_Process", Recorded)
    monkeypatch.setattr(task_processes, "scoring_gpus", lambda: ["2", "5"])
    task_processes.TaskProcesses(3)
    assert launched == ["2", "5", "2"]
    launched.clear()
    monkeypatch.setattr(task_processes, "scoring_gpus", lambda: [])
    task_processes.TaskProcesses(2)
    assert launched == [None, None]
    monkeypatch.undo()
    assert task_processes.scoring_gpus() == []  # the CPU build: none


def test_similarity_runs_eagerly_inside_the_blocks_and_as_mteb_after(monkeypatch):
    from mteb import similarity_functions

    from vllm_eval.evaluation.scoring import eager_similarity, fast_scoring

    monkeypatch.setattr(similarity_functions, "_use_torch_compile", lambda: True)  # as on an H100
    with eager_similarity():
        assert similarity_functions._use_torch_compile() is False
        with fast_scoring():
            assert similarity_functions._use_torch_compile() is False
        assert similarity_functions._use_torch_compile() is False  # the outer block still holds
    assert similarity_functions._use_torch_compile() is True


def test_overlapping_calls_share_a_backend_two_at_a_time_and_a_call_alone_waits_for_them():
    from vllm_eval.models.base import OVERLAPPING_CALLS, BackendBase
    from vllm_eval.utils.telemetry import task_counters

    backend = BackendBase(model="m", chunk_size=1)
    inside, most, seen = [0], [0], {}
    lock, go = threading.Lock(), threading.Barrier(4)

    def call(name: str, overlapping: bool, tokens: int) -> None:
        go.wait()
        if not overlapping:
            time.sleep(0.05)  # the overlapping calls are in first
        with task_counters() as own:
            with backend._one_call(overlapping=overlapping) as counters:
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    seen[name] = (overlapping, inside[0])
                counters.tokens += tokens
                time.sleep(0.2)
                with lock:
                    inside[0] -= 1
        seen[name + " counted"] = own.tokens

    threads = [threading.Thread(target=call, args=(f"o{i}", True, 10 + i)) for i in range(OVERLAPPING_CALLS + 1)] + [
        threading.Thread(target=call, args=("alone", False, 100))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == OVERLAPPING_CALLS  # never more at once
    assert seen["alone"] == (False, 1)  # it waited until no other call was in
    assert [seen[f"o{i} counted"] for i in range(OVERLAPPING_CALLS + 1)] == [10, 11, 12]  # each its own counts
    assert seen["alone counted"] == 100
    assert backend.counters.tokens == 133 and backend.counters.wait_seconds > 0
