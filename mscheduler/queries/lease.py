"""The fenced writes of a lease holder: the lease half of the queries.

Every write here matches ``key + worker_id + run_id + state: running + ping_expire_at > now``
(`lease_filter`), so only the current holder of a live lease can ping, finish or release.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..models import ErrorInfo, Progress, Task, TaskState
from . import retry_delay
from .derived import recompute
from .stages import (
    FAIL,
    RELEASED,
    RUNNING,
    SUCCESS,
    WORKER_STATES,
    Document,
    Pipeline,
    lease_expiry,
    literal,
    map_states,
    rebuilt_state,
    sweep_expired,
)
from .templates import templated


def by_run(run_id: str) -> Document:
    """The task a claim with this ``run_id`` went to (served by the ``run_id`` index). A run_id
    is a fresh random token per claim (`models.new_run_id`), so at most one task matches;
    the caller checks the worker."""
    return {"worker_states.run_id": run_id}


def by_runs(run_ids: Sequence[str]) -> Document:
    """The tasks a batched claim went to: one ``run_id`` per task it tried."""
    return {"worker_states.run_id": {"$in": list(run_ids)}}


def runs_of(keys: Sequence[str], run_ids: Sequence[str]) -> Document:
    """Of the tasks ``keys``, those a batched claim went to (one ``run_id`` per task it
    tried). Sought by key, the unique index, one seek per candidate on every engine (the
    wire engine scans the whole collection for ``$in`` on the ``run_id`` index)."""
    return {"key": {"$in": list(keys)}, "worker_states.run_id": {"$in": list(run_ids)}}


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
                "state": RUNNING,
                "ping_expire_at": {"$gt": now},
            }
        },
    }


def _own_state(worker_id: str, run_id: str, **overrides: Any) -> Document:
    return map_states(
        {
            "$and": [
                {"$eq": ["$$ws.run_id", literal(run_id)]},
                {"$eq": ["$$ws.worker_id", literal(worker_id)]},
            ]
        },
        rebuilt_state(**overrides),
    )


def _end_own_state(
    worker_id: str, run_id: str, state: str, now: dt.datetime, **fields: Any
) -> Document:
    """The writer's own state ends now: it holds the lease no more (no ``ping_expire_at``)."""
    return _own_state(
        worker_id, run_id, state=state, ping_expire_at=None, finished_at=now, **fields
    )


def ping_update(
    worker_id: str,
    run_id: str,
    now: dt.datetime,
    progress: Progress | None = None,
    until: dt.datetime | None = None,
) -> Pipeline:
    """Extend the lease by the task's ``worker_timeout_ms``, or to ``until`` (a lease owned
    for a chosen time); with ``progress``, record what the handler reported (it rides on
    the ping: no write of its own)."""
    if until is None:
        extended = _extend_lease(worker_id, run_id, now)
    else:
        extended = _extend_lease_to(worker_id, run_id, now, until)
    if progress is None:
        return extended
    reported = progress.model_copy(update={"worker_id": worker_id, "at": now}).model_dump()
    sweep, own, *derived = extended
    return [sweep, own, {"$set": {"progress": literal(reported)}}, *derived]


@templated
def _extend_lease(worker_id: str, run_id: str, now: dt.datetime) -> Pipeline:
    return [
        sweep_expired(now),
        _own_state(worker_id, run_id, ping_expire_at=lease_expiry(now), pinged_at=now),
        *recompute(now, run_id),
    ]


@templated
def _extend_lease_to(worker_id: str, run_id: str, now: dt.datetime, until: dt.datetime) -> Pipeline:
    return [
        sweep_expired(now),
        _own_state(worker_id, run_id, ping_expire_at=until, pinged_at=now),
        *recompute(now, run_id),
    ]


@templated
def success_update(worker_id: str, run_id: str, result: Any, now: dt.datetime) -> Pipeline:
    return [
        sweep_expired(now),
        _end_own_state(worker_id, run_id, SUCCESS, now, result=literal(result)),
        *recompute(now, run_id),
    ]


# The common case, finished without the success pipeline: the consumer's success of a task
# whose only worker state is this lease's and that one worker runs, with no dependents.


def quick_success_possible(lease_task: Task, run_id: str) -> bool:
    """Whether the task as its lease holder knows it is in the form `quick_success` writes:
    its one worker state is this run's, ``concurrent_worker_cnt`` 1, no dependents. The write
    checks all three again (`quick_success_filter`), so a task that changed meanwhile is
    missed, not overwritten."""
    states = lease_task.worker_states
    return (
        len(states) == 1
        and states[0].run_id == run_id
        and lease_task.options.concurrent_worker_cnt == 1
        and lease_task.dependent_count == 0
    )


def quick_success_filter(key: str, worker_id: str, run_id: str, now: dt.datetime) -> Document:
    """`lease_filter` (this run's state live) and the conditions `quick_success` holds under:
    that state is the only one, one worker runs the task, nobody waits for it. The size and
    the fence go in one operator document of ``worker_states`` (both must hold of the one
    array): the smallest form of this filter, sent once per task."""
    fence = lease_filter(key, worker_id, run_id, now)
    return {
        "key": key,
        "worker_states": {"$size": 1, **fence["worker_states"]},
        "options.concurrent_worker_cnt": 1,
        "dependent_count": 0,
    }


def quick_success(result: Any, now: dt.datetime) -> Document:
    """`success_update` as a classic update of the fields it changes, for a task matched by
    `quick_success_filter`. Invariant that makes it safe: under that filter
    the task holds one worker state, this run's, live (nothing to sweep or trim), one worker
    runs it and nobody waits for it; for such a task `recompute` gives exactly this: the
    state succeeded with ``result``, the task ``success`` with ``result``, finished and
    settled now, no ``next_claim_at`` or ``progress``, and no wake (nothing became
    claimable, no dependent to tell). The fields it leaves are null already, as `recompute`
    leaves them on a running task of one running state (``error``, ``dependents_notified``;
    ``result`` when there is none), and no classic update sets them on a running task.
    Values are stored as they are (a result has no ``$`` field names: `check_result`)."""
    fields: Document = {
        "worker_states.0.state": SUCCESS,
        "worker_states.0.ping_expire_at": None,
        "worker_states.0.finished_at": now,
        "state": TaskState.SUCCESS.value,
        "updated_at": now,
        "next_claim_at": None,
        "finished_at": now,
        "settled_at": now,
        "progress": None,
    }
    if result is not None:
        fields["worker_states.0.result"] = result
        fields["result"] = result
    return {"$set": fields, "$inc": {"version": 1}}


def fail_update(
    worker_id: str,
    run_id: str,
    error: ErrorInfo,
    now: dt.datetime,
    *,
    spread: float = 0.0,
    final: bool = False,
) -> Pipeline:
    """A handler failure counts against the retries and delays the next claim
    (`retry_delay.after_failure`, its jitter drawn as ``spread``: `retry_delay.draw_spread`).
    ``final`` (the handler raised `Abort`) ends the task as failed whatever retries are left."""
    return [
        sweep_expired(now),
        _end_own_state(worker_id, run_id, FAIL, now, error=literal(error.model_dump())),
        retry_delay.after_failure(now, spread),
        *([{"$set": {"state": TaskState.FAIL.value}}] if final else []),
        *recompute(now, run_id),
    ]


def retry_later_update(
    worker_id: str, run_id: str, reason: str, retry_at: dt.datetime, now: dt.datetime
) -> Pipeline:
    """The handler asked to be run again later (`RetryLater`): the slot is given back, the
    task is claimable from ``retry_at``, and it is not an unexpected failure."""
    return [
        sweep_expired(now),
        _end_own_state(
            worker_id,
            run_id,
            RELEASED,
            now,
            error=literal(ErrorInfo.from_message("RetryLater", reason).model_dump()),
        ),
        {"$set": {"retry_at": retry_at}},
        *recompute(now, run_id),
    ]


def unclaim_update(worker_id: str, run_id: str, now: dt.datetime) -> Pipeline:
    """Undo a claim whose handler never started (its partition filled in between:
    `consumer.limits.Limiter.take`): the run's state leaves the history, so the task is as
    the claim found it, claimable at once.

    Invariant: a run whose handler never started counts as no attempt: ``max_tries`` and
    the retries count the runs that were given to a handler, so a claim lost to a race
    uses up none of them (a release, which records the run, would count one)."""
    others = {
        "$filter": {
            "input": WORKER_STATES,
            "as": "ws",
            # A run_id is the run's alone (the fence, `lease_filter`, checked its worker).
            "cond": {"$ne": ["$$ws.run_id", literal(run_id)]},
        }
    }
    return [sweep_expired(now), {"$set": {"worker_states": others}}, *recompute(now)]


def release_update(worker_id: str, run_id: str, reason: str, now: dt.datetime) -> Pipeline:
    """Give the slot back at once (graceful shutdown): not a failure, claimable immediately."""
    return [
        sweep_expired(now),
        _end_own_state(
            worker_id,
            run_id,
            RELEASED,
            now,
            error=literal(ErrorInfo.from_message("Released", reason).model_dump()),
        ),
        *recompute(now, run_id),
    ]
