"""What the hub's stream carries, and which subscriber a write goes to: the stream's
pipeline (the union of the subscribers' filters), what an open stream covers, and whether a
write may give a consumer work (`may_wake`), decided from what it wrote.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from ...models import Task, TaskState
from ...queries.changes import changes_pipeline
from .subscriptions import Subscription


def may_wake(task: Task, now: dt.datetime) -> bool:
    """Whether the write that left ``task`` may give a consumer work, where the hub cannot
    see if it bumped ``wakes`` (`queries.derived.wakes_consumers`): a poll, or a stream
    widened for waiters or watches, which also carries claims and pings. Decided from what
    the write left, by the same rule: a task not running (pending, a retry, ended with
    dependents to tell) may; a running one when a claim is open (its next claim time at or
    before the write's ``updated_at``, or now), or when an attempt ended in this very write
    (a worker state finished at the write's ``updated_at``, which every write stamps with one
    time): the failure or `RetryLater` of one slot, whose retry comes later and which nobody
    else would hear of. A claim or a ping ends no attempt and moves the next claim time later:
    handing those to consumers would fill their heaps with running tasks due when the lease
    expires, and a consumer whose heap never drains reads no next page of the backlog."""
    if task.state is not TaskState.RUNNING:
        return True
    if task.next_claim_at is None:
        return False
    if task.next_claim_at <= max(now, task.updated_at):
        return True
    return any(state.finished_at == task.updated_at for state in task.worker_states)


class Coverage:
    """What an open stream's filter lets through."""

    def __init__(self, subs: Iterable[Subscription]) -> None:
        subs = list(subs)
        self.wakes = {name for sub in subs for name in sub.wakes}
        self.states = {key for sub in subs for key in sub.states}
        self.every = {name for sub in subs for name in sub.every}

    def covers(self, sub: Subscription) -> bool:
        if sub.controls:
            # Every stream on the database carries the controls; one on the collection never
            # does, and the controls' hub then keeps a stream of its own (`ControlHub`).
            return True
        if None in self.every:
            return True
        return (
            sub.wakes <= self.wakes | self.every
            and sub.states <= self.states
            and sub.every <= self.every
        )


def hub_pipeline(
    subscriptions: Iterable[Subscription], namespaces: tuple[str, str] | None = None
) -> list[dict[str, Any]]:
    """The stream's pipeline: the union of what the subscribers want
    (`queries.changes.changes_pipeline`). ``namespaces`` (the tasks collection, the control
    version's): a stream on the database, which carries the control version's writes too."""
    cover = Coverage(subscriptions)
    return changes_pipeline(
        wakes=cover.wakes, states=cover.states, every=cover.every, namespaces=namespaces
    )
