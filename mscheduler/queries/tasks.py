"""Every MongoDB filter and update the store sends, each beside the invariant it keeps.

Pure functions that build documents; `store.py` executes them. Written for MongoDB >= 6.0.
Time is always a client-side ``now`` (an injectable clock); ``$$NOW`` is never used (nor
could it be: the memory engine, mongomock, has no ``$$NOW``).

The operator vocabulary is `constants.OPERATORS` (the one list, with the traps kept out and
why), kept small so every engine runs the very same documents the same way;
tests/unit/test_query_builders.py checks that every builder keeps to it. Updates are
aggregation-pipeline ``$set`` stages, or classic ones where a pipeline is not needed.

Every value that comes from a caller (worker ids, run ids, results, errors) enters a pipeline
update through ``$literal``, so a string such as ``"$x"`` is stored, never read as a path.

Field semantics kept by every write (the same `recompute` stages end every pipeline update):
- a worker state is *live* while ``state == running`` and ``ping_expire_at > now``; finished
  states have ``ping_expire_at: null``;
- ``state`` and ``next_claim_at`` are functions of ``worker_states``, ``options``,
  ``deps_pending``, ``not_before`` and ``retry_at``; a terminal state never changes again
  except through an explicit re-publish.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from .. import constants as c
from ..models import ErrorInfo, TaskOptions, TaskState
from .derived import PUBLISHED_AT, recompute, wake_consumers
from .stages import (
    CLAIMABLE,
    RUNNING,
    SUCCESS,
    TERMINAL,
    TIMEOUT,
    UNTOUCHED,
    WORKER_STATES,
    Document,
    Pipeline,
    count_states,
    is_live,
    lease_expiry,
    literal,
    retries_left,
    state_is,
    sweep_expired,
    tries_left,
)
from .templates import templated

# ---------------------------------------------------------------- publish


def new_task_document(
    *,
    key: str,
    name: str,
    payload: Any,
    options: TaskOptions,
    now: dt.datetime,
    task_id: Any,
    depends_on: Sequence[str] = (),
    deps_pending: Sequence[str] = (),
    deps_failed: Sequence[str] = (),
    trace_context: Mapping[str, str] | None = None,
) -> Document:
    """A fresh task: its state and ``next_claim_at`` follow the `recompute` rule for a task
    with no worker states (a failed dependency cancels it unless it runs anyway).
    ``trace_context``: the publisher's OpenTelemetry context
    (`mscheduler.observability.tracing`)."""
    cancelled = bool(deps_failed) and options.on_dependency_failure == "cancel"
    if cancelled:
        state = TaskState.CANCELLED
    elif deps_pending:
        state = TaskState.BLOCKED
    else:
        state = TaskState.PENDING
    error = None
    if cancelled:
        error = ErrorInfo.from_message(
            "DependencyFailed", f"dependency {deps_failed[0]!r} did not succeed"
        ).model_dump()
    return {
        "_id": task_id,
        "key": key,
        "name": name,
        "payload": payload,
        "options": options.to_document(),
        "state": state.value,
        "next_claim_at": (options.not_before or now) if state is TaskState.PENDING else None,
        "not_before": options.not_before,
        "retry_at": None,
        "created_at": now,
        "updated_at": now,
        "version": 1,
        "depends_on": list(depends_on),
        "deps_pending": list(deps_pending),
        "deps_failed": list(deps_failed),
        "dependent_count": 0,
        "dependents_notified": None,
        "finished_at": now if cancelled else None,
        "settled_at": now if cancelled else None,  # no dependent yet: nobody to tell
        "worker_states": [],
        "dropped_attempts": 0,
        "dropped_failures": 0,
        "wakes": 0,
        "progress": None,
        "trace_context": dict(trace_context) if trace_context else None,
        "result": None,
        "error": error,
        "format": c.DOCUMENT_FORMAT,
    }


def by_key(key: str) -> Document:
    return {"key": key}


def by_ids(task_ids: Sequence[Any]) -> Document:
    return {"_id": {"$in": list(task_ids)}}


ANY: Document = {}  # whether anything is there (`StoreBase.in_use`)
ID_ONLY: Document = {"_id": 1}
KEY_ONLY: Document = {"key": 1}


def by_keys(keys: Sequence[str]) -> Document:
    return {"key": {"$in": list(keys)}}


def deletable(keys: Sequence[str]) -> Document:
    """The tasks of ``keys`` a commit may delete: not running, as `replace_filter` and
    `update_payload` ask (a running handler would lose its task under it)."""
    return {"key": {"$in": list(keys)}, "state": {"$ne": TaskState.RUNNING.value}}


# Writes in the order they were stamped; ``_id`` breaks ties (a sort must be total).


def changed_since(since: dt.datetime, names: Sequence[str] | None) -> Document:
    """Tasks (of ``names``) written at or after ``since`` (a watch that polls)."""
    found: Document = {"updated_at": {"$gte": since}}
    if names:
        found["name"] = {"$in": list(names)}
    return found


def publish_upsert(document: Document) -> tuple[Document, Document]:
    """Insert unless the key exists. The unique index on ``key`` makes concurrent publishes of
    one key produce one document; the caller tells "created" by the ``_id`` it chose. The
    upsert takes ``key`` from the equality filter, so ``$setOnInsert`` does not repeat it."""
    on_insert = {field: value for field, value in document.items() if field != "key"}
    return by_key(document["key"]), {"$setOnInsert": on_insert}


def replace_finished_filter(key: str, version: int) -> Document:
    """Only a finished task is replaced, and only the version the caller looked at: a task that
    was re-run or changed in between is left alone (the caller re-reads)."""
    return {"key": key, "state": {"$in": TERMINAL}, "version": version}


def retry_filter(key: str, version: int) -> Document:
    """`Scheduler.retry`: the failed or cancelled task the caller read, at that version. A task
    that ran again (and maybe succeeded) or was changed in between is left alone: its work is
    never run twice by a retry that raced it (the caller re-reads and decides again)."""
    return {
        "key": key,
        "version": version,
        "state": {"$in": [TaskState.FAIL.value, TaskState.CANCELLED.value]},
    }


def replace_filter(key: str, version: int) -> Document:
    """`Scheduler.replace` (and a commit's delete and publish of one key): a task that is not
    running, at the version the caller read. The replacement continues that version, so a
    ``require`` that read an older incarnation can never match a newer one."""
    return {"key": key, "version": version, "state": {"$ne": TaskState.RUNNING.value}}


def update_payload(key: str, payload: Any, now: dt.datetime) -> tuple[Document, Document]:
    """A running handler keeps the payload it started with: never change it under it."""
    return (
        {"key": key, "state": {"$ne": TaskState.RUNNING.value}},
        {"$set": {"payload": payload, "updated_at": now}, "$inc": {"version": 1}},
    )


# ---------------------------------------------------------------- claim


# A document written in a format newer than this version reads (a missing ``format`` is 1, so
# this never matches the older ones): a claim leaves it to a worker of a newer version.
NEWER_FORMAT: Document = {"format": {"$gt": c.DOCUMENT_FORMAT}}


def claim_filter(
    worker_id: str,
    now: dt.datetime,
    *,
    names: Sequence[str] | None = None,
    key: str | None = None,
    exclude_keys: Sequence[str] = (),
    exclude_partitions: Sequence[str] = (),
) -> Document:
    """Tasks ``worker_id`` may claim now (and, by name, none of ``exclude_keys``: the keys its
    executor still runs, say a handler winding down after its lease was lost, so one process
    never runs two attempts of one key at once; nor of ``exclude_partitions``, the
    partitions at their ``partition_max_running``: `consumer.limits.Limiter.take`).

    Invariant kept with `claim_update`, atomically per document: after a claim, live running
    plus succeeded states never exceed ``concurrent_worker_cnt``; a worker never holds two live
    states of one task (whichever life of it holds the first: a worker restarted under its id
    waits for its previous life's lease to expire, as for any lease, and its consumer tries
    then, `consumer.claimable.next_claim_for`) nor runs a task it already succeeded; only
    ``specific_worker_ids`` (when set) claim; nothing is claimed before
    ``not_before``/``retry_at`` (both folded into ``next_claim_at``) or while dependencies
    are pending. ``next_claim_at`` serves the index; the ``$expr`` re-derives the slot count
    from the states themselves, so safety never rests on a derived field.

    A task nobody has claimed yet (`stages.UNTOUCHED`: no worker state, no attempt or
    failure dropped from the history) satisfies the worker-state rules by its plain fields:
    it is matched by them first, and the ``$expr`` (evaluated in the server per candidate)
    is read only for the others. The cheap, selective conditions come first: an engine
    that evaluates a filter in its order stops at the first that fails.
    """
    query: Document = {}
    if key is not None:
        query["key"] = key
    elif exclude_keys:
        query["key"] = {"$nin": list(exclude_keys)}
    if names is not None:
        query["name"] = {"$in": list(names)}
    if exclude_partitions:
        query["options.partition"] = {"$nin": list(exclude_partitions)}
    query.update(
        {
            "state": {"$in": CLAIMABLE},
            "next_claim_at": {"$lte": now},
            "deps_pending": {"$size": 0},
            "$or": [
                {"options.specific_worker_ids": {"$size": 0}},
                {"options.specific_worker_ids": worker_id},
            ],
            "$nor": [expired_by(now), NEWER_FORMAT],
            "$and": [{"$or": [UNTOUCHED, _claimable_by_states(worker_id, now)]}],
        }
    )
    return query


def candidate_filter(
    worker_id: str,
    now: dt.datetime,
    *,
    names: Sequence[str],
    exclude_keys: Sequence[str] = (),
    exclude_partitions: Sequence[str] = (),
) -> Document:
    """What a batched claim reads as its candidates: `claim_filter` but the slot, retry and
    try arithmetic over the worker states (its ``$expr``, two thirds of its bytes, and what
    an engine evaluates per document). A superset of the claimable tasks, never a subset.

    Invariant that makes it enough: no candidate is claimed on this read's word alone. A
    candidate the batch claims by compare-and-set (`quick_claimable`) is `stages.UNTOUCHED`
    (no worker state, nothing dropped), for which that arithmetic holds whatever the options
    (no live, succeeded or failed state, no attempt); any other is written with
    `claim_filter` whole (`claim_one_of`), evaluated by the server on the document as it is
    then. What the arithmetic excludes, ``next_claim_at`` nearly always excludes too, as
    every write derives it (`recompute`: a task with every slot held, or no try left, is
    due when a lease may expire, and a claim is then admitted, or ends the task). Not
    always: a lease that expired beside a live one after the task's slots were cut, or
    fields written by hand. Such a candidate is a write that misses, and the batch reads
    by the whole claim filter after it (`store.claims.claim_many`). So is a candidate of a
    newer document format, which this read does not test for (the server would evaluate it
    on every waiting task, for the few tasks of a fleet mid-upgrade): the batch that reads one
    (`written_newer`) reads by the whole claim filter instead."""
    query = claim_filter(
        worker_id,
        now,
        names=names,
        exclude_keys=exclude_keys,
        exclude_partitions=exclude_partitions,
    )
    query["$nor"] = [expired_by(now)]
    query["$and"] = [{"$or": [UNTOUCHED, _own_states_excluded(worker_id, now)]}]
    return query


def _own_states_excluded(worker_id: str, now: dt.datetime) -> Document:
    """No live or succeeded state of ``worker_id``: a worker runs a task once at a time, and
    never again once it succeeded."""
    return {
        "$nor": [
            {"worker_states": {"$elemMatch": {"worker_id": worker_id, "state": SUCCESS}}},
            {
                "worker_states": {
                    "$elemMatch": {
                        "worker_id": worker_id,
                        "state": RUNNING,
                        "ping_expire_at": {"$gt": now},
                    }
                }
            },
        ]
    }


def _claimable_by_states(worker_id: str, now: dt.datetime) -> Document:
    """The worker-state rules of `claim_filter`, for a task of any history: a free slot, no
    live or succeeded state of ``worker_id``, retries and tries left.

    Or no try left and no state live: the attempt that spent the last try died, and only a
    write can end the task (a lease expires without one). The claim admitted then sweeps the
    dead state, appends none (`_claiming`), and the task fails: no lease, as when the sweep
    exhausts the retries."""
    live = count_states(is_live(now))
    succeeded = count_states(state_is(SUCCESS))
    return {
        **_own_states_excluded(worker_id, now),
        "$expr": {
            "$and": [
                {"$lt": [{"$add": [live, succeeded]}, "$options.concurrent_worker_cnt"]},
                retries_left(),
                {"$or": [tries_left(), {"$eq": [live, 0]}]},
            ]
        },
    }


def expired_by(now: dt.datetime) -> Document:
    """Past ``options.expires_at``. ``$type`` first: MongoDB never matches null (no expiry)
    with ``$lte`` a date, as its comparisons stay within a BSON type, but the wire engine
    did (it expired every task); with the type named, every engine agrees."""
    return {"options.expires_at": {"$type": "date", "$lte": now}}


def claim_one_of(claim: Document, task_id: Any, key: str) -> Document:
    """A batched claim's write for one candidate: the whole claim filter again, on that
    document alone (by ``_id``, and ``key``, the shard key of a sharded collection). Another
    worker may take a candidate between the read and this write: it then matches nothing.
    Each write is atomic on its document, so the invariant of `claim_filter` holds for each."""
    return {**claim, "_id": task_id, "key": key}


CANDIDATE_PROJECTION: Document = {"_id": 1, "key": 1, "options.priority": 1, "created_at": 1}


# ---------------------------------------------------------------- the quick claim

# The common case, claimed without the claim pipeline: a task nobody has claimed yet
# (no worker state at all) that one worker runs (``concurrent_worker_cnt`` 1). For it the
# pipeline's work is known in advance: nothing to sweep or trim, no slot or retry to count,
# and `recompute` gives a running task whose ``next_claim_at`` is the new lease's expiry.


def written_newer(document: Document) -> bool:
    """Whether a document, as read, is in a format newer than this version reads
    (`NEWER_FORMAT`, in Python): its fields may mean what this version cannot know."""
    stored = document.get("format", 1)
    return not isinstance(stored, int) or stored > c.DOCUMENT_FORMAT


def quick_claimable(document: Document) -> bool:
    """Whether a candidate, as read, is claimed by `quick_claim` (else by `claim_update`)."""
    options = document.get("options") or {}
    return (
        document.get("worker_states") == []  # `stages.UNTOUCHED`: `candidate_filter` relies on it
        and document.get("dropped_attempts") == 0
        and document.get("dropped_failures") == 0
        and options.get("concurrent_worker_cnt") == 1
        and type(document.get("version")) is int
        and type(options.get("worker_timeout_ms")) is int
    )


def quick_claim(
    document: Document,
    worker_id: str,
    run_id: str,
    now: dt.datetime,
    until: dt.datetime | None = None,
) -> tuple[Document, Document, Document]:
    """The filter, the update and the document after it of a `quick_claimable` candidate.

    Invariant that makes it safe: the filter is a compare-and-set on ``version``, and every
    write that changes a field the claim reads (the state, the worker states, the options,
    ``next_claim_at``, ``deps_pending``, the retry counts) ends in `recompute`, which bumps
    ``version`` (the classic updates that do not: dependent counts, the notified flag,
    ``wakes``, touch none of them). So a write that matches finds the document as the
    candidate read saw it, which matched `claim_filter` at this ``now`` (the read's
    `candidate_filter`, and the worker-state rules it leaves out hold of every
    `quick_claimable` task, which has no worker state and dropped none): the claim rules hold
    as for `claim_update`, and what that pipeline would compute is computed here from the
    read: one running state, state ``running``, ``next_claim_at`` the lease's expiry (the
    one slot is held), the other derived fields null (set only where the read had one not
    null). ``worker_states: {$size: 0}`` is checked by the server too, so a write that forgot
    ``version`` could not stack two states. A lost race matches nothing and costs its
    candidate, not a retry. A classic update: its values are stored as they are. The lease
    lasts the task's ``worker_timeout_ms``, or until ``until``, as in `claim_update`."""
    expires = until or now + dt.timedelta(milliseconds=document["options"]["worker_timeout_ms"])
    state = _new_state(worker_id, run_id, now, expires)
    fields: Document = {
        "worker_states": [state],
        "state": TaskState.RUNNING.value,
        "updated_at": now,
        "next_claim_at": expires,
    }
    for field in ("finished_at", "dependents_notified", "result", "error", "settled_at"):
        if document.get(field) is not None:
            fields[field] = None
    version = document["version"]
    query = {
        "_id": document["_id"],
        "key": document["key"],
        "version": version,
        "worker_states": {"$size": 0},
    }
    update = {"$set": fields, "$inc": {"version": 1}}
    return query, update, {**document, **fields, "version": version + 1}


# ``_id`` last: tasks published in one batch share ``created_at``, and an engine is free to
# order ties as it likes; with it, equal priority is strict FIFO everywhere.
CLAIM_SORT: list[tuple[str, int]] = [("options.priority", -1), ("created_at", 1), ("_id", 1)]


def claim_update(
    worker_id: str, run_id: str, now: dt.datetime, until: dt.datetime | None = None
) -> Pipeline:
    """Sweep expired states, append ours unless the sweep exhausted the retries (then the task
    fails and the caller gets no lease), recompute. One round trip, atomic. The lease lasts
    the task's ``worker_timeout_ms``, or until ``until`` (a lease owned for a chosen time)."""
    if until is None:
        return _claim_update(worker_id, run_id, now)
    return _claim_update_until(worker_id, run_id, now, until)


@templated
def _claim_update(worker_id: str, run_id: str, now: dt.datetime) -> Pipeline:
    return _claiming(worker_id, run_id, now, lease_expiry(now))


@templated
def _claim_update_until(
    worker_id: str, run_id: str, now: dt.datetime, until: dt.datetime
) -> Pipeline:
    return _claiming(worker_id, run_id, now, until)


def _new_state(worker: Any, run_id: Any, now: dt.datetime, expires: Any) -> Document:
    """A claim's worker state, the one shape of it: its values as stored (`quick_claim`),
    or as a pipeline's expressions (`_claiming`: caller values in ``$literal``)."""
    return {
        "worker_id": worker,
        "run_id": run_id,
        "state": RUNNING,
        "started_at": now,
        "ping_expire_at": expires,
        "pinged_at": None,  # a claim is no ping (`lease.ping_update` sets it)
        "finished_at": None,
        "error": None,
        "result": None,
    }


def _claiming(worker_id: str, run_id: str, now: dt.datetime, expires: Any) -> Pipeline:
    new_state = _new_state(literal(worker_id), literal(run_id), now, expires)
    # Ours is appended unless the sweep exhausted the retries, or no try is left (the
    # claim filter admits that only to end the task: `_claimable_by_states`); sweeping
    # changes no count of attempts. Without ours, `recompute` fails the task.
    return [
        sweep_expired(now),
        {
            "$set": {
                "worker_states": {
                    "$cond": [
                        {
                            "$and": [
                                retries_left(),
                                tries_left(),
                            ]
                        },
                        {"$concatArrays": [WORKER_STATES, [new_state]]},
                        WORKER_STATES,
                    ]
                }
            }
        },
        *recompute(now, run_id),
    ]


# ---------------------------------------------------------------- the consumer's fetch


def fetch_filter(names: Sequence[str], worker_id: str) -> Document:
    """Tasks that are or will become claimable by ``worker_id`` (pending, or running with a
    lease that may expire or a free slot), earliest first: the consumer's heap is filled from
    these. Tasks pinned to other workers, and those it already succeeded, are left out on the
    server: else a backlog of them would fill every fetch, leave the heap empty, and make the
    consumer fetch again at once, for ever."""
    return {
        "name": {"$in": list(names)},
        "state": {"$in": CLAIMABLE},
        "$or": [
            {"options.specific_worker_ids": {"$size": 0}},
            {"options.specific_worker_ids": worker_id},
            # Its own running tasks, pinned elsewhere meanwhile: when polling, the fetch is how
            # the executor learns it must stop them.
            {"worker_states": {"$elemMatch": {"worker_id": worker_id, "state": RUNNING}}},
        ],
        # $nor of $elemMatch, as in claim_filter: the form every engine here evaluates alike.
        "$nor": [{"worker_states": {"$elemMatch": {"worker_id": worker_id, "state": SUCCESS}}}],
    }


def due_filter(name: str, now: dt.datetime, worker_ids: Sequence[str] | None) -> Document:
    """Tasks of ``name`` due for a claim now, by one of ``worker_ids`` (None: by any worker):
    what a poll reads by state, not by the time of the last write (see `discovery.TaskHub`
    on why both). Tasks pinned to other workers are left out on the server: due for ever
    to this process's consumers, a page of them would hide every task due after them."""
    found: Document = {
        "name": name,
        "state": {"$in": CLAIMABLE},
        "next_claim_at": {"$lte": now},
        "deps_pending": {"$size": 0},
    }
    if worker_ids is not None:
        found["$or"] = [
            {"options.specific_worker_ids": {"$size": 0}},
            {"options.specific_worker_ids": {"$in": list(worker_ids)}},
        ]
    return found


def terminal_of(keys: Sequence[str]) -> Document:
    """The tasks of ``keys`` that have ended: what a waiter polls for."""
    return {"key": {"$in": list(keys)}, "state": {"$in": TERMINAL}}


FETCH_SORT: list[tuple[str, int]] = [("next_claim_at", 1)]
# A task as published: what the size budget of new options is checked against.
GROWING_FIELDS_EXCLUDED: Document = {"worker_states": 0, "result": 0, "error": 0}
FETCH_PROJECTION: Document = {"payload": 0, "result": 0, "worker_states.result": 0}


# ---------------------------------------------------------------- options


def options_filter(key: str) -> Document:
    return {"key": key, "state": {"$nin": TERMINAL}}


def options_update(options: TaskOptions, now: dt.datetime) -> Pipeline:
    """New options take effect at once: the state and ``next_claim_at`` follow them, and the
    consumers watching the task see the change (a worker no longer in
    ``specific_worker_ids`` stops; a new ping interval applies from the next ping)."""
    return [
        sweep_expired(now),
        {
            "$set": {
                "options": literal(options.to_document()),
                "not_before": options.not_before,
            }
        },
        wake_consumers(),  # a holder takes the new ping interval, or stops if excluded
        *recompute(now),
    ]


# ---------------------------------------------------------------- operating


def list_filter(name: str | None, state: str | None) -> Document:
    query: Document = {}
    if name is not None:
        query["name"] = name
    if state is not None:
        query["state"] = state
    return query


LIST_SORT: list[tuple[str, int]] = [("_id", -1)]  # newest first


def purge_filter(states: Sequence[str], finished_before: dt.datetime) -> Document:
    """Finished before the cutoff, and with every dependent told of the outcome: a task whose
    dependents were not told yet (its writer crashed or lost the network in between) is kept
    until recovery has told them, or they would wait for it for ever."""
    return {
        "state": {"$in": list(states)},
        "finished_at": {"$lt": finished_before},
        "dependents_notified": {"$ne": False},
    }


def cancelled_by_filter(key: str) -> Document:
    """The dependents that ``key``'s failure or cancellation cancelled (served by the
    dependents index): a ``DependencyFailed`` cancellation that lists it among the failed."""
    return {
        "depends_on": key,
        "deps_failed": key,
        "state": TaskState.CANCELLED.value,
        "error.type": "DependencyFailed",
    }


# The order `cancelled_by` lists them in: by key, so a retry revives them in a stable order.
CANCELLED_BY_ORDER: list[tuple[str, int]] = [("key", 1)]


def failed_filter(name: str | None) -> Document:
    query: Document = {"state": TaskState.FAIL.value}
    if name is not None:
        query["name"] = name
    return query


# ---------------------------------------------------------------- statistics


def stats_pipeline() -> Pipeline:
    """Counts by name and state in one pass; the leading sort walks the claim index."""
    running = {"$filter": {"input": WORKER_STATES, "as": "ws", "cond": state_is(RUNNING)}}
    return [
        {"$sort": {"name": 1, "state": 1}},
        {
            "$group": {
                "_id": {"name": "$name", "state": "$state"},
                "count": {"$sum": 1},
                "running_workers": {"$sum": {"$size": running}},
                "oldest_created_at": {"$min": PUBLISHED_AT},
            }
        },
    ]


def held_by_worker_pipeline(now: dt.datetime, listed: int) -> Pipeline:
    """What each worker holds now, read from the tasks themselves (the live workers view,
    `store.workers`): per worker id, ``running`` (its live running states), ``keys`` (up to
    ``listed`` of their task keys), ``lease_until`` (the latest expiry of its live leases)
    and ``lease_lost_at`` (the latest expiry among its leases that expired: running states
    past their ``ping_expire_at``, and ``timeout`` states, ended at their expiry, of tasks
    another worker took over) with ``lease_lost_claimed_at`` (the latest claim among those).
    Exact as of the last write of each task, at no write of its own.

    Only running tasks are read: every live state is in one, since a task holding a running
    state is ``running`` unless it is blocked or terminal (`recompute`: a terminal task holds
    none). Served by the finished index (its ``state`` prefix); the cost is one read of each
    running task, not of the collection."""
    state = "$worker_states.state"
    expiry = "$worker_states.ping_expire_at"
    live = {"$and": [{"$eq": [state, RUNNING]}, {"$gt": [expiry, now]}]}
    lost_at = {
        "$cond": [
            {"$eq": [state, TIMEOUT]},
            "$worker_states.finished_at",
            {"$cond": [live, None, expiry]},
        ]
    }
    # When each lost lease was claimed: a worker restarted under the same id did not lose the
    # leases of its previous life (`liveness.judged` compares it with its start).
    lost_claimed_at = {
        "$cond": [
            {"$eq": [state, TIMEOUT]},
            "$worker_states.started_at",
            {"$cond": [live, None, "$worker_states.started_at"]},
        ]
    }
    held = {"$filter": {"input": "$keys", "as": "k", "cond": {"$ne": ["$$k", None]}}}
    return [
        {"$match": {"state": TaskState.RUNNING.value}},
        {"$unwind": "$worker_states"},
        {"$match": {"worker_states.state": {"$in": [RUNNING, TIMEOUT]}}},
        {
            "$group": {
                "_id": "$worker_states.worker_id",
                "running": {"$sum": {"$cond": [live, 1, 0]}},
                "keys": {"$push": {"$cond": [live, "$key", None]}},
                "lease_until": {"$max": {"$cond": [live, expiry, None]}},
                "lease_lost_at": {"$max": lost_at},
                "lease_lost_claimed_at": {"$max": lost_claimed_at},
            }
        },
        {"$set": {"keys": {"$slice": [held, -listed]}}},
    ]


# ---------------------------------------------------------------- cancel


def cancel_filter(key: str) -> Document:
    return {"key": key, "state": {"$nin": TERMINAL}}


def cancel_many_filter(name: str, states: Sequence[str]) -> Document:
    """`Scheduler.cancel_many`: the tasks of ``name`` in ``states`` (unfinished ones, which
    the caller checked: a task that ended meanwhile no longer matches, and is left as it
    ended). Served by ``claim_time`` (name, state)."""
    return {"name": name, "state": {"$in": list(states)}}


def cancel_update(reason: str, now: dt.datetime) -> Pipeline:
    """Cancelled is terminal: `recompute` releases the running states, so their holders'
    next ping fails with `LeaseLost` and their handlers are cancelled."""
    error = ErrorInfo.from_message("Cancelled", reason).model_dump()
    return [
        sweep_expired(now),
        {"$set": {"state": TaskState.CANCELLED.value, "error": literal(error)}},
        wake_consumers(),  # its holders stop their handlers now, not at their next ping
        *recompute(now),
    ]


def running_of(name: str) -> Document:
    """The running tasks of ``name`` (served by ``claim_time``: name, state), whose live
    attempts a ``max_running`` set now counts (`queries.limits.adopt`)."""
    return {"name": name, "state": TaskState.RUNNING.value}


RUNNING_ATTEMPTS: Document = {
    "_id": 0,
    "options.partition": 1,
    "worker_states.run_id": 1,
    "worker_states.state": 1,
    "worker_states.ping_expire_at": 1,
}
