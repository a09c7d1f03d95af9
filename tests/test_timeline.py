"""Where a run's time goes (the timeline), task data loaded in the background, and benchmark replicas
shaped by mteb's descriptive statistics, scored by mteb with vLLM and with sentence-transformers."""

from __future__ import annotations

import json
import os
import time

import pytest

from vllm_eval.utils.timeline import MERGE_GAP_S, Timeline, phase_totals


def test_encode_calls_merge_and_scoring_is_the_rest_of_a_task():
    tl = Timeline()
    t0 = time.time()
    tl.add("engine", t0, t0 + 5, detail="m")
    tl.task = "A"
    tl.add("task", t0 + 5, t0 + 9, task="A")
    tl.encoded(t0 + 6, t0 + 7)
    tl.encoded(t0 + 7 + MERGE_GAP_S / 2, t0 + 8)  # close to the previous call: one interval
    tl.task = None
    out = tl.as_json()
    phases = [(p["phase"], p.get("task")) for p in out["phases"]]
    assert phases == [("engine", None), ("score", "A"), ("encode", "A"), ("score", "A")]
    encode = next(p for p in out["phases"] if p["phase"] == "encode")
    assert encode["end"] - encode["start"] == pytest.approx(2.0, abs=1e-3)
    totals = phase_totals(out)
    assert totals["score"] == pytest.approx(2.0, abs=0.01) and totals["engine"] == pytest.approx(5.0, abs=0.01)
    assert totals["wall"] == pytest.approx(9.0, abs=0.01)
    assert tl.as_json(since=t0 + 8.5)["phases"][-1]["phase"] == "score"  # only what ended after `since`
    assert phase_totals(None) == {}


def test_each_thread_has_its_own_task_and_waits_are_not_scoring():
    import threading

    tl = Timeline()
    t0 = time.time()
    tl.task = "A"
    seen = []
    worker = threading.Thread(target=lambda: (setattr(tl, "task", "B"), seen.append(tl.task)))
    worker.start()
    worker.join()
    assert seen == ["B"] and tl.task == "A"  # concurrent tasks each file their calls under their own name
    tl.add("task", t0, t0 + 4, task="A")
    tl.add("wait", t0 + 1, t0 + 2, task="A")
    tl.encoded(t0 + 2, t0 + 3)
    totals = phase_totals(tl.as_json())
    assert totals["score"] == pytest.approx(2.0, abs=0.01) and totals["wait"] == pytest.approx(1.0, abs=0.01)


def test_prefetch_loads_ahead_in_order_and_hands_back_a_failed_load():
    import sys

    from vllm_eval.evaluation.prefetch import Prefetch
    from vllm_eval.tasks import get_tasks

    sys.modules.pop("colorsys", None)
    first, second = get_tasks(["WordSim353", "SimLex999"])
    prefetch = Prefetch([first, second], ahead=1, imports=["colorsys", "no_such_module_here"])
    prefetch.wait(first)
    assert first.data_loaded
    assert "colorsys" in sys.modules  # imported ahead, before the first load; a failed import is skipped
    time.sleep(0.3)
    assert not second.data_loaded  # one task ahead at most: the second waits for the first to be done
    prefetch.done(first)
    assert not first.data_loaded  # unloaded once evaluated
    prefetch.wait(second)
    assert second.data_loaded
    prefetch.done(second)
    prefetch.close()

    (broken,) = get_tasks(["WordSim353"])
    broken.load_data = lambda **kwargs: (_ for _ in ()).throw(OSError("disk gone"))
    prefetch = Prefetch([broken])
    with pytest.raises(OSError, match="disk gone"):
        prefetch.wait(broken)
    prefetch.done(broken)
    prefetch.close()
    prefetch._thread.join(5)
    assert not prefetch._thread.is_alive()


def test_replica_has_the_benchmark_shape(replica):
    from vllm_eval.tasks.shaped import replica_tasks, stats_path

    manifest = json.loads((replica / "replica.json").read_text())
    assert len(manifest["tasks"]) == 40 and manifest["left_out"] == {
        "SummEvalSummarization.v2": "Summarization: no replica"
    }
    tasks = {t.metadata.name: t for t in replica_tasks(replica)}
    assert set(tasks) == set(manifest["tasks"])
    touche = tasks["Touche2020Retrieval.v3"]
    touche.load_data()
    split = touche.dataset["default"]["test"]
    stats = json.loads(stats_path(touche).read_text())["test"]
    assert len(split["corpus"]) == round(stats["num_documents"] * 0.002)
    lengths = [len(t) for t in split["corpus"]["text"]]
    doc = stats["documents_text_statistics"]
    # Word-sized steps: within a word of the bounds, mean within 10 % over ~600 documents.
    assert min(lengths) >= doc["min_text_length"] - 20 and max(lengths) <= doc["max_text_length"] + 20
    assert sum(lengths) / len(lengths) == pytest.approx(doc["average_text_length"], rel=0.1)
    for qid, relevant in split["relevant_docs"].items():
        query = split["queries"]["text"][int(qid[1:].split("_")[0])]
        first = split["corpus"]["text"][int(next(iter(relevant))[1:])]
        assert query.split()[0] in first.split() and qid.endswith("_0")
    massive = tasks["MassiveIntentClassification"]
    assert massive.hf_subsets == ["en"]  # the benchmark's subset only
    massive.load_data()
    train = massive.dataset["en"]["train"]
    assert min(train.to_pandas()["label"].value_counts()) >= massive.samples_per_label


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="34 s of CI's 30 minutes: tests/test_parity.py compares both backends' main scores on the offline "
    "suite in CI; VLLMEVAL_FULL_TESTS=1 runs it",
)
@pytest.mark.slow
def test_replica_scores_agree_with_sentence_transformers(replica, vllm_encoder, st_encoder, tmp_path, monkeypatch):
    """One task of each type, scored by mteb's own evaluators, the same within 1e-3 on both backends."""
    from vllm_eval.evaluation.results import evaluate
    from vllm_eval.tasks.shaped import replica_tasks

    names = [
        "ArguAna", "AskUbuntuDupQuestions", "STSBenchmark", "TwitterSemEval2015",
        "ToxicConversationsClassification", "StackExchangeClustering.v2",
    ]  # fmt: skip
    rows = {}
    for name, encoder in (("vllm", vllm_encoder), ("st", st_encoder)):
        tasks = [t for t in replica_tasks(replica) if t.metadata.name in names]
        rows[name] = evaluate(encoder, tasks, output_dir=tmp_path / name, show_progress_bar=False)
    assert [r.task for r in rows["vllm"]] == [r.task for r in rows["st"]] and len(rows["vllm"]) == len(names)
    for ours, theirs in zip(rows["vllm"], rows["st"], strict=True):
        assert abs(ours.main_score - theirs.main_score) < 1e-3, (ours, theirs)
    summary = json.loads((tmp_path / "vllm" / "summary.json").read_text())
    loads = {p["task"] for p in summary["timeline"]["phases"] if p["phase"] == "load"}
    encodes = {p["task"] for p in summary["timeline"]["phases"] if p["phase"] == "encode"}
    assert loads == encodes == set(names)

    # Three at once on the same engine, scored in processes, then on threads: the same scores and per-task counts
    # as one after another.
    from vllm_eval.utils.timeline import current

    for where in ("threads", "together"):
        current().reset()
        monkeypatch.setenv("VLLMEVAL_TASK_PROCESSES", "0" if where == "threads" else "1")
        tasks = [t for t in replica_tasks(replica) if t.metadata.name in names]
        together = evaluate(
            vllm_encoder, tasks, output_dir=tmp_path / where, show_progress_bar=False, concurrent_tasks=3
        )
        assert [r.task for r in together] == [r.task for r in rows["vllm"]]
        for alone, shared in zip(rows["vllm"], together, strict=True):
            assert shared.main_score == alone.main_score, (where, alone, shared)
            assert (shared.inputs, shared.distinct_inputs, shared.tokens) == (
                alone.inputs,
                alone.distinct_inputs,
                alone.tokens,
            )
    phases = json.loads((tmp_path / "together" / "summary.json").read_text())["timeline"]["phases"]
    assert {p["task"] for p in phases if p["phase"] == "load"} == set(names)  # each process loaded its task
    spans = {}
    for p in phases:
        if p.get("task"):
            start, end = spans.get(p["task"], (p["start"], p["end"]))
            spans[p["task"]] = (min(start, p["start"]), max(end, p["end"]))
    overlapping = sum(1 for a in spans.values() for b in spans.values() if a < b and a[1] > b[0])
    assert overlapping >= 1, spans  # tasks did run at once
    encodes = sorted((p["start"], p["end"]) for p in phases if p["phase"] == "encode")
    assert all(e1 <= s2 + 1e-3 for (_, e1), (s2, _) in zip(encodes, encodes[1:])), encodes  # one call at a time


def test_unknown_benchmark_suite_is_refused_before_any_model(cli_in_process):
    code, err = cli_in_process("bench", "--suite", "MTEB(eng, v3)")
    assert code == 2 and "'MTEB(eng, v3)'" in err and "MTEB(eng, v2)" in err
    code, err = cli_in_process("bench", "--suite", "MTEB(eng, v2)", "--fraction", "0")
    assert code == 2 and "--fraction" in err
