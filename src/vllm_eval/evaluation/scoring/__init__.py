"""Scoring as fast as the engine, with mteb's numbers: ``scoring="fast"`` (the default) or ``"mteb"``.

mteb evaluates a task by encoding its inputs and then scoring them on the CPU; for the tasks with the most
queries the scoring, not the model, is what a run waits for (MindSmallReranking: pytrec_eval, MRR and the
abstention metrics one query at a time). Under :func:`fast_scoring` a few of mteb's functions are replaced,
while mteb evaluates as always, by versions that compute the same numbers on arrays:

* retrieval and reranking metrics: :func:`.retrieval.calculate_retrieval_scores`, fed by searches that return
  :class:`~vllm_eval.models.ranked.RankedLists` instead of a dict per query;
* MindSmallReranking's ``max_over_subqueries``: :func:`.subqueries.max_over_subqueries`;
* classification: mteb's own logistic regression and metrics, given each split's labels as one list (a
  ``datasets`` column read row by row took most of ImdbClassification's scoring); likewise the query ids that
  mteb reads to drop queries without relevant documents.

Every other algorithm stays mteb's (clustering, STS, pair classification, summarization). ``tests/test_scoring.py``
runs mteb's functions and these on the same inputs and asserts the same metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The scoring paths: ours, or mteb's own functions unchanged.
SCORINGS = ("fast", "mteb")


class _Patches:
    """Replacements of module attributes (``make()``: (owner, attribute, replacement) triples) held while any
    thread is inside :meth:`applied`, restored when the last one leaves."""

    def __init__(self, make: Any) -> None:
        self._make, self._lock, self._users = make, threading.Lock(), 0
        self._saved: list[tuple[Any, str, Any]] = []

    @contextmanager
    def applied(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                patches = self._make()
                self._saved[:] = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
                for owner, name, new in patches:
                    setattr(owner, name, new)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    for owner, name, old in self._saved:
                        setattr(owner, name, old)
                    self._saved.clear()


def _retrieval_evaluate(
    self: Any, qrels: Any, results: Any, k_values: Any, ignore_identical_ids: bool = False,
    skip_first_result: bool = False,
) -> Any:  # fmt: skip
    """``RetrievalEvaluator.evaluate`` with :func:`.retrieval.calculate_retrieval_scores`; identical ids are
    dropped in place, as mteb pops them."""
    from ...models.ranked import RankedLists
    from ...utils.forked import worth_forking
    from . import subqueries, units
    from .retrieval import calculate_retrieval_scores

    if ignore_identical_ids:
        if isinstance(results, RankedLists):
            results.drop_identical_ids()
        else:
            for qid, rels in results.items():
                rels.pop(qid, None)
    if _merges_subqueries(self) and worth_forking(len(results)):
        subqueries.start_ahead(qrels, results, k_values)  # mteb's task_specific_scores asks for it next
    scores = calculate_retrieval_scores(results, qrels, list(k_values), skip_first_result)
    units.record_retrieval(scores)
    return scores


def _merges_subqueries(evaluator: Any) -> bool:
    """Whether the task ``evaluator`` (mteb's ``RetrievalEvaluator``) scores goes on to ``max_over_subqueries``
    (mteb's ``task_specific_scores`` of MindSmallReranking, the only task that overrides it so)."""
    from mteb.tasks.reranking.eng.mind_small_reranking import MindSmallReranking

    metadata = getattr(evaluator, "task_metadata", None)
    return getattr(metadata, "name", None) == MindSmallReranking.metadata.name


def _filter_queries_without_positives(relevant_docs: Any, queries: Any) -> tuple[Any, Any]:
    """mteb's ``_filter_queries_without_positives`` (the same qrels and queries), the query ids read at once: mteb
    iterates ``datasets``' lazy column row by row (2.4 million rows for MindSmallReranking)."""
    kept = {qid: docs for qid, docs in relevant_docs.items() if len(docs) != 0}
    ids = queries["id"][:]
    indices = [i for i, qid in enumerate(ids) if qid in kept]
    return kept, queries if len(indices) == len(ids) else queries.select(indices)


class _Labels:
    """A split whose columns are read at once: ``split[name]`` is a list, not ``datasets``' lazy column."""

    def __init__(self, split: Any) -> None:
        self._split = split

    def __getitem__(self, key: Any) -> Any:
        value = self._split[key]
        return value[:] if isinstance(key, str) else value

    def __len__(self) -> int:
        return len(self._split)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._split, name)


def _no_compile() -> bool:
    """mteb's ``_use_torch_compile``, always False: on a GPU of compute capability 7.0, 8.0 or 9.0 mteb compiles
    its similarity with torch.compile in every process that scores (tens of seconds of a full-size
    MindSmallReranking's profile on an H200 were inductor's), and beside an engine that holds most of the GPU the
    compiler's own allocations failed (``BackendCompilerFailed ... CUBLAS_STATUS_ALLOC_FAILED``). The same
    normalise-and-multiply runs eagerly: scores may differ from compiled ones in the last float bit, as mteb's
    own do between a GPU and the CPU."""
    return False


def _patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) of every mteb function replaced under :func:`fast_scoring`."""
    from mteb._evaluators import retrieval_evaluator, retrieval_metrics
    from mteb.abstasks import retrieval as retrieval_task
    from mteb.abstasks.abstask import AbsTask
    from mteb.abstasks.classification import AbsTaskClassification
    from mteb.tasks.reranking.eng import mind_small_reranking

    from ...models.ranked import RankedLists
    from . import retrieval, subqueries

    run_experiment = AbsTaskClassification._run_experiment
    save = AbsTask._save_task_predictions
    recorded = _recording_patches()

    def _run_experiment(self: Any, train_split: Any, eval_split: Any, *args: Any, **kwargs: Any) -> Any:
        return run_experiment(self, _Labels(train_split), _Labels(eval_split), *args, **kwargs)

    def _save_task_predictions(self: Any, predictions: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(predictions, RankedLists):
            predictions = predictions.to_dict()
        return save(self, predictions, *args, **kwargs)

    return [
        # the module's own name too: an evaluator subclass of mteb's may call it without RetrievalEvaluator.evaluate
        (retrieval_evaluator, "calculate_retrieval_scores", retrieval.calculate_retrieval_scores),
        (retrieval_evaluator.RetrievalEvaluator, "evaluate", _retrieval_evaluate),
        (retrieval_metrics, "calculate_retrieval_scores", retrieval.calculate_retrieval_scores),
        (retrieval_metrics, "max_over_subqueries", subqueries.max_over_subqueries),
        (mind_small_reranking, "max_over_subqueries", subqueries.max_over_subqueries),
        (retrieval_task, "_filter_queries_without_positives", _filter_queries_without_positives),
        (AbsTaskClassification, "_run_experiment", _run_experiment),
        (AbsTask, "_save_task_predictions", _save_task_predictions),
        *recorded,
    ]


def _recording_patches() -> list[tuple[Any, str, Any]]:
    """mteb's STS, pair-classification and classification metrics, unchanged, with their inputs recorded as the
    task's per-unit scores (:mod:`.units`) where a task is being recorded."""
    from mteb.abstasks.classification import AbsTaskClassification
    from mteb.abstasks.pair_classification import AbsTaskPairClassification
    from mteb.abstasks.sts import AbsTaskSTS

    from . import units

    sts, pairs, classification = (
        AbsTaskSTS._calculate_scores,
        AbsTaskPairClassification._compute_metrics,
        AbsTaskClassification._calculate_scores,
    )

    def sts_scores(self: Any, scores: Any, normalized_scores: Any) -> Any:
        units.record_sts(scores, normalized_scores)
        return sts(self, scores, normalized_scores)

    def pair_metrics(self: Any, similarity_scores: Any, labels: Any) -> Any:
        units.record_pairs(similarity_scores, labels)
        return pairs(self, similarity_scores, labels)

    def classification_scores(self: Any, y_test: Any, y_pred: Any) -> Any:
        units.record_classification(y_test, y_pred)
        return classification(self, y_test, y_pred)

    return [
        (AbsTaskSTS, "_calculate_scores", sts_scores),
        (AbsTaskPairClassification, "_compute_metrics", pair_metrics),
        (AbsTaskClassification, "_calculate_scores", classification_scores),
    ]


def _eager_patches() -> list[tuple[Any, str, Any]]:
    from mteb import similarity_functions

    return [(similarity_functions, "_use_torch_compile", _no_compile)]


_fast = _Patches(_patches)
_eager = _Patches(_eager_patches)


@contextmanager
def eager_similarity() -> Iterator[None]:
    """Within this block (process-wide, while any thread is inside) mteb's similarity functions run eagerly
    (:func:`_no_compile`): the command's process scoring searches for its task processes compiled mteb's
    ``cos_sim`` with torch.compile on an H100 (383 of 3,871 py-spy samples of its busiest whole-benchmark run)."""
    with _eager.applied():
        yield


@contextmanager
def fast_scoring(enabled: bool = True) -> Iterator[None]:
    """Within this block mteb scores with this package's functions (see the module doc; mteb's similarity runs
    eagerly, :func:`eager_similarity`) and searches on this thread return
    :class:`~vllm_eval.models.ranked.RankedLists`; ``enabled=False`` changes nothing (mteb's own scoring). The
    functions are replaced process-wide while any thread is inside a block, and restored when the last one
    leaves."""
    from ...models.ranked import columnar

    if not enabled:
        with columnar(False):
            yield
        return
    from ...utils import forked as ahead

    try:
        with _fast.applied(), _eager.applied(), columnar(True):
            yield
    finally:
        ahead.drop()  # a step begun ahead by a task of this thread that failed before it was asked for


def check_scoring(scoring: str) -> str:
    """``scoring`` if it names a scoring path.

    Raises:
        UsageError: another value (the choices named).
    """
    from ...utils.errors import UsageError

    if scoring not in SCORINGS:
        raise UsageError(f"--scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    return scoring
