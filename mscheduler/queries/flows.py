"""The flow half of the queries: dependencies between tasks, each query beside its invariant.

A dependent task lists its dependencies in ``depends_on`` and the ones that have not yet
succeeded in ``deps_pending``; it is ``blocked`` while that list is not empty. A dependency
keeps only ``dependent_count``, so a task with no dependents costs nothing extra when it ends.
Updates of dependents *pull* the finished key from ``deps_pending`` and match only dependents
that still list it, so applying one twice (a retry, a recovery) changes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from ..models import ErrorInfo, TaskState
from .derived import recompute
from .stages import TERMINAL, Document, Pipeline, literal, sweep_expired

_WAITING_FOR = "deps_pending"


def dependents_waiting_on(key: str) -> Document:
    """Dependents of ``key`` that have not been told of its outcome yet."""
    return {"depends_on": key, _WAITING_FOR: key}


def _without(key: str) -> Document:
    return {"$filter": {"input": f"${_WAITING_FOR}", "cond": {"$ne": ["$$this", literal(key)]}}}


def dependency_succeeded(key: str, now: dt.datetime) -> Pipeline:
    """One fewer dependency to wait for; with none left the task becomes claimable."""
    return [sweep_expired(now), {"$set": {_WAITING_FOR: _without(key)}}, *recompute(now)]


def dependency_failed(key: str, outcome: str, now: dt.datetime) -> Pipeline:
    """A dependency failed, was cancelled or was deleted (``outcome`` says which, e.g. "ended
    as fail"): the dependent is cancelled with a reason naming it, unless it was published with
    ``on_dependency_failure="run"`` (then it runs, and sees the failed ones in
    ``deps_failed``). A dependent that ended already (cancelled by an operator while it
    waited) keeps its state and the error that says why: the dependency did not end it."""
    runs_anyway = {"$eq": ["$options.on_dependency_failure", "run"]}
    cancels = {
        "$cond": [{"$in": ["$state", TERMINAL]}, False, {"$cond": [runs_anyway, False, True]}]
    }
    error = ErrorInfo.from_message("DependencyFailed", f"dependency {key!r} {outcome}").model_dump()
    return [
        sweep_expired(now),
        {
            "$set": {
                _WAITING_FOR: _without(key),
                "deps_failed": {"$concatArrays": ["$deps_failed", [literal(key)]]},
                "state": {"$cond": [cancels, TaskState.CANCELLED.value, "$state"]},
                "error": {"$cond": [cancels, literal(error), "$error"]},
            }
        },
        *recompute(now),
    ]


def count_dependent(keys: Sequence[str]) -> tuple[Document, Document]:
    """Tell dependencies they have one more dependent. Over-counting (two racing publishes
    of one dependent) only costs a needless update when they end; under-counting cannot
    happen because this runs before the dependent is written."""
    return {"key": {"$in": list(keys)}}, {"$inc": {"dependent_count": 1}}


def count_dependents(key: str, count: int) -> tuple[Document, Document]:
    """`count_dependent` for a batch: ``count`` new dependents of ``key`` in one update."""
    return {"key": key}, {"$inc": {"dependent_count": count}}


def unnotified() -> Document:
    """Finished tasks whose dependents were not all told (the writer crashed in between)."""
    return {"dependents_notified": False}


def unnotified_dependents_of(key: str) -> Document:
    return {"dependents_notified": False, "depends_on": key}


def mark_notified(key: str, now: dt.datetime) -> tuple[Document, Document]:
    """Told: from now on the TTL index may delete it (``settled_at``, see
    `derived.settled_at`)."""
    return (
        {"key": key, "dependents_notified": False, "state": {"$in": TERMINAL}},
        # A wake: consumers that saw the task end unnotified drop their recovery check.
        {"$set": {"dependents_notified": True, "settled_at": now}, "$inc": {"wakes": 1}},
    )


def settled_backfill() -> tuple[Document, Pipeline]:
    """Finished tasks written before ``settled_at`` existed, with nothing left to tell: the
    TTL's date is when they ended. ``$nor`` of ``$type`` rather than a null test, which the
    engines answer differently for a missing field. Served by ``finished`` (state)."""
    return (
        {
            "state": {"$in": TERMINAL},
            "dependents_notified": {"$ne": False},
            "$nor": [{"settled_at": {"$type": "date"}}],
        },
        [{"$set": {"settled_at": "$finished_at"}}],
    )


def add_dependency_filter(key: str) -> Document:
    """Only a task that has not started may gain a dependency."""
    return {
        "key": key,
        "state": {"$in": [TaskState.PENDING.value, TaskState.BLOCKED.value]},
    }


def add_dependency(before: str, still_pending: bool, now: dt.datetime) -> Pipeline:
    pending = {"$concatArrays": [_without(before), [literal(before)]]}
    return [
        sweep_expired(now),
        {
            "$set": {
                "depends_on": {
                    "$concatArrays": [
                        {
                            "$filter": {
                                "input": "$depends_on",
                                "cond": {"$ne": ["$$this", literal(before)]},
                            }
                        },
                        [literal(before)],
                    ]
                },
                _WAITING_FOR: pending if still_pending else _without(before),
            }
        },
        *recompute(now),
    ]
