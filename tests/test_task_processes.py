"""Tasks scored in processes of their own (:mod:`vllm_eval.evaluation.task_processes`): a failure of the model is
raised as
itself, a process that dies is named, and nothing is left running. The scores against one-at-a-time evaluation on
a real engine are compared in tests/test_timeline.py, the run command's early start in tests/test_replicas.py."""

from __future__ import annotations

import copy
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest
from mteb.models.abs_encoder import AbsEncoder

from vllm_eval.evaluation.results import evaluate
from vllm_eval.evaluation.task_processes import SCORING_THREADS, TaskProcessError, TaskProcesses, wanted
from vllm_eval.testing import thread_pools
from vllm_eval.utils.errors import EngineError


class _Model(AbsEncoder):
    """The sentence-transformers encoder as the parent's model, with ``on_encode`` run before each encode call."""

    def __init__(self, inner, on_encode):
        self.inner, self.on_encode = inner, on_encode
        self.mteb_model_meta = inner.mteb_model_meta
        self.model = None  # AbsEncoder's similarity: the metadata's

    def encode(self, inputs, **kwargs):
        self.on_encode()
        return self.inner.encode(inputs, **kwargs)


def _task_processes():
    return [p for p in multiprocessing.active_children() if p.name.startswith("vllm-eval-tasks-")]


def _left_running(seconds: float = 5.0):
    """The task processes still running ``seconds`` after the run ended (killed ones are reaped at once)."""
    deadline = time.monotonic() + seconds
    while _task_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return _task_processes()


def _tasks():
    from vllm_eval.tasks import select_tasks

    return select_tasks(["WordSim353", "SimLex999"])


def test_processes_are_used_for_encoders_only_and_can_be_switched_off(monkeypatch, st_encoder, vllm_cross):
    assert wanted(2, st_encoder) and not wanted(1, st_encoder)
    assert not wanted(2, vllm_cross)  # a cross-encoder's predict is not forwarded: its tasks stay on threads
    assert not wanted(2, _own_similarity(st_encoder))  # a token embedder's MaxSim is not the stand-in's
    from vllm_eval.models.encoder.vllm import VllmEncoder
    from vllm_eval.models.token_embedder.vllm import VllmTokenEmbedder

    assert wanted(2, VllmEncoder) and not wanted(2, VllmTokenEmbedder)  # decided from the class, as `run` does
    monkeypatch.setenv("VLLMEVAL_TASK_PROCESSES", "0")
    assert not wanted(2, st_encoder)


def _own_similarity(encoder, calls=None):
    """``encoder`` with a pairwise similarity of its own (mteb's, counted in ``calls``)."""
    from mteb.models.abs_encoder import AbsEncoder

    def pairwise(self, a, b):
        (calls if calls is not None else []).append(len(a))
        return AbsEncoder.similarity_pairwise(self, a, b)

    own = copy.copy(encoder)
    own.__class__ = type("OwnSimilarity", (type(encoder),), {"similarity_pairwise": pairwise})
    return own


def test_processes_started_early_are_dropped_for_a_model_with_its_own_similarity(st_encoder):
    processes = TaskProcesses(2)  # as `run` starts them, before the model is known
    calls = []
    rows = evaluate(
        _own_similarity(st_encoder, calls), _tasks(), show_progress_bar=False, concurrent_tasks=2, processes=processes
    )
    assert _left_running() == []
    assert sorted(calls) == [353, 999]  # the model's own similarity scored both STS tasks, here
    alone = evaluate(st_encoder, _tasks(), show_progress_bar=False)
    assert [r.main_score for r in rows] == [r.main_score for r in alone]


def test_the_models_failure_is_raised_as_itself_and_no_process_is_left(st_encoder, tmp_path):
    def fail():
        raise EngineError("vLLM failed on input 3")

    with pytest.raises(EngineError, match="input 3"):
        evaluate(_Model(st_encoder, fail), _tasks(), output_dir=tmp_path, show_progress_bar=False, concurrent_tasks=2)
    assert _left_running() == []


def test_a_process_that_dies_is_named_with_its_task(st_encoder, tmp_path):
    processes = TaskProcesses(1)

    def kill():
        for proc in _task_processes():
            os.kill(proc.pid, signal.SIGKILL)

    try:
        with pytest.raises(TaskProcessError, match=r"evaluating (WordSim353|SimLex999) exited with code -9"):
            evaluate(
                _Model(st_encoder, kill), _tasks(), show_progress_bar=False, concurrent_tasks=2, processes=processes
            )
    finally:
        processes.close()
    assert _left_running() == []


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="38 s of CI's 30 minutes: a task process that dies is named with its task in CI (the test above);"
    " VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_after_a_process_dies_the_next_task_gets_a_fresh_one(st_encoder, tmp_path):
    """With --continue-on-error a long run goes on: the killed task fails, the next one runs in a new process."""
    killed = []

    def kill_once():
        if not killed:
            killed.extend(p.pid for p in _task_processes())
            os.kill(killed[0], signal.SIGKILL)

    processes = TaskProcesses(1)
    try:
        rows = evaluate(
            _Model(st_encoder, kill_once),
            _tasks(),
            show_progress_bar=False,
            processes=processes,  # one task at a time, in task order
            continue_on_error=True,
        )
    finally:
        processes.close()
    assert [r.status.split(":")[0] for r in rows] == ["failed", "computed"], rows
    assert "exited with code -9" in rows[0].status
    assert _left_running() == []


def test_scores_through_processes_equal_in_process_ones(st_encoder, tmp_path):
    alone = evaluate(st_encoder, _tasks(), show_progress_bar=False)
    together = evaluate(st_encoder, _tasks(), output_dir=tmp_path, show_progress_bar=False, concurrent_tasks=2)
    assert [(r.task, r.status) for r in together] == [(r.task, "computed") for r in alone]
    np.testing.assert_array_equal([r.main_score for r in together], [r.main_score for r in alone])
    assert [r.inputs for r in together] == [r.inputs for r in alone]


def test_a_task_with_candidates_is_ranked_in_its_process(st_encoder, replica, monkeypatch):
    """The candidates (2 million pairs for MindSmall at 2 % of its size) and the ranked lists stay in the task's
    process: the command's model is asked to encode the queries and the corpus, not to search; the scores are
    those of the search run here. The embeddings cross in shared memory (every array here: the size from which
    they do is set to 0), and no block is left behind."""
    from vllm_eval.evaluation import task_processes
    from vllm_eval.models.encoder.search import CorpusSearch
    from vllm_eval.tasks.shaped import replica_tasks

    searched = []

    class Searching(CorpusSearch, _Model):
        def search(self, queries, **kwargs):
            searched.append(len(queries))
            return super().search(queries, **kwargs)

    def task():
        return [t for t in replica_tasks(replica) if t.metadata.name == "AskUbuntuDupQuestions"]

    encodes = []
    model = Searching(st_encoder, lambda: encodes.append(1))
    here = evaluate(model, task(), show_progress_bar=False)
    assert len(searched) == 1 and len(encodes) == 2
    searched.clear(), encodes.clear()
    blocks = set(os.listdir("/dev/shm"))
    monkeypatch.setattr(task_processes, "SHARED_BYTES", 0)
    shared = []
    monkeypatch.setattr(task_processes, "shipped", lambda v, ship=task_processes.shipped: shared.append(1) or ship(v))
    processes = TaskProcesses(1)
    try:
        there = evaluate(model, task(), show_progress_bar=False, processes=processes)
    finally:
        processes.close()
    assert searched == [] and len(encodes) == 2  # queries, then the corpus; ranked in the process
    assert len(shared) == 2 and set(os.listdir("/dev/shm")) <= blocks
    assert [r.main_score for r in there] == [r.main_score for r in here]
    assert _left_running() == []


def test_own_data_tasks_stay_in_the_commands_process_with_the_same_scores(st_encoder, tmp_path):
    """A ``--data`` file's task is an object of a class made at run time, which does not pickle: it is evaluated
    on a thread here while other tasks go to the processes."""
    import json

    from vllm_eval.evaluation.task_processes import sendable
    from vllm_eval.tasks.owntasks import own_mteb_task

    words = ["cat", "dog", "car", "bus", "tree", "leaf", "sea", "lake"]
    paths = []
    for name, shift in (("first", 1), ("second", 3)):
        path = tmp_path / f"{name}.jsonl"
        rows = [{"sentence1": w, "sentence2": words[(i + shift) % 8], "score": float(i)} for i, w in enumerate(words)]
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        paths.append(path)

    def tasks():
        return [own_mteb_task(p) for p in paths] + _tasks()[:1]

    assert [sendable(t) for t in tasks()] == [False, False, True]
    alone = evaluate(st_encoder, tasks(), show_progress_bar=False)
    together = evaluate(st_encoder, tasks(), output_dir=tmp_path / "out", show_progress_bar=False, concurrent_tasks=2)
    assert [(r.task, r.status) for r in together] == [(r.task, "computed") for r in alone]
    np.testing.assert_array_equal([r.main_score for r in together], [r.main_score for r in alone])
    assert not _left_running()


def test_processes_keeping_task_data_load_it_once_score_as_fresh_tasks_and_on_one_thread():
    # A sweep's task processes keep each task's data for the next model (keep_data): the second and third
    # evaluations load nothing, and each scores as a fresh task does (mteb's clustering draws from the task's own
    # generator: a reused task object would not). Hashed vectors stand in for a model.
    from vllm_eval.tasks import select_tasks
    from vllm_eval.testing.instant import InstantEncoder
    from vllm_eval.utils import timeline

    encoder = InstantEncoder()
    alone = evaluate(encoder, select_tasks(["TwentyNewsgroupsMini"]), show_progress_bar=False)
    loads = lambda: sum(p.name == "load" for p in timeline.current().phases)  # noqa: E731
    before = loads()
    processes = TaskProcesses(1, keep_data=True)
    try:
        scores = [
            evaluate(encoder, select_tasks(["TwentyNewsgroupsMini"]), show_progress_bar=False, processes=processes,
                     keep_processes=True)[0].main_score
            for _ in range(3)
        ]  # fmt: skip
        # NumPy is loaded in a task process before its settings are (the module that runs it imports NumPy): its
        # BLAS must still have one thread, as scikit-learn's OpenMP and SciPy's BLAS do.
        pools = processes.evaluate(encoder, select_tasks(["TwentyNewsgroupsMini"])[0], thread_pools, ())
    finally:
        processes.close()
    assert scores == [alone[0].main_score] * 3
    assert loads() - before == 1
    assert {api for api, _, _ in pools} >= {"openblas", "openmp"}
    assert {threads for _, _, threads in pools} == {SCORING_THREADS}, pools
    assert _left_running() == []
