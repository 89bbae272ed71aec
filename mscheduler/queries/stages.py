"""Aggregation-pipeline stages shared by every task write (see `queries.tasks`).

Every pipeline update sweeps expired leases first and ends with `recompute`, so the derived
fields (``state``, ``next_claim_at``, ``result``, ``error``) are always a function of the
worker states, whichever write ran last.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .. import constants as c
from ..models import CLAIMABLE_STATES, TERMINAL_STATES, ErrorInfo, WorkerStateKind
from .templates import templated

Document = dict[str, Any]
Pipeline = list[Document]

RUNNING = WorkerStateKind.RUNNING.value
SUCCESS = WorkerStateKind.SUCCESS.value
FAIL = WorkerStateKind.FAIL.value
TIMEOUT = WorkerStateKind.TIMEOUT.value
RELEASED = WorkerStateKind.RELEASED.value
TERMINAL = sorted(s.value for s in TERMINAL_STATES)
CLAIMABLE = [s.value for s in CLAIMABLE_STATES]

WORKER_STATE_FIELDS = (
    "worker_id",
    "run_id",
    "state",
    "started_at",
    "ping_expire_at",
    "pinged_at",
    "finished_at",
    "error",
    "result",
)

_TIMEOUT_ERROR = ErrorInfo.from_message(
    "WorkerTimeout", "the worker stopped pinging before its lease expired"
).model_dump()
_TRIES_EXHAUSTED_ERROR = ErrorInfo.from_message(
    "TriesExhausted",
    "every attempt that max_tries allows was made without enough successes; worker_states "
    "has how each ended",
).model_dump()


def literal(value: Any) -> Document:
    return {"$literal": value}


# ---------------------------------------------------------------- expression helpers

# The worker states, read so that a task written by hand without them (or with null) counts
# none, rather than making ``$size`` fail every claim of its name; the next write of such a
# task stores the array. Every expression over them reads this, never the field itself.
WORKER_STATES: Document = {"$ifNull": ["$worker_states", []]}


def count_states(cond: Document) -> Document:
    """How many worker states satisfy ``cond`` (an expression over ``$$ws``)."""
    return {"$size": {"$filter": {"input": WORKER_STATES, "as": "ws", "cond": cond}}}


def state_is(*kinds: str) -> Document:
    return {"$in": ["$$ws.state", list(kinds)]}


def failures() -> Document:
    """Unexpected failures so far (failed or timed out), those dropped from the history too."""
    return {"$add": [count_states(state_is(FAIL, TIMEOUT)), {"$ifNull": ["$dropped_failures", 0]}]}


def attempts() -> Document:
    """Claims made so far (what ``max_tries`` counts), those dropped from the history too."""
    return {"$add": [{"$size": WORKER_STATES}, {"$ifNull": ["$dropped_attempts", 0]}]}


# A task nobody has claimed: no worker state, nothing dropped from the history. Plain
# fields, no expression, so a claim's candidate read matches it at the cost of a plain
# find. For such a task every count the claim filter's ``$expr`` takes is 0 (`failures`,
# `attempts`, the live and succeeded states), so that ``$expr`` holds whatever its
# (validated) options: 0 live or succeeded < ``concurrent_worker_cnt`` (at least 1),
# 0 failures <= ``max_unexpected_retries`` (at least 0), 0 attempts < ``max_tries`` (at
# least 1, or none). Kept in step with `failures` and `attempts`: a count they add must be
# 0 here too. A task that lacks a counter (written by hand) is not untouched: it takes the
# general filter, which reads a missing counter as 0.
UNTOUCHED: Document = {"worker_states": {"$size": 0}, "dropped_attempts": 0, "dropped_failures": 0}


def is_live(now: dt.datetime) -> Document:
    return {"$and": [{"$eq": ["$$ws.state", RUNNING]}, {"$gt": ["$$ws.ping_expire_at", now]}]}


def rebuilt_state(**overrides: Any) -> Document:
    # Shaped around the memory engine (``memory://``, mongomock 4.3's aggregation engine,
    # which `backends.memory` runs): its expressions refuse ``$mergeObjects`` (implemented
    # there in ``$group`` only), where MongoDB and the wire tier would take
    # ``{"$mergeObjects": ["$$ws", overrides]}``. So the state is rebuilt field by field, and a
    # field added to `WorkerState` must be added to `WORKER_STATE_FIELDS` too.
    return {field: overrides.get(field, f"$$ws.{field}") for field in WORKER_STATE_FIELDS}


def map_states(when: Document, then: Document) -> Document:
    return {
        "$set": {
            "worker_states": {
                "$map": {
                    "input": WORKER_STATES,
                    "as": "ws",
                    "in": {"$cond": [when, then, "$$ws"]},
                }
            }
        }
    }


def lease_expiry(now: dt.datetime) -> Document:
    return {"$add": [now, "$options.worker_timeout_ms"]}


def latest(kinds: Sequence[str], field: str) -> Document:
    """``field`` of the last worker state of one of ``kinds``, or null."""
    last = {
        "$arrayElemAt": [
            {"$filter": {"input": WORKER_STATES, "as": "ws", "cond": state_is(*kinds)}},
            -1,
        ]
    }
    return {
        "$cond": [
            {"$gt": [count_states(state_is(*kinds)), 0]},
            {"$let": {"vars": {"last": last}, "in": {"$ifNull": [f"$$last.{field}", None]}}},
            None,
        ]
    }


def earliest_lease_expiry() -> Document:
    """The earliest ``ping_expire_at`` among the running states (null when none runs).

    Not ``{"$min": "$worker_states.ping_expire_at"}``: MongoDB evaluates that to the earliest
    date (its ``$min`` walks the array and skips nulls), and so does mongomock, but mongoeco
    returns null. The running state that no other running state expires before evaluates the
    same on all three; it is quadratic in the running states, at most
    ``concurrent_worker_cnt`` of them."""
    # The running states are filtered once, bound to $$running: an input written inline is
    # evaluated again for every state the outer filter tests.
    running = {"$filter": {"input": WORKER_STATES, "as": "ws", "cond": state_is(RUNNING)}}
    expires_before_a = {
        "$filter": {
            "input": "$$running",
            "as": "b",
            "cond": {"$lt": ["$$b.ping_expire_at", "$$a.ping_expire_at"]},
        }
    }
    first = {
        "$filter": {
            "input": "$$running",
            "as": "a",
            "cond": {"$eq": [{"$size": expires_before_a}, 0]},
        }
    }
    earliest = {
        "$let": {
            "vars": {"first": first},
            "in": {
                "$cond": [
                    {"$gt": [{"$size": "$$first"}, 0]},
                    {
                        "$arrayElemAt": [
                            {"$map": {"input": "$$first", "as": "f", "in": "$$f.ping_expire_at"}},
                            0,
                        ]
                    },
                    None,
                ]
            },
        }
    }
    return {"$let": {"vars": {"running": running}, "in": earliest}}


# ---------------------------------------------------------------- stages shared by every write


@templated
def sweep_expired(now: dt.datetime) -> Document:
    """A running state whose ping expired becomes ``timeout``, ended at its expiry: it counts
    as an unexpected failure and frees its slot. Done by every write, so no reaper is needed."""
    return map_states(
        {"$and": [{"$eq": ["$$ws.state", RUNNING]}, {"$lte": ["$$ws.ping_expire_at", now]}]},
        rebuilt_state(
            state=TIMEOUT,
            ping_expire_at=None,
            finished_at="$$ws.ping_expire_at",
            error=literal(_TIMEOUT_ERROR),
        ),
    )


def retries_left() -> Document:
    """The task may run again after its failures: no more unexpected failures (`failures`)
    than ``max_unexpected_retries``."""
    return {"$lte": [failures(), "$options.max_unexpected_retries"]}


def out_of_retries() -> Document:
    """More unexpected failures than ``max_unexpected_retries``: the task fails."""
    return {"$gt": [failures(), "$options.max_unexpected_retries"]}


def tries_left() -> Document:
    """Another attempt is allowed: no ``max_tries``, or fewer attempts than it."""
    return {
        "$or": [
            {"$eq": [{"$ifNull": ["$options.max_tries", None]}, None]},
            {"$lt": [attempts(), "$options.max_tries"]},
        ]
    }


def tries_exhausted(running: Document) -> Document:
    """``max_tries`` (when set) counts every attempt, ``RetryLater`` ones included."""
    return {
        "$and": [
            {"$ne": [{"$ifNull": ["$options.max_tries", None]}, None]},
            {"$gte": [attempts(), "$options.max_tries"]},
            {"$eq": [running, 0]},
        ]
    }


_ENDED = (FAIL, TIMEOUT, RELEASED)


def trim_history(run_id: str | None) -> Pipeline:
    """Bound ``worker_states``: unbounded, each ``RetryLater`` or release would add a state
    for ever, until the document passed 16 MiB and every write of the task was refused.

    Kept: the running and succeeded states (the claim needs them: a worker never runs a task it
    succeeded, and slots are counted from them), the writer's own state (``run_id``: it reads
    how its write landed), and the last KEPT_FINISHED_STATES of the others, in claim order.
    Older others are dropped and counted in ``dropped_attempts`` and ``dropped_failures``, which
    `failures` and `attempts` add back, so retries and ``max_tries`` count them all. A task
    with few states is left as it is; order is never changed."""
    ended = {"$filter": {"input": WORKER_STATES, "as": "ws", "cond": state_is(*_ENDED)}}
    last_ended = {
        "$map": {
            "input": {"$slice": [ended, -c.KEPT_FINISHED_STATES]},
            "as": "e",
            "in": "$$e.run_id",
        }
    }
    keep = {
        "$or": [
            state_is(RUNNING, SUCCESS),
            {"$eq": ["$$ws.run_id", literal(run_id)]},
            {"$in": ["$$ws.run_id", "$$last"]},
        ]
    }

    def states(kept: bool) -> Document:
        cond = keep if kept else {"$cond": [keep, False, True]}
        return {
            "$let": {
                "vars": {"last": last_ended},
                "in": {"$filter": {"input": WORKER_STATES, "as": "ws", "cond": cond}},
            }
        }

    # The size of the whole history first: it bounds the ended states, and a task of few
    # states (nearly all of them) is then left after one cheap test, not three filters.
    too_many = {
        "$and": [
            {"$gt": [{"$size": WORKER_STATES}, c.KEPT_FINISHED_STATES]},
            {"$gt": [count_states(state_is(*_ENDED)), c.KEPT_FINISHED_STATES]},
        ]
    }
    dropped = states(kept=False)
    dropped_failures = {
        "$size": {"$filter": {"input": dropped, "as": "ws", "cond": state_is(FAIL, TIMEOUT)}}
    }
    return [
        {
            "$set": {
                "dropped_attempts": {
                    "$add": [
                        {"$ifNull": ["$dropped_attempts", 0]},
                        {"$cond": [too_many, {"$size": dropped}, 0]},
                    ]
                },
                "dropped_failures": {
                    "$add": [
                        {"$ifNull": ["$dropped_failures", 0]},
                        {"$cond": [too_many, dropped_failures, 0]},
                    ]
                },
            }
        },
        {"$set": {"worker_states": {"$cond": [too_many, states(kept=True), WORKER_STATES]}}},
    ]


def failure_error(running: Document) -> Document:
    """Why a failed task failed, never null (a failure with no reason cannot be acted on):
    the last attempt's own error when
    the attempts ran out on it or a handler failed; ``TriesExhausted`` when ``max_tries`` ran
    out on an attempt that did not fail (a ``RetryLater``, or a success short of
    ``concurrent_worker_cnt``)."""
    kinds = {"$map": {"input": WORKER_STATES, "as": "ws", "in": "$$ws.state"}}
    last_failed = {"$in": [{"$ifNull": [{"$arrayElemAt": [kinds, -1]}, ""]}, [FAIL, TIMEOUT]]}
    return {
        "$cond": [
            {"$and": [tries_exhausted(running), {"$eq": [last_failed, False]}]},
            literal(_TRIES_EXHAUSTED_ERROR),
            {"$ifNull": [latest([FAIL, TIMEOUT], "error"), literal(_TRIES_EXHAUSTED_ERROR)]},
        ]
    }
