"""When a lease or a worker is dead: the rules every reader applies, named once.

A lease (a worker's running state of a task, `WorkerState`):

- lasts ``worker_timeout_ms`` from its claim or its last ping (`lease_expiry`; the server's
  writes compute it as `queries.stages.lease_expiry`), written as ``ping_expire_at``;
- is live while it runs and its ``ping_expire_at`` has not passed (`lease_is_live`; on the
  server `queries.stages.is_live`, and `queries.stages.sweep_expired` ends an expired one as
  ``timeout`` in the next write of its task, which `queries.tasks.claim_filter` allows);
- is given up by its holder `expiry_margin` before that expiry, by the holder's clock
  (`consumer.executor` stops the handler then), so that another worker, which judges the
  expiry by its own clock, finds it stopped.

A worker (its entry in the live workers, `WorkerInfo`, `store.workers`) is dead from the
first of two promises it broke (`judged`):

- a heartbeat every ``heartbeat_ms``: dead `STALE_AFTER_BEATS` heartbeats after its last
  (`stale_at`);
- a ping of every lease it holds: dead when its leases expired after its last heartbeat and
  none is live.

The first read that finds a worker dead records it in its entry (``found_dead``,
`store.workers`); later reads keep that until it beats again.
"""

from __future__ import annotations

import datetime as dt

from .models import WorkerInfo, WorkerState, WorkerStateKind

# A worker is dead once it missed this many heartbeats: one late write is not a death, and
# two heartbeats are a task's lease at the default ping interval and worker timeout.
STALE_AFTER_BEATS = 2


def lease_expiry(now: dt.datetime, worker_timeout_ms: int) -> dt.datetime:
    """The end of a lease claimed or pinged at ``now``."""
    return now + dt.timedelta(milliseconds=worker_timeout_ms)


def lease_is_live(state: WorkerState, now: dt.datetime) -> bool:
    """Whether ``state`` is a lease that still holds its task at ``now``."""
    return (
        state.state is WorkerStateKind.RUNNING
        and state.ping_expire_at is not None
        and state.ping_expire_at > now
    )


def expiry_margin(worker_timeout_ms: int) -> dt.timedelta:
    """How long before its lease expires a worker stops the handler: a tenth of the timeout.

    Another worker judges the lease by its own clock. If the holder stopped only at the
    expiry by *its* clock, a holder whose clock is behind would still run while the other
    claims. With this margin, at most ``concurrent_worker_cnt`` handlers run at once while
    the workers' clocks differ by less than a tenth of ``worker_timeout_ms``."""
    return dt.timedelta(milliseconds=worker_timeout_ms / 10)


def stale_at(worker: WorkerInfo) -> dt.datetime:
    """When ``worker`` breaks its heartbeat promise, unless it beats again."""
    return worker.last_seen_at + dt.timedelta(milliseconds=worker.heartbeat_ms * STALE_AFTER_BEATS)


def judged(worker: WorkerInfo, now: dt.datetime) -> WorkerInfo:
    """``worker``'s entry with ``alive`` and ``dead_since`` as of ``now``. Dead since the first
    promise it broke: a heartbeat (`stale_at`), or its leases, when all of them expired after
    its last heartbeat (a worker that beat since was alive then: it only lost a lease, say to
    a stall). A lease lost to a takeover is a ``timeout`` state of a task that runs again,
    counted in ``lease_lost_at`` too, so the worker stays dead while that task runs; once it
    ended, only the heartbeat rule is left to judge by (the tasks that ended are not read:
    their number grows without bound). Leases claimed before this instance started (a worker
    restarted under the same id) are its previous life's: they say nothing of this one. A
    death recorded (``found_dead``) is kept."""
    if worker.found_dead is not None:
        return worker.model_copy(update={"alive": False, "dead_since": worker.found_dead.since})
    dead_since = stale_at(worker)
    lost = worker.lease_lost_at
    pinging = worker.lease_until is not None and worker.lease_until > now
    claimed = worker.lease_lost_claimed_at
    previous_life = claimed is not None and claimed < worker.started_at
    if lost is not None and lost > worker.last_seen_at and not pinging and not previous_life:
        dead_since = min(dead_since, lost)
    alive = now < dead_since
    return worker.model_copy(update={"alive": alive, "dead_since": None if alive else dead_since})
