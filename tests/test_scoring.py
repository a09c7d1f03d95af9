"""The fast scoring computes mteb's numbers: mteb's own functions and ours on the same inputs, every metric equal.

Property tests (hypothesis) cover the retrieval metrics (pytrec_eval's, MRR, the abstention metrics) on
small random rankings with ties, unjudged and negative judgements, scores that float32 cannot hold and empty
lists; ``max_over_subqueries`` on queries split into subqueries; and one task of every type of the
MTEB(eng, v2) replica runs through ``mteb.evaluate`` with mteb's scoring and with ours on the same vectors.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_eval.evaluation.scoring import SCORINGS, check_scoring, fast_scoring
from vllm_eval.evaluation.scoring.retrieval import calculate_retrieval_scores
from vllm_eval.evaluation.scoring.subqueries import max_over_subqueries
from vllm_eval.models.ranked import RankedLists, as_results, columnar
from vllm_eval.testing.instant import InstantSearchEncoder
from vllm_eval.utils.errors import UsageError

CHECKS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DOCS = ["a", "b", "c", "d_1", "d_2", "e", "f", "g"]


def equal(x, y, where=""):
    """Every value equal (NaN equals NaN), nested dicts walked; the first difference named."""
    if isinstance(x, dict) or hasattr(x, "keys"):
        assert set(x) == set(y), f"{where}: keys {sorted(set(x) ^ set(y))}"
        for key in x:
            equal(x[key], y[key], f"{where}.{key}")
        return
    if isinstance(x, float) and math.isnan(x):
        assert isinstance(y, float) and math.isnan(y), f"{where}: {x!r} != {y!r}"
        return
    assert x == y, f"{where}: {x!r} != {y!r}"


def same_result(mine, theirs):
    for field in theirs._fields:
        equal(getattr(theirs, field), getattr(mine, field), field)


def ranked(results):
    """``results`` as a RankedLists (documents numbered in order of appearance)."""
    ids: dict[str, int] = {}
    docs = [ids.setdefault(d, len(ids)) for r in results.values() for d in r]
    scores = [s for r in results.values() for s in r.values()]
    offsets = np.cumsum([0, *(len(r) for r in results.values())])
    return RankedLists(list(results), offsets, np.array(docs), np.array(scores, dtype=np.float64), list(ids))


score = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 0.5, 1.0, -0.25]),  # ties
    st.floats(-1, 1, width=32),
    st.floats(-1, 1),  # doubles float32 cannot hold: trec_eval ranks by the float32, mteb's MRR by the double
)


@st.composite
def judged_runs(draw, query_names=None):
    queries = query_names or draw(
        st.lists(st.sampled_from(["q1", "q2", "q3", "q4", "d_1"]), min_size=1, max_size=4, unique=True)
    )
    results, qrels = {}, {}
    for q in queries:
        results[q] = draw(st.dictionaries(st.sampled_from(DOCS), score, max_size=7))
        qrels[q] = draw(st.dictionaries(st.sampled_from([*DOCS, "x", "y"]), st.integers(-1, 3), max_size=5))
    return results, qrels


k_values = st.lists(st.sampled_from([1, 2, 3, 5, 10, 100]), min_size=1, max_size=4, unique=True).map(sorted)


@CHECKS
@given(judged_runs(), k_values, st.booleans())
def test_retrieval_scores_are_mtebs(runs, ks, skip_first):
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores as mtebs

    results, qrels = runs
    try:
        theirs = mtebs(results, qrels, ks, skip_first)
    except (ZeroDivisionError, IndexError, ValueError, KeyError) as exc:  # mteb's own failures: ours fails alike
        with pytest.raises(type(exc)):
            calculate_retrieval_scores(ranked(results), qrels, ks, skip_first)
        return
    same_result(calculate_retrieval_scores(results, qrels, ks, skip_first), theirs)
    same_result(calculate_retrieval_scores(ranked(results), qrels, ks, skip_first), theirs)


@CHECKS
@given(
    st.lists(
        st.sampled_from(["i1_0", "i1_1", "i1_2", "i2_0", "i2_1", "i3_x_0", "i4"]), min_size=1, unique=True
    ).flatmap(judged_runs),
    k_values,
)
def test_max_over_subqueries_is_mtebs(runs, ks):
    from mteb._evaluators.retrieval_metrics import max_over_subqueries as mtebs

    results, qrels = runs
    results = {q: results[q] for q in reversed(list(results))}  # results need not follow the qrels' order
    try:
        theirs = mtebs(qrels, results, ks)
    except (ZeroDivisionError, IndexError, ValueError, KeyError) as exc:
        with pytest.raises(type(exc)):
            max_over_subqueries(qrels, ranked(results), ks)
        return
    equal(max_over_subqueries(qrels, results, ks), theirs)
    equal(max_over_subqueries(qrels, ranked(results), ks), theirs)


def test_a_query_without_qrels_fails_as_in_mteb():
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores as mtebs

    results, qrels = {"q1": {"a": 1.0}, "q2": {"b": 0.5}}, {"q1": {"a": 1}}
    for scorer in (mtebs, calculate_retrieval_scores):
        with pytest.raises(KeyError):
            scorer(results, qrels, [1])


def test_identical_ids_are_dropped_as_mteb_drops_them():
    from mteb._evaluators.retrieval_evaluator import RetrievalEvaluator

    results = {"a": {"a": 0.9, "b": 0.5, "c": 0.1}, "b": {"b": 0.8, "c": 0.7}}
    qrels = {"a": {"c": 1}, "b": {"c": 2}}
    theirs = RetrievalEvaluator.evaluate(None, qrels, {q: dict(r) for q, r in results.items()}, [1, 3], True)
    mine = ranked(results)
    with fast_scoring():
        same_result(RetrievalEvaluator.evaluate(None, qrels, mine, [1, 3], True), theirs)
    assert mine["a"] == {"b": 0.5, "c": 0.1}  # dropped in place, as mteb pops them


def test_ranked_lists_read_as_mtebs_dicts():
    results = {"q1": {"b": 0.5, "a": 0.25}, "q2": {}, "q3": {"a": 1.0}}
    lists = ranked(results)
    assert dict(lists) == results == lists.to_dict()
    assert "q2" in lists and "q9" not in lists and len(lists) == 3
    import pickle

    assert pickle.loads(pickle.dumps(lists)).to_dict() == results
    assert as_results(lists) == results and type(as_results(lists)) is dict
    with columnar():
        assert as_results(lists) is lists


def test_scoring_is_restored_after_the_block():
    from mteb._evaluators import retrieval_evaluator

    mtebs = retrieval_evaluator.calculate_retrieval_scores
    with fast_scoring():
        with fast_scoring():
            assert retrieval_evaluator.calculate_retrieval_scores is calculate_retrieval_scores
        assert retrieval_evaluator.calculate_retrieval_scores is calculate_retrieval_scores
    assert retrieval_evaluator.calculate_retrieval_scores is mtebs
    with fast_scoring(False):
        assert retrieval_evaluator.calculate_retrieval_scores is mtebs
    assert check_scoring("mteb") == "mteb" and SCORINGS == ("fast", "mteb")
    with pytest.raises(UsageError, match="--scoring must be one of fast, mteb, got 'quick'"):
        check_scoring("quick")


#: The quickest task of each type in the replica (a binary classification: its scores include average precision).
ONE_OF_EACH = {
    "Retrieval": "ArguAna", "Reranking": "MindSmallReranking", "Classification": "ToxicConversationsClassification",
    "Clustering": "TwentyNewsgroupsClustering.v2", "STS": "BIOSSES", "PairClassification": "SprintDuplicateQuestions",
}  # fmt: skip


def test_every_task_type_scores_as_mteb_on_the_same_vectors(replica):
    """One task per type of the replica through mteb.evaluate, mteb's scoring against ours, with this package's
    search in both: every reported metric equal."""
    import mteb

    from vllm_eval.tasks.shaped import replica_tasks

    names = [*ONE_OF_EACH.values(), "AskUbuntuDupQuestions"]
    assert {t.metadata.name: t.metadata.type for t in replica_tasks(replica) if t.metadata.name in names} == {
        **{name: kind for kind, name in ONE_OF_EACH.items()},
        "AskUbuntuDupQuestions": "Reranking",
    }
    scores = {}
    for scoring in SCORINGS:
        tasks = [t for t in replica_tasks(replica) if t.metadata.name in names]
        with fast_scoring(scoring == "fast"):
            result = mteb.evaluate(InstantSearchEncoder(64), tasks, cache=None, co2_tracker=False,
                                   show_progress_bar=False, encode_kwargs={"show_progress_bar": False})  # fmt: skip
        scores[scoring] = {r.task_name: r.scores for r in result.task_results}
    assert set(scores["fast"]) == set(names)
    equal(scores["fast"], scores["mteb"])


def test_queries_without_positives_are_dropped_as_mteb_drops_them():
    from datasets import Dataset
    from mteb.abstasks.retrieval import _filter_queries_without_positives as mtebs

    from vllm_eval.evaluation.scoring import _filter_queries_without_positives as ours

    queries = Dataset.from_dict({"id": ["q1", "q2", "q3", "q4"], "text": ["a", "b", "c", "d"]})
    for qrels in ({"q1": {"a": 1}, "q2": {}, "q4": {"b": 0}}, {q: {"a": 1} for q in ("q1", "q2", "q3", "q4")}):
        (their_qrels, their_queries), (my_qrels, my_queries) = mtebs(qrels, queries), ours(qrels, queries)
        assert my_qrels == their_qrels and my_queries.to_dict() == their_queries.to_dict()


def test_queries_judged_on_nothing_reach_mtebs_own_function_while_ours_is_installed():
    """The fallback for queries with empty qrels calls mteb's function even while fast_scoring has put ours in its
    place (it did not: it looked mteb's up at call time and found ours)."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores as mtebs

    results, qrels = {"q1": {"a": 0.5}, "q2": {"b": 0.5}}, {"q1": {}, "q2": {"b": 1}}
    with pytest.raises(Exception) as theirs:
        mtebs(results, qrels, [1])
    with fast_scoring(), pytest.raises(type(theirs.value)):
        calculate_retrieval_scores(ranked(results), qrels, [1])


def test_merged_subqueries_computed_ahead_in_a_child_are_the_same_scores(replica, monkeypatch):
    """MindSmallReranking's second scoring step begun in a forked child at the first: the same scores as computed in
    this process, and the child's answer is the one used."""
    import mteb

    from vllm_eval.evaluation.scoring import subqueries
    from vllm_eval.tasks.shaped import replica_tasks
    from vllm_eval.utils import forked as ahead

    taken, take = [], ahead.take

    def counted(*args):
        found, value = take(*args)
        if args[0] is subqueries._max_over_subqueries:  # not the ranges of the per-query measures
            taken.append(found)
        return found, value

    monkeypatch.setattr(ahead, "take", counted)
    scores = {}
    for at_least in (10**9, 0):  # never ahead, then always
        monkeypatch.setattr(ahead, "MIN_ITEMS", at_least)
        tasks = [t for t in replica_tasks(replica) if t.metadata.name == "MindSmallReranking"]
        with fast_scoring():
            result = mteb.evaluate(InstantSearchEncoder(64), tasks, cache=None, co2_tracker=False,
                                   show_progress_bar=False, encode_kwargs={"show_progress_bar": False})  # fmt: skip
        scores[at_least] = result.task_results[0].scores
    assert taken == [False, True]
    equal(scores[0]["test"][0], scores[10**9]["test"][0])  # NaN where NaN (mteb's nAUC of a constant recall)
    assert any("max_over_subqueries" in name for name in scores[0]["test"][0])


def _square(x):
    return {"square": x * x}


def _fails(x):
    raise ValueError(f"bad {x}")


def _slow_in_a_child(parent: int) -> str:
    if os.getpid() != parent:
        time.sleep(30)
    return "here"


def test_a_step_computed_ahead_is_taken_once_and_computed_here_when_the_child_fails(monkeypatch):
    from vllm_eval.utils import forked as ahead

    value = 7
    assert ahead.take(_square, value) == (False, None)  # nothing begun
    assert ahead.start(_square, value)
    assert ahead.take(_square, value) == (True, {"square": 49})
    assert ahead.take(_square, value) == (False, None)  # taken once
    assert ahead.start(_fails, value)
    with pytest.raises(ValueError, match="bad 7"):  # the child's failure: computed here, raised here
        ahead.take(_fails, value)
    monkeypatch.setattr(ahead, "GRACE_S", 0.5)  # a child that does not answer in time is given up
    parent = os.getpid()
    started = time.monotonic()
    assert ahead.start(_slow_in_a_child, parent)
    assert ahead.take(_slow_in_a_child, parent) == (True, "here")
    assert time.monotonic() - started < 10
    assert ahead.start(_square, value)
    ahead.drop()  # a task that failed before asking: its child ends
    assert ahead.take(_square, value) == (False, None)


def test_per_query_measures_in_ranges_of_forked_children_are_the_whole_ones(monkeypatch):
    """Many queries: their measures computed in ranges, all but the first in forked children, give mteb's result;
    a query without qrels fails as in mteb, whichever range holds it."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores as mtebs

    from vllm_eval.evaluation.scoring import retrieval

    rng = np.random.default_rng(5)
    results, qrels = {}, {}
    for i in range(60):
        docs = rng.choice(DOCS, size=int(rng.integers(0, len(DOCS))), replace=False)
        values = rng.choice([0.5, 0.25, float(rng.random()), float(np.float32(rng.random())) + 1e-12], size=len(docs))
        results[f"q{i}"] = dict(zip(docs.tolist(), values.tolist(), strict=True))
        judged = rng.choice([*DOCS, "x"], size=int(rng.integers(1, 4)), replace=False)
        qrels[f"q{i}"] = {d: int(rng.integers(-1, 3)) for d in judged.tolist()}
    ks = [1, 3, 10]
    theirs = mtebs(results, qrels, ks)
    from vllm_eval.utils import forked as ahead

    monkeypatch.setattr(ahead, "MIN_ITEMS", 1)
    monkeypatch.setattr(retrieval, "worker_threads", lambda: 4)

    taken, take = [], ahead.take
    monkeypatch.setattr(ahead, "take", lambda *args: taken.append(take(*args)) or taken[-1])
    same_result(calculate_retrieval_scores(ranked(results), qrels, ks), theirs)
    assert [found for found, _ in taken] == [True, True, True]  # three ranges answered by children
    same_result(calculate_retrieval_scores(results, qrels, ks), theirs)
    del qrels["q50"]  # in the last range: its child fails, the range computed here fails as mteb's function does
    with pytest.raises(KeyError):
        mtebs(results, qrels, ks)
    with pytest.raises(KeyError):
        calculate_retrieval_scores(ranked(results), qrels, ks)
