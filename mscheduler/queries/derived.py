"""The derived fields of a task, recomputed at the end of every pipeline update, and the
``wakes`` counter that tells consumers a write may have given them work.

Kept apart from `stages` (the building blocks they use) so each stays one screen of rules.
"""

from __future__ import annotations

import datetime as dt

from ..models import TaskState
from .stages import (
    CLAIMABLE,
    RELEASED,
    RUNNING,
    SUCCESS,
    TERMINAL,
    Document,
    Pipeline,
    count_states,
    earliest_lease_expiry,
    failure_error,
    latest,
    map_states,
    out_of_retries,
    rebuilt_state,
    state_is,
    tries_exhausted,
    tries_left,
    trim_history,
)
from .templates import templated


def bumped_wakes() -> Document:
    """``wakes`` + 1: the one field the consumers' change streams wake on (see
    `wakes_consumers`); a counter, so that every bump is a change the server reports."""
    return {"$add": [{"$ifNull": ["$wakes", 0]}, 1]}


def wake_consumers() -> Document:
    """A stage for writes that the holders of a task must hear of at once (a cancel, new
    options), whether or not they make it claimable."""
    return {"$set": {"wakes": bumped_wakes()}}


def settled_at(now: dt.datetime) -> Document:
    """When the task ended *and* its dependents were told (or it has none): what the TTL index
    deletes by, so it never deletes a task whose dependents would then wait for ever. Null
    until then; read after ``dependents_notified`` is recomputed (a later stage)."""
    notified = {"$ne": [{"$ifNull": ["$dependents_notified", None]}, False]}
    return {
        "$cond": [
            {"$and": [{"$in": ["$state", TERMINAL]}, notified]},
            {"$ifNull": ["$settled_at", now]},
            None,
        ]
    }


# What the last stages of `recompute` need from before the write, kept in fields of their own
# while it runs and removed by its last stage.
WAS_NEXT_CLAIM_AT = "_was_next_claim_at"
WAS_DEPENDENTS_NOTIFIED = "_was_dependents_notified"
# When a task was published: ``published_at`` for a partitioned task, whose ``created_at`` is
# its turn in the claim order (`queries.partitions`), else ``created_at``.
PUBLISHED_AT: Document = {"$ifNull": ["$published_at", "$created_at"]}


def wakes_consumers(now: dt.datetime) -> Document:
    """Whether this write can give a consumer something to do (woken by every write, a
    consumer would wake for every ping of every task of its names):

    - ``next_claim_at`` appeared (pending again: a retry, a dependency done), moved earlier
      (a slot freed), or an attempt ended in this write and the task is still to run (a
      failure or `RetryLater` whose retry comes later than the lease would have expired:
      nobody else knows that time). A claim or a ping only moves it later, a success makes
      it null: no wake. A consumer that still expects the task at the old, earlier time
      tries then, finds it not claimable, and reads its new time (`Claimer._reschedule`);
    - the task ended with dependents still to be told (``dependents_notified`` false): if
      its writer dies before telling them, a consumer that heard of it does.

    Reads the new ``next_claim_at`` and the old values that `recompute` kept in
    `WAS_NEXT_CLAIM_AT` and `WAS_DEPENDENTS_NOTIFIED` (null when the field was missing)."""
    # $ifNull although recompute always sets these fields: a missing field compares as null on
    # every engine only so (MongoDB orders missing before null; mongoeco takes it as null).
    next_claim_at = {"$ifNull": ["$next_claim_at", None]}
    old_next = {"$ifNull": [f"${WAS_NEXT_CLAIM_AT}", None]}
    return {
        "$or": [
            {
                "$and": [
                    {"$ne": [next_claim_at, None]},
                    {
                        "$or": [
                            {"$eq": [old_next, None]},
                            {"$lt": [next_claim_at, old_next]},
                            {"$gt": [count_states({"$eq": ["$$ws.finished_at", now]}), 0]},
                        ]
                    },
                ]
            },
            {
                "$and": [
                    {"$in": ["$state", TERMINAL]},
                    {"$gt": ["$dependent_count", 0]},
                    {"$eq": [{"$ifNull": [f"${WAS_DEPENDENTS_NOTIFIED}", None]}, None]},
                ]
            },
        ]
    }


@templated
def recompute(now: dt.datetime, run_id: str | None = None) -> Pipeline:
    """Derive ``state``, ``next_claim_at``, ``result`` and ``error`` (the outcome's: null
    unless the task failed or was cancelled) from the worker states,
    after `trim_history` (``run_id``: the writer's own state, kept whatever its age).

    Runs after `sweep_expired`, so every running state here is live. Invariants:
    - blocked while ``deps_pending`` lists a dependency; success once
      ``concurrent_worker_cnt`` workers succeeded; fail once unexpected failures exceed
      ``max_unexpected_retries`` or ``max_tries`` attempts were made; a terminal state is
      never left;
    - a terminal task holds no running state (they become ``released``), so no late ping,
      success or fail can match it;
    - ``next_claim_at`` is null unless the task is pending or running; with a free slot and
      a try left it is ``max(not_before, retry_at)`` (or its publish time); with every slot
      held, or no try left while some run, it is the earliest lease expiry, when a slot
      frees up or the task may end (a claim then ends a task whose last try died). So a
      task no claim admits is not due while its leases live, which the batched claim's
      candidate read counts on (`tasks.candidate_filter`).
    """
    succeeded = count_states(state_is(SUCCESS))
    running = count_states(state_is(RUNNING))
    state = {
        "$switch": {
            "branches": [
                {"case": {"$in": ["$state", TERMINAL]}, "then": "$state"},
                {
                    "case": {"$gt": [{"$size": "$deps_pending"}, 0]},
                    "then": TaskState.BLOCKED.value,
                },
                {
                    "case": {"$gte": [succeeded, "$options.concurrent_worker_cnt"]},
                    "then": TaskState.SUCCESS.value,
                },
                {
                    "case": out_of_retries(),
                    "then": TaskState.FAIL.value,
                },
                {"case": tries_exhausted(running), "then": TaskState.FAIL.value},
                {"case": {"$gt": [running, 0]}, "then": TaskState.RUNNING.value},
            ],
            "default": TaskState.PENDING.value,
        }
    }
    next_claim_at = {
        "$cond": [
            {"$in": ["$state", CLAIMABLE]},
            {
                "$cond": [
                    {
                        "$and": [
                            {
                                "$lt": [
                                    {"$add": [succeeded, running]},
                                    "$options.concurrent_worker_cnt",
                                ]
                            },
                            tries_left(),
                        ]
                    },
                    {"$ifNull": [{"$max": ["$not_before", "$retry_at"]}, PUBLISHED_AT]},
                    earliest_lease_expiry(),
                ]
            },
            None,
        ]
    }
    return [
        *trim_history(run_id),
        {"$set": {"state": state, "updated_at": now, "version": {"$add": ["$version", 1]}}},
        map_states(
            {"$and": [{"$in": ["$state", TERMINAL]}, {"$eq": ["$$ws.state", RUNNING]}]},
            rebuilt_state(state=RELEASED, ping_expire_at=None, finished_at=now),
        ),
        {
            "$set": {
                # Every expression of a stage reads the document as it entered the stage: the
                # values from before this write, kept for `wakes` in the next stage. (Not
                # computed there from the expression of next_claim_at: that would evaluate it
                # three times, the most costly part of every write on the memory backend.)
                WAS_NEXT_CLAIM_AT: {"$ifNull": ["$next_claim_at", None]},
                WAS_DEPENDENTS_NOTIFIED: {"$ifNull": ["$dependents_notified", None]},
                "next_claim_at": next_claim_at,
                # when the task ended (purge and the optional TTL index use it), else null
                "finished_at": {
                    "$cond": [
                        {"$in": ["$state", TERMINAL]},
                        {"$ifNull": ["$finished_at", now]},
                        None,
                    ]
                },
                # false: finished, and its dependents still to be told (flows); else null.
                "dependents_notified": {
                    "$cond": [
                        {
                            "$and": [
                                {"$in": ["$state", TERMINAL]},
                                {"$gt": ["$dependent_count", 0]},
                            ]
                        },
                        {"$ifNull": ["$dependents_notified", False]},
                        None,
                    ]
                },
                # What a handler last reported, while one runs (see `Lease.progress`).
                "progress": {
                    "$cond": [{"$gt": [running, 0]}, {"$ifNull": ["$progress", None]}, None]
                },
                "result": latest([SUCCESS], "result"),
                # The error of the task's outcome, and only of it: a task that waits to run
                # again, runs or succeeded has none (each attempt keeps its own error in its
                # worker state), so nothing shows a success, or a retry still to come, with
                # the error of an attempt that did not decide it.
                "error": {
                    "$switch": {
                        "branches": [
                            {
                                "case": {"$eq": ["$state", TaskState.CANCELLED.value]},
                                "then": "$error",
                            },
                            {
                                "case": {"$eq": ["$state", TaskState.FAIL.value]},
                                "then": failure_error(running),
                            },
                        ],
                        "default": None,
                    }
                },
            }
        },
        {
            "$set": {
                "wakes": {
                    "$cond": [wakes_consumers(now), bumped_wakes(), {"$ifNull": ["$wakes", 0]}]
                },
                "settled_at": settled_at(now),
            }
        },
        {"$unset": [WAS_NEXT_CLAIM_AT, WAS_DEPENDENTS_NOTIFIED]},
    ]
