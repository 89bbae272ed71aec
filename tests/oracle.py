"""An independent statement of what a task document must say, given its worker states.

The store derives ``state`` and ``next_claim_at`` inside MongoDB's pipeline updates; this is
the same rule written plainly in Python, so tests can check every document they see."""

from __future__ import annotations

import datetime as dt

import mscheduler as ms
from mscheduler.constants import KEPT_EARLIER_ATTEMPTS
from mscheduler.models import WorkerStateKind

K = WorkerStateKind


def check_consistent(task: ms.Task) -> None:
    opts = task.options
    running = task.states(K.RUNNING)
    succeeded = task.states(K.SUCCESS)
    for ws in task.worker_states:
        assert (ws.ping_expire_at is not None) == (ws.state is K.RUNNING), ws
        assert (ws.finished_at is None) == (ws.state is K.RUNNING), ws
    assert len(running) + len(succeeded) <= max(opts.concurrent_worker_cnt, len(succeeded))
    assert len({ws.worker_id for ws in running}) == len(running), "a worker holds two states"
    assert (task.finished_at is not None) == task.state.is_terminal
    assert len(task.earlier_attempts) <= KEPT_EARLIER_ATTEMPTS
    assert all(a.state is not K.RUNNING and a.run < task.runs for a in task.earlier_attempts)
    if task.state not in (ms.TaskState.FAIL, ms.TaskState.CANCELLED):
        assert task.error is None, "an error beside an outcome it did not decide"
    if task.state.is_terminal:
        assert not running, "a finished task still has running workers"
        assert task.next_claim_at is None
        return
    if task.deps_pending:
        assert task.state is ms.TaskState.BLOCKED
    elif running:
        assert task.state is ms.TaskState.RUNNING
    else:
        assert task.state is ms.TaskState.PENDING
    assert len(succeeded) < opts.concurrent_worker_cnt
    assert task.unexpected_failures <= opts.max_unexpected_retries
    if opts.max_tries is not None:
        assert len(task.worker_states) < opts.max_tries or running
    if task.state is ms.TaskState.BLOCKED:
        assert task.next_claim_at is None
    elif len(running) + len(succeeded) >= opts.concurrent_worker_cnt or (
        opts.max_tries is not None and task.attempts >= opts.max_tries  # no try left
    ):
        assert task.next_claim_at == min(ws.ping_expire_at for ws in running)  # type: ignore[type-var]
    else:
        candidates = [t for t in (task.not_before, task.retry_at) if t is not None]
        expected: dt.datetime = max(candidates) if candidates else task.created_at
        assert task.next_claim_at == expected
