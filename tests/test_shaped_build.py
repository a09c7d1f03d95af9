"""Building a benchmark replica (:func:`vllm_eval.tasks.shaped.build_replica`): the same files whatever the number of
worker processes, reused when asked again, and a build cut short built again rather than read. Made-up words stand in
for a tokenizer's; four small tasks at a tiny fraction, so each build takes a fraction of a second."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _fuzz import made_up_words
from vllm_eval.utils.errors import UsageError

TASKS = ["STSBenchmark", "ArguAna", "AskUbuntuDupQuestions", "ImdbClassification"]


@pytest.fixture
def build(monkeypatch):
    from vllm_eval.tasks import shaped

    monkeypatch.setattr(shaped, "_words", lambda path: made_up_words())

    def run(out: Path, workers: int = 1, seed: int = 0) -> Path:
        benchmark = "MTEB(eng, v2)"
        return shaped.build_replica(out, benchmark, "words", fraction=0.002, seed=seed, workers=workers, tasks=TASKS)

    return run


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_workers_do_not_change_the_files(build, tmp_path):
    import json

    one, two = _files(build(tmp_path / "one", workers=1)), _files(build(tmp_path / "two", workers=2))
    assert one == two
    assert "ArguAna/default.test/corpus.jsonl" in one and "AskUbuntuDupQuestions/default.test/top_ranked.npy" in one
    assert not [name for name in one if ".tmp-" in name]
    manifest = json.loads(one["replica.json"])
    assert sorted(manifest["tasks"]) == sorted(TASKS) and manifest["only"] == sorted(TASKS)
    assert one != _files(build(tmp_path / "other", seed=1))


def test_a_build_cut_short_is_built_again_not_read(build, tmp_path, monkeypatch):
    from vllm_eval.tasks import shaped

    out = build(tmp_path / "replica")
    whole = _files(out)
    corpus = out / "ArguAna" / "default.test" / "corpus.jsonl"
    stamp = corpus.stat().st_mtime_ns
    build(out)  # the same replica asked for again: reused
    assert corpus.stat().st_mtime_ns == stamp
    # Cut short while writing: a file half written under its temporary name, no manifest.
    (out / "replica.json").unlink()
    (corpus.parent / ".corpus.jsonl.tmp-99").write_text('{"id":"d0","te')
    corpus.write_text(corpus.read_text()[:50])
    with pytest.raises(UsageError, match="no replica.json"):
        shaped.replica_tasks(out)
    assert _files(build(out)) == whole
    # Cut short by a failure in the second task, building another seed over it: the old manifest is gone first.
    calls = []
    real = shaped.write_split

    def failing(*args):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(shaped, "write_split", failing)
    with pytest.raises(KeyboardInterrupt):
        build(out, seed=1)
    assert not shaped.is_replica(out)
    monkeypatch.setattr(shaped, "write_split", real)
    assert _files(build(out)) == whole


def test_distinct_draws_keep_the_fixed_values_first():
    from vllm_eval.tasks.replica_data import distinct

    rng = np.random.default_rng(0)
    sizes = np.array([5, 40, 1, 50, 3])
    fixed_sizes = np.array([2, 1, 1, 0, 3])
    fixed = np.array([7, 8, 3, 0, 1, 2, 4])
    out = distinct(rng, 50, sizes, fixed, fixed_sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    taken = 0
    for start, size, k in zip(starts, sizes, fixed_sizes, strict=True):
        segment = out[start : start + size]
        assert len(set(segment.tolist())) == size and segment.min() >= 0 and segment.max() < 50
        assert segment[:k].tolist() == fixed[taken : taken + k].tolist()
        taken += k


def test_tasks_asked_for_must_be_the_benchmarks_and_have_a_replica(tmp_path):
    from vllm_eval.tasks.shaped import build_replica

    with pytest.raises(UsageError, match=r"MTEB\(eng, v2\): no task 'STSBenchmrk'"):
        build_replica(tmp_path, "MTEB(eng, v2)", "words", fraction=0.002, tasks=["STSBenchmark", "STSBenchmrk"])
    with pytest.raises(UsageError, match=r"none of its tasks asked for has a replica"):
        build_replica(tmp_path, "MTEB(eng, v2)", "words", fraction=0.002, tasks=["SummEvalSummarization.v2"])
