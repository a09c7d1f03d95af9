"""The job bookkeeping shared by local and Ray replicas: least-loaded dispatch, jobs of a lost replica sent
again within a retry budget, then an error that says what is left while finished jobs keep their values."""

from __future__ import annotations

import pytest

from vllm_eval.replicas.jobpool import JobPool
from vllm_eval.utils.errors import ReplicaError


class _Pool(JobPool):
    """Replicas that only record what they were sent; the test finishes or loses them."""

    def __init__(self, n: int, budget: int) -> None:
        super().__init__(list(range(n)), "test", retry_budget=budget)
        self.sent: list[tuple[int, int]] = []

    def _send(self, index, job_id, fn, payload):
        self.sent.append((index, job_id))


def test_lost_jobs_move_until_the_budget_is_spent():
    pool = _Pool(3, budget=1)
    first, second, third = (pool.submit(len, x) for x in ("a", "bb", "ccc"))
    assert pool.sent == [(0, 0), (1, 1), (2, 2)]  # least-loaded: one each
    pool._finished(0, 0, True, 1)
    assert first.result(0) == 1
    with pytest.warns(RuntimeWarning, match=r"replica 1 died; 1 pending job\(s\) moved to the 2 other"):
        pool._lost(1, "died")
    assert pool.sent[-1] == (0, 1) and pool.redone == 1  # to the least-loaded live replica
    with pytest.warns(RuntimeWarning):
        pool._lost(0, "died too")  # job 1 loses its replica a second time: over the budget of 1
    with pytest.raises(ReplicaError, match=r"lost its replica 2 times \(retry budget 1\); 2 job\(s\) .*unfinished"):
        second.result(0)
    assert first.result(0) == 1 and not third.done()  # finished work kept; replica 2's job still runs
    pool._finished(2, 2, False, "replica 2: ValueError: bad input")
    with pytest.raises(ReplicaError, match="bad input"):
        third.result(0)
    state = pool.state()
    assert state.lost == {0: "died too", 1: "died"} and state.redone == 1 and state.jobs_done == {0: 1, 1: 0, 2: 1}
    with pytest.warns(RuntimeWarning):
        pool._lost(2, "gone")
    with pytest.raises(ReplicaError, match=r"every replica has been lost \(replica 0 died too; replica 1 died; "):
        pool.submit(len, "d").result(0)
