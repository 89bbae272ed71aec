"""The discovery hub: one task change stream per process (per `Store`, so per `Scheduler`),
or on a server without change streams one poll loop, shared by every consumer, waiter and
watch of that process. Each of them subscribes (`TaskHub.subscription`; a watch, an async
iterator, with `TaskHub.follow`) with what it wants to
hear of: a consumer the writes that may give it work on its names, a waiter the state changes
of its keys, a watch every write of its names. The hub hands each subscriber the tasks for it.

The stream is opened on the database (``db.watch()``), filtered on the server to the tasks
collection and the control version beside it (`controls`): one stream per process carries the
tasks' changes to the consumers, waiters and watches, and the control changes to the process's
`controls.ControlHub`, a subscriber like them (``controls=True``). Where the server refuses a
stream on the whole database (a role granted ``changeStream`` on the tasks collection alone:
Unauthorized, 13; a server with streams on collections only), the hub watches the tasks
collection alone and the `ControlHub` keeps a stream of its own on the version: two per
process, said once. Where the server refuses that too, the process polls (below).

Stream: opened *before* a subscriber's first read, with the union of the subscribers' filters
(`hub_pipeline`); a subscriber the open stream does not cover reopens it from the resume token
with the wider filter, so nobody loses an event. On error it reopens from the token (after an
``invalidate``, with ``startAfter`` it); when the server cannot resume, or keeps failing at one
token, it opens afresh and tells every subscriber to resync (a full read). A refusal of change
streams (`streams.refuses_streams`) switches the process to polling, logged once, and with
``discovery="auto"`` the stream is tried again every ``stream_retry_interval_ms``.

Poll: one read per interval for the whole process (`poller.Poller.poll_once`): the tasks of the
subscribers' names written since the previous read began, less `CLOCK_SKEW` (writers stamp
``updated_at`` with their own clocks); and every `STATE_READ_INTERVAL` at most, read by state
rather than by that stamp, the consumers' tasks due for a claim and the waiters' tasks that
ended. A write stamped long before it became visible (a slow transaction) escapes the first
read, never the others. Each version of a task is handed out once.

The modules, one concept each: `subscriptions` (what a subscriber hears of, its buffer),
`filters` (the stream's pipeline, what an open stream covers, `may_wake`), `poller` (the poll's
reads and its place), `hub` (`TaskHub`: the subscribers, who runs the stream or the poll,
the stream's place). Each position (the stream's resume token, the poll's place) lives only
while a subscriber does (`TaskHub` ``_leave``).

Invariant: no event is lost without a resync. A subscriber's buffer is bounded; a subscriber
that falls behind has its buffer dropped and gets `RESYNC` in its place, the same signal as a
stream that could not resume: it reads everything it needs again, so a slow one never blocks
the others and never silently misses a change.
"""

from .filters import hub_pipeline, may_wake
from .hub import TaskHub
from .poller import (
    CLOCK_SKEW,
    DUE_NAMES_PER_POLL,
    DUE_PAGE,
    ENDED_KEYS_PER_POLL,
    STATE_READ_INTERVAL,
)
from .subscriptions import BUFFER_SIZE, RESYNC, Subscription

__all__ = [
    "BUFFER_SIZE",
    "CLOCK_SKEW",
    "DUE_NAMES_PER_POLL",
    "DUE_PAGE",
    "ENDED_KEYS_PER_POLL",
    "RESYNC",
    "STATE_READ_INTERVAL",
    "Subscription",
    "TaskHub",
    "hub_pipeline",
    "may_wake",
]
