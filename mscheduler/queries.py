"""Every MongoDB filter and update the store sends, each beside the invariant it keeps.

Pure functions that build documents; `store.py` executes them. Written for MongoDB >= 6.0.
Time is always a client-side ``now`` (an injectable clock); ``$$NOW`` is never used.

The operator vocabulary, kept small so the memory backend runs the very same documents:
- query: ``$in $nin $lte $gt $ne $elemMatch $nor $or $size $expr``
- expressions: ``$let $filter $map $cond $switch $size $add $eq $lt $lte $gt $gte $and $in
  $min $max $ifNull $arrayElemAt $concatArrays $literal``
- updates: aggregation-pipeline ``$set`` stages; classic ``$set $setOnInsert $inc``.

Every value that comes from a caller (worker ids, run ids, results, errors) enters a pipeline
update through ``$literal``, so a string such as ``"$x"`` is stored, never read as a path.

Field semantics kept by every write (the same `_recompute` stages end every pipeline update):
- a worker state is *live* while ``state == running`` and ``ping_expire_at > now``; finished
  states have ``ping_expire_at: null``;
- ``state`` and ``next_claim_at`` are functions of ``worker_states``, ``options``,
  ``deps_pending``, ``not_before`` and ``retry_at``; a terminal state never changes again
  except through an explicit re-publish.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .models import TERMINAL_STATES, ErrorInfo, TaskOptions, TaskState, WorkerStateKind

Document = dict[str, Any]
Pipeline = list[Document]

_RUNNING = WorkerStateKind.RUNNING.value
_SUCCESS = WorkerStateKind.SUCCESS.value
_FAIL = WorkerStateKind.FAIL.value
_TIMEOUT = WorkerStateKind.TIMEOUT.value
_RELEASED = WorkerStateKind.RELEASED.value
_TERMINAL = sorted(s.value for s in TERMINAL_STATES)
_CLAIMABLE = [TaskState.PENDING.value, TaskState.RUNNING.value]

WORKER_STATE_FIELDS = (
    "worker_id",
    "run_id",
    "state",
    "started_at",
    "ping_expire_at",
    "finished_at",
    "error",
    "result",
)

_TIMEOUT_ERROR = ErrorInfo.from_message(
    "WorkerTimeout", "the worker stopped pinging before its lease expired"
).model_dump()


def _literal(value: Any) -> Document:
    return {"$literal": value}


# ---------------------------------------------------------------- expression helpers


def _count_states(cond: Document) -> Document:
    """How many worker states satisfy ``cond`` (an expression over ``$$ws``)."""
    return {"$size": {"$filter": {"input": "$worker_states", "as": "ws", "cond": cond}}}


def _state_is(*kinds: str) -> Document:
    return {"$in": ["$$ws.state", list(kinds)]}


def _is_live(now: dt.datetime) -> Document:
    return {"$and": [{"$eq": ["$$ws.state", _RUNNING]}, {"$gt": ["$$ws.ping_expire_at", now]}]}


def _rebuilt_state(**overrides: Any) -> Document:
    # No $mergeObjects (the memory backend lacks it): rebuild the state field by field.
    return {field: overrides.get(field, f"$$ws.{field}") for field in WORKER_STATE_FIELDS}


def _map_states(when: Document, then: Document) -> Document:
    return {
        "$set": {
            "worker_states": {
                "$map": {
                    "input": "$worker_states",
                    "as": "ws",
                    "in": {"$cond": [when, then, "$$ws"]},
                }
            }
        }
    }


def _lease_expiry(now: dt.datetime) -> Document:
    return {"$add": [now, "$options.worker_timeout_ms"]}


def _latest(kinds: Sequence[str], field: str) -> Document:
    """``field`` of the last worker state of one of ``kinds``, or null."""
    last = {
        "$arrayElemAt": [
            {"$filter": {"input": "$worker_states", "as": "ws", "cond": _state_is(*kinds)}},
            -1,
        ]
    }
    return {
        "$cond": [
            {"$gt": [_count_states(_state_is(*kinds)), 0]},
            {"$let": {"vars": {"last": last}, "in": {"$ifNull": [f"$$last.{field}", None]}}},
            None,
        ]
    }


# ---------------------------------------------------------------- stages shared by every write


def _sweep_expired(now: dt.datetime) -> Document:
    """A running state whose ping expired becomes ``timeout``, ended at its expiry: it counts
    as an unexpected failure and frees its slot. Done by every write, so no reaper is needed."""
    return _map_states(
        {"$and": [{"$eq": ["$$ws.state", _RUNNING]}, {"$lte": ["$$ws.ping_expire_at", now]}]},
        _rebuilt_state(
            state=_TIMEOUT,
            ping_expire_at=None,
            finished_at="$$ws.ping_expire_at",
            error=_literal(_TIMEOUT_ERROR),
        ),
    )


def _recompute(now: dt.datetime) -> Pipeline:
    """Derive ``state``, ``next_claim_at``, ``result`` and ``error`` from the worker states.

    Runs after `_sweep_expired`, so every running state here is live. Invariants:
    - success once ``concurrent_worker_cnt`` workers succeeded; fail once unexpected failures
      exceed ``max_unexpected_retries``; a terminal state is never left;
    - a terminal task holds no running state (they become ``released``), so no late ping,
      success or fail can match it;
    - ``next_claim_at`` is null unless the task is pending or running; with a free slot it is
      ``max(not_before, retry_at)`` (or ``created_at``); with every slot held it is the
      earliest lease expiry, when a slot frees up.
    """
    succeeded = _count_states(_state_is(_SUCCESS))
    running = _count_states(_state_is(_RUNNING))
    failed = _count_states(_state_is(_FAIL, _TIMEOUT))
    state = {
        "$switch": {
            "branches": [
                {"case": {"$in": ["$state", _TERMINAL]}, "then": "$state"},
                {"case": {"$gt": ["$deps_pending", 0]}, "then": TaskState.BLOCKED.value},
                {
                    "case": {"$gte": [succeeded, "$options.concurrent_worker_cnt"]},
                    "then": TaskState.SUCCESS.value,
                },
                {
                    "case": {"$gt": [failed, "$options.max_unexpected_retries"]},
                    "then": TaskState.FAIL.value,
                },
                {"case": {"$gt": [running, 0]}, "then": TaskState.RUNNING.value},
            ],
            "default": TaskState.PENDING.value,
        }
    }
    next_claim_at = {
        "$cond": [
            {"$in": ["$state", _CLAIMABLE]},
            {
                "$cond": [
                    {"$lt": [{"$add": [succeeded, running]}, "$options.concurrent_worker_cnt"]},
                    {"$ifNull": [{"$max": ["$not_before", "$retry_at"]}, "$created_at"]},
                    {"$min": "$worker_states.ping_expire_at"},
                ]
            },
            None,
        ]
    }
    return [
        {"$set": {"state": state, "updated_at": now, "version": {"$add": ["$version", 1]}}},
        _map_states(
            {"$and": [{"$in": ["$state", _TERMINAL]}, {"$eq": ["$$ws.state", _RUNNING]}]},
            _rebuilt_state(state=_RELEASED, ping_expire_at=None, finished_at=now),
        ),
        {
            "$set": {
                "next_claim_at": next_claim_at,
                "result": _latest([_SUCCESS], "result"),
                "error": {
                    "$cond": [
                        {"$eq": ["$state", TaskState.CANCELLED.value]},
                        "$error",
                        _latest([_FAIL, _TIMEOUT], "error"),
                    ]
                },
            }
        },
    ]


# ---------------------------------------------------------------- publish


def new_task_document(
    *,
    key: str,
    name: str,
    payload: Any,
    options: TaskOptions,
    now: dt.datetime,
    task_id: Any,
) -> Document:
    """A fresh task. ``next_claim_at`` follows the `_recompute` rule for a task with no states."""
    return {
        "_id": task_id,
        "key": key,
        "name": name,
        "payload": payload,
        "options": options.to_document(),
        "state": TaskState.PENDING.value,
        "next_claim_at": options.not_before or now,
        "not_before": options.not_before,
        "retry_at": None,
        "created_at": now,
        "updated_at": now,
        "version": 1,
        "depends_on": [],
        "deps_pending": 0,
        "worker_states": [],
        "result": None,
        "error": None,
    }


def by_key(key: str) -> Document:
    return {"key": key}


def publish_upsert(document: Document) -> tuple[Document, Document]:
    """Insert unless the key exists. The unique index on ``key`` makes concurrent publishes of
    one key produce one document; the caller tells "created" by the ``_id`` it chose. The
    upsert takes ``key`` from the equality filter, so ``$setOnInsert`` does not repeat it."""
    on_insert = {field: value for field, value in document.items() if field != "key"}
    return by_key(document["key"]), {"$setOnInsert": on_insert}


def replace_finished_filter(key: str, version: int) -> Document:
    """Only a finished task is replaced, and only the version the caller looked at: a task that
    was re-run or changed in between is left alone (the caller re-reads)."""
    return {"key": key, "state": {"$in": _TERMINAL}, "version": version}


def update_payload(key: str, payload: Any, now: dt.datetime) -> tuple[Document, Document]:
    """A running handler keeps the payload it started with: never change it under it."""
    return (
        {"key": key, "state": {"$ne": TaskState.RUNNING.value}},
        {"$set": {"payload": payload, "updated_at": now}, "$inc": {"version": 1}},
    )


# ---------------------------------------------------------------- claim


def claim_filter(
    worker_id: str,
    now: dt.datetime,
    *,
    names: Sequence[str] | None = None,
    key: str | None = None,
) -> Document:
    """Tasks ``worker_id`` may claim now.

    Invariant kept with `claim_update`, atomically per document: after a claim, live running
    plus succeeded states never exceed ``concurrent_worker_cnt``; a worker never holds two live
    states of one task nor runs a task it already succeeded; only ``specific_worker_ids`` (when
    set) claim; nothing is claimed before ``not_before``/``retry_at`` (both folded into
    ``next_claim_at``) or while dependencies are pending. ``next_claim_at`` serves the index;
    the ``$expr`` re-derives the slot count from the states themselves, so safety never rests
    on a derived field.
    """
    live = _count_states(_is_live(now))
    succeeded = _count_states(_state_is(_SUCCESS))
    failed = _count_states(_state_is(_FAIL, _TIMEOUT))
    query: Document = {}
    if key is not None:
        query["key"] = key
    if names is not None:
        query["name"] = {"$in": list(names)}
    query.update(
        {
            "state": {"$in": _CLAIMABLE},
            "next_claim_at": {"$lte": now},
            "deps_pending": 0,
            "$or": [
                {"options.specific_worker_ids": {"$size": 0}},
                {"options.specific_worker_ids": worker_id},
            ],
            "$nor": [
                {"worker_states": {"$elemMatch": {"worker_id": worker_id, "state": _SUCCESS}}},
                {
                    "worker_states": {
                        "$elemMatch": {
                            "worker_id": worker_id,
                            "state": _RUNNING,
                            "ping_expire_at": {"$gt": now},
                        }
                    }
                },
            ],
            "$expr": {
                "$and": [
                    {"$lt": [{"$add": [live, succeeded]}, "$options.concurrent_worker_cnt"]},
                    {"$lte": [failed, "$options.max_unexpected_retries"]},
                ]
            },
        }
    )
    return query


CLAIM_SORT: list[tuple[str, int]] = [("options.priority", -1), ("created_at", 1)]


def claim_update(worker_id: str, run_id: str, now: dt.datetime) -> Pipeline:
    """Sweep expired states, append ours unless the sweep exhausted the retries (then the task
    fails and the caller gets no lease), recompute. One round trip, atomic."""
    failed_after_sweep = _count_states(_state_is(_FAIL, _TIMEOUT))
    new_state = {
        "worker_id": _literal(worker_id),
        "run_id": _literal(run_id),
        "state": _RUNNING,
        "started_at": now,
        "ping_expire_at": _lease_expiry(now),
        "finished_at": None,
        "error": None,
        "result": None,
    }
    return [
        _sweep_expired(now),
        {
            "$set": {
                "worker_states": {
                    "$cond": [
                        {"$lte": [failed_after_sweep, "$options.max_unexpected_retries"]},
                        {"$concatArrays": ["$worker_states", [new_state]]},
                        "$worker_states",
                    ]
                }
            }
        },
        *_recompute(now),
    ]


# ---------------------------------------------------------------- fenced writes of a lease holder


def lease_filter(key: str, worker_id: str, run_id: str, now: dt.datetime) -> Document:
    """Fencing: only the holder of a *live* state with this ``run_id`` may write. An expired
    lease is dead even before anyone takes over, so a success or fail is only ever recorded
    for the current holder of a live state; a late worker matches nothing (`LeaseLost`)."""
    return {
        "key": key,
        "worker_states": {
            "$elemMatch": {
                "worker_id": worker_id,
                "run_id": run_id,
                "state": _RUNNING,
                "ping_expire_at": {"$gt": now},
            }
        },
    }


def _own_state(worker_id: str, run_id: str, **overrides: Any) -> Document:
    return _map_states(
        {
            "$and": [
                {"$eq": ["$$ws.run_id", _literal(run_id)]},
                {"$eq": ["$$ws.worker_id", _literal(worker_id)]},
            ]
        },
        _rebuilt_state(**overrides),
    )


def ping_update(worker_id: str, run_id: str, now: dt.datetime) -> Pipeline:
    return [
        _sweep_expired(now),
        _own_state(worker_id, run_id, ping_expire_at=_lease_expiry(now)),
        *_recompute(now),
    ]


def success_update(worker_id: str, run_id: str, result: Any, now: dt.datetime) -> Pipeline:
    return [
        _sweep_expired(now),
        _own_state(
            worker_id,
            run_id,
            state=_SUCCESS,
            ping_expire_at=None,
            finished_at=now,
            result=_literal(result),
        ),
        *_recompute(now),
    ]


def fail_update(worker_id: str, run_id: str, error: ErrorInfo, now: dt.datetime) -> Pipeline:
    """A handler failure counts against the retries and delays the next claim by
    ``unexpected_retry_delay_ms`` (a timeout does not: the worker timeout was the delay)."""
    return [
        _sweep_expired(now),
        _own_state(
            worker_id,
            run_id,
            state=_FAIL,
            ping_expire_at=None,
            finished_at=now,
            error=_literal(error.model_dump()),
        ),
        {"$set": {"retry_at": {"$add": [now, "$options.unexpected_retry_delay_ms"]}}},
        *_recompute(now),
    ]


def release_update(worker_id: str, run_id: str, reason: str, now: dt.datetime) -> Pipeline:
    """Give the slot back at once (graceful shutdown): not a failure, claimable immediately."""
    return [
        _sweep_expired(now),
        _own_state(
            worker_id,
            run_id,
            state=_RELEASED,
            ping_expire_at=None,
            finished_at=now,
            error=_literal(ErrorInfo.from_message("Released", reason).model_dump()),
        ),
        *_recompute(now),
    ]


# ---------------------------------------------------------------- the consumer's fetch


def fetch_filter(names: Sequence[str]) -> Document:
    """Tasks that are or will become claimable (pending, or running with a lease that may
    expire or a free slot), earliest first: the consumer's heap is filled from these."""
    return {"name": {"$in": list(names)}, "state": {"$in": _CLAIMABLE}}


FETCH_SORT: list[tuple[str, int]] = [("next_claim_at", 1)]
FETCH_PROJECTION: Document = {"payload": 0, "result": 0, "worker_states.result": 0}


# ---------------------------------------------------------------- options


def options_filter(key: str) -> Document:
    return {"key": key, "state": {"$nin": _TERMINAL}}


def options_update(options: TaskOptions, now: dt.datetime) -> Pipeline:
    """New options take effect at once: the state and ``next_claim_at`` follow them, and the
    consumers watching the task see the change (a worker no longer in
    ``specific_worker_ids`` stops; a new ping interval applies from the next ping)."""
    return [
        _sweep_expired(now),
        {
            "$set": {
                "options": _literal(options.to_document()),
                "not_before": options.not_before,
            }
        },
        *_recompute(now),
    ]


# ---------------------------------------------------------------- cancel


def cancel_filter(key: str) -> Document:
    return {"key": key, "state": {"$nin": _TERMINAL}}


def cancel_update(reason: str, now: dt.datetime) -> Pipeline:
    """Cancelled is terminal: `_recompute` releases the running states, so their holders'
    next ping fails with `LeaseLost` and their handlers are cancelled."""
    error = ErrorInfo.from_message("Cancelled", reason).model_dump()
    return [
        _sweep_expired(now),
        {"$set": {"state": TaskState.CANCELLED.value, "error": _literal(error)}},
        *_recompute(now),
    ]
