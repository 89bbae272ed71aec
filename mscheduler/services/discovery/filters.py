"""What the hub's stream carries, and which subscriber a write goes to: the stream's
pipeline (the union of the subscribers' filters), what an open stream covers, and whether a
write may give a consumer work (`may_wake`), decided from what it wrote.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from ...models import Task, TaskState
from ...store.streams import CONSUMER_NEEDLESS, WAITER_NEEDLESS, without
from .subscriptions import Subscription

_WRITES = ["insert", "update", "replace"]
_WHOLE = ["insert", "replace"]


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
    """The stream's pipeline: the union of what the subscribers want. Each part tests the
    event first (operation, changed fields, namespace), which MongoDB checks on the oplog
    entry before any ``updateLookup``: a ping passes only when a watch wants every write.
    ``namespaces`` (the tasks collection, the control version's): a stream on the database,
    whose events of other collections the ``$match`` drops, and that carries the control
    version's whoever subscribes: those writes are rare, and a consumer joining later then
    reopens nothing."""
    cover = Coverage(subscriptions)
    wakes, states = sorted(cover.wakes), sorted(cover.states)
    clauses: list[dict[str, Any]] = []
    if wakes:
        clauses.append(_changed("wakes", {"fullDocument.name": {"$in": wakes}}))
    if states:
        clauses.append(_changed("state", {"fullDocument.key": {"$in": states}}))
    if None in cover.every:
        clauses.append({"operationType": {"$in": _WRITES}})
    elif cover.every:
        named = sorted(name for name in cover.every if name is not None)
        clauses.append({"operationType": {"$in": _WRITES}, "fullDocument.name": {"$in": named}})
    if not clauses:
        match: dict[str, Any] = {"operationType": "none"}  # nobody listens (yet)
    elif len(clauses) == 1:
        match = clauses[0]
    else:
        match = {"$or": clauses}
    if namespaces is not None:
        tasks, controls = namespaces
        match = {"$or": [{"ns.coll": tasks, **match}, {"ns.coll": controls}]}
    # A task's result (what only a waiter or a watch reads) is sent only when one listens.
    needless = CONSUMER_NEEDLESS if not states and not cover.every else WAITER_NEEDLESS
    return [{"$match": match}, without(needless)]


def _changed(field: str, where: dict[str, Any]) -> dict[str, Any]:
    updated = {
        "operationType": "update",
        f"updateDescription.updatedFields.{field}": {"$exists": True},
    }
    return {"$or": [{"operationType": {"$in": _WHOLE}}, updated], **where}
