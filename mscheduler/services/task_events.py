"""Task events (`TaskEvent`) across processes, derived from the writes the process's discovery
hub hands out: no stream of their own, and nothing written for them.

A listener subscribes to the hub for every write of its names (as a watch does) and keeps,
per task, what it saw last (`_Seen`: the attempts' states, the task's state, the progress).
The events of a write are the difference between that and the new full document: an attempt
that appears is ``started``, one that turned ``fail``/``timeout`` is ``failed``, a new
progress is ``progress``, and a task never seen (or with a new ``created_at``: a finished one
replaced) is first ``published``. The task's end comes from the task, not from its attempts:
its state turning ``success``/``cancelled``/``fail`` is one ``succeeded``/``cancelled``/
``failed`` event. A failed task's end is told by the attempt whose failure ended it (the last
to fail), or as the task's own when its tries ran out on an attempt that did not fail; the
other attempts' failures are ``failed`` with ``will_retry`` (the task ran on after them), and
an attempt given back as the task ended (``released``: another attempt's failure ended it)
tells nothing.

Invariant: each event of a task is told once, in the order written, and a task's end once. A
version no newer than the one seen is ignored (a stream reopened from an earlier place
replays writes); the events of one version come attempt by attempt in claim order, each
attempt's start before its end, ``published`` first and the task's own end last, so a failed
attempt always comes before the retry that follows it, whatever the writers' clocks.

Where versions are missed the events are derived from the newest one: a poll (no change
streams) sees only the latest version of a task at each read, and a stream's full document is
the task when the event is read, not when it was written. What a document keeps is still
told (a failed attempt and the next one's start are both in ``worker_states``); what it does
not is lost: a progress overwritten before it was seen, and attempts trimmed from the
history. A progress is told when its fraction, message or reporter changes (every ping writes
the last report again, stamped anew). An attempt released (a worker's shutdown,
``RetryLater``) has no event of its own.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any, NamedTuple

from ..models import (
    Progress,
    Task,
    TaskEvent,
    TaskEventKind,
    TaskState,
    WorkerState,
    WorkerStateKind,
)
from ..store.whole import WholeStore
from ..worker_options import WorkerOptions
from .discovery import CLOCK_SKEW, RESYNC, Subscription, TaskHub

log = logging.getLogger(__name__)

# Tasks whose last version a listener remembers; the least recently written are forgotten.
REMEMBERED_TASKS = 100_000
_FAILED = (WorkerStateKind.FAIL, WorkerStateKind.TIMEOUT)


class _Seen(NamedTuple):
    """What a listener saw last of one task: enough to tell what a newer version changed."""

    id: Any
    created_at: dt.datetime
    version: int
    updated_at: dt.datetime
    state: TaskState | None
    attempts: dict[str, WorkerStateKind]  # run_id -> state
    progress: Progress | None


def _seen(task: Task) -> _Seen:
    attempts = {ws.run_id: ws.state for ws in task.worker_states}
    return _Seen(
        task.id, task.created_at, task.version, task.updated_at, task.state, attempts, task.progress
    )


def derive(before: _Seen | None, task: Task) -> list[TaskEvent]:
    """The events of the writes between ``before`` (None: none seen) and ``task``, in the
    order written (see the module)."""

    def event(kind: TaskEventKind, at: dt.datetime | None, **fields: Any) -> TaskEvent:
        return TaskEvent(
            kind=kind,
            key=task.key,
            name=task.name,
            at=at or task.updated_at,
            version=task.version,
            **fields,
        )

    fresh = before is None or before.id != task.id or before.created_at != task.created_at
    events: list[TaskEvent] = []
    if fresh:
        events.append(event("published", task.created_at))
    attempts: dict[str, WorkerStateKind] = {} if before is None or fresh else before.attempts
    progress = None if before is None or fresh else before.progress
    reporting = _reporting(task)
    reported = _reported(task.progress) != _reported(progress)
    ended = fresh or before is None or before.state is not task.state
    ending = _ending(task, attempts) if ended and task.state is TaskState.FAIL else None
    for index, ws in enumerate(task.worker_states):
        was = attempts.get(ws.run_id)
        if was is None:
            events.append(event("started", ws.started_at, **_by(ws)))
        if ws is reporting and reported and task.progress is not None:
            events.append(event("progress", task.progress.at, progress=task.progress, **_by(ws)))
        if ws.state in _FAILED and was not in _FAILED and ws is not ending:
            # Not the task's end: it ran on after this one (or a failure ended it later).
            later = index + 1 < len(task.worker_states)
            will_retry = later or not task.state.is_terminal or task.state is TaskState.FAIL
            events.append(
                event("failed", ws.finished_at, will_retry=will_retry, error=ws.error, **_by(ws))
            )
    if reporting is None and reported and task.progress is not None:
        events.append(event("progress", task.progress.at, progress=task.progress))
    if not ended:
        return events
    if task.state is TaskState.SUCCESS:
        done = [ws for ws in task.worker_states if ws.state is WorkerStateKind.SUCCESS]
        last = _by(done[-1]) if done else {}
        events.append(event("succeeded", task.finished_at, result=task.result, **last))
    elif task.state is TaskState.CANCELLED:
        events.append(event("cancelled", task.finished_at, error=task.error))
    elif task.state is TaskState.FAIL and ending is not None:
        events.append(
            event("failed", ending.finished_at, will_retry=False, error=ending.error, **_by(ending))
        )
    elif task.state is TaskState.FAIL:  # no attempt failed as it ended: its tries ran out
        last = _by(task.worker_states[-1]) if task.worker_states else {}
        events.append(event("failed", task.finished_at, will_retry=False, error=task.error, **last))
    return events


def _ending(task: Task, seen: dict[str, WorkerStateKind]) -> WorkerState | None:
    """The attempt whose failure ended ``task`` (failed): of the attempts that failed since
    ``seen``, the last to end (failures end in the order written: a lease's expiry is swept by
    the next write). None when no attempt failed since, or when the task's error is none of
    its failed attempts' (its tries ran out on an attempt that did not fail): the end is then
    the task's own."""
    failed = [ws for ws in task.worker_states if ws.state in _FAILED]
    new = [ws for ws in failed if seen.get(ws.run_id) not in _FAILED]
    if not new or all(ws.error != task.error for ws in failed):
        return None
    # The latest end; of attempts that ended at once (leases swept together), the last claimed.
    return max(reversed(new), key=lambda ws: ws.finished_at or task.updated_at)


def _by(ws: WorkerState) -> dict[str, Any]:
    return {"worker_id": ws.worker_id, "run_id": ws.run_id}


def _reported(progress: Progress | None) -> tuple[Any, ...] | None:
    """A report, as told: each ping writes the last one again, stamped anew."""
    if progress is None:
        return None
    return (progress.fraction, progress.message, progress.worker_id)


def _reporting(task: Task) -> WorkerState | None:
    """The attempt whose progress the task shows: the running one of its reporter."""
    if task.progress is None:
        return None
    running = [
        ws
        for ws in task.worker_states
        if ws.worker_id == task.progress.worker_id and ws.state is WorkerStateKind.RUNNING
    ]
    return running[-1] if running else None


class EventLog:
    """What one listener saw of each task, and the events of each version it is handed.

    Memory is bounded: past `REMEMBERED_TASKS` the task written least recently is forgotten.
    A task seen for the first time (never, or since forgotten) shows only the events stamped
    after ``horizon``: the time the listener started, moved on to the last write of each
    forgotten task, whose events were told already."""

    def __init__(self, since: dt.datetime, remembered: int = REMEMBERED_TASKS) -> None:
        self.horizon = since
        self._remembered = remembered
        self._seen: collections.OrderedDict[str, _Seen] = collections.OrderedDict()

    def take(self, task: Task) -> list[TaskEvent]:
        before = self._seen.get(task.key)
        if (
            before is not None
            and before.id == task.id
            and before.created_at == task.created_at
            and before.version >= task.version
        ):
            return []  # seen already, or older than what was
        events = derive(before, task)
        if before is None:
            events = [event for event in events if event.at >= self.horizon]
        self._seen[task.key] = _seen(task)
        self._seen.move_to_end(task.key)
        while len(self._seen) > self._remembered:
            _, forgotten = self._seen.popitem(last=False)
            # Strictly after its last write: the events at that instant were told.
            self.horizon = max(self.horizon, forgotten.updated_at + dt.timedelta(milliseconds=1))
        return events


class TaskEvents:
    """The events of the tasks (of ``names``), an async iterator, from the first step on,
    through the process's discovery hub: it shares the stream or poll the process runs, and
    runs it itself while nobody else does.

    Iterated bare, it is subscribed from its first step to its close (`TaskHub.follow`), and
    serves the hub only while it waits: alone in its process, the stream is reopened (from
    the kept resume token, nothing lost) after each wait. Used as ``async with``, it holds the
    hub for the block (`TaskHub.subscription`): the stream stays open, and it is subscribed
    from the block's start. A resync (this listener fell behind, or the stream lost its
    place) reads the tasks written since the last write seen, less `CLOCK_SKEW`: compared
    with what was seen, nothing is told twice; what changed more than once meanwhile is told
    from its newest version."""

    def __init__(
        self,
        store: WholeStore,
        hub: TaskHub,
        names: Sequence[str] | None,
        poll_interval_ms: int = 1_000,
    ) -> None:
        self._store = store
        self._hub = hub
        self._names = list(names) if names else None
        self._sub = Subscription(
            WorkerOptions(poll_interval_ms=poll_interval_ms), every=self._names or [None]
        )
        self._seen: EventLog | None = None  # from the subscription on
        self._latest = store.clock.now()  # the newest write seen: where a resync reads from
        self._ready: collections.deque[TaskEvent] = collections.deque()
        self._held: contextlib.AsyncExitStack | None = None
        self._follow: AsyncGenerator[Task | None, None] | None = None
        self._closed = False

    def _subscribed(self) -> EventLog:
        if self._seen is None:
            self._latest = self._store.clock.now()
            self._seen = EventLog(self._latest)
        return self._seen

    async def __aenter__(self) -> TaskEvents:
        if self._follow is not None or self._held is not None:
            raise RuntimeError("these events are iterated already: enter them before")
        held = contextlib.AsyncExitStack()
        self._subscribed()  # before the subscription: a task published meanwhile is told
        await held.enter_async_context(self._hub.subscription(self._sub))
        self._held = held
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> TaskEvents:
        return self

    async def __anext__(self) -> TaskEvent:
        while not self._ready:
            write = await self._next_write()
            self._ready.extend(await self._told(write))
        return self._ready.popleft()

    async def _next_write(self) -> Task | None:
        if self._closed:
            raise StopAsyncIteration
        if self._held is not None:
            return await self._sub.next()
        if self._follow is None:
            self._subscribed()
            self._follow = self._hub.follow(self._sub)
        return await anext(self._follow)

    async def _told(self, write: Task | None) -> list[TaskEvent]:
        seen = self._subscribed()
        if write is RESYNC:
            log.warning(
                "events: fell behind the process's change stream (or it lost its place); "
                "reading the tasks written since %s again",
                self._latest,
                extra={"action": "events_resync"},
            )
            tasks = await self._store.changed_since(self._latest - CLOCK_SKEW, self._names)
        else:
            tasks = [write]
        told: list[TaskEvent] = []
        for task in tasks:
            self._latest = max(self._latest, task.updated_at)
            told += seen.take(task)
        return told

    async def aclose(self) -> None:
        """Unsubscribed (at the end of ``async with`` too); the iteration ends."""
        self._closed = True
        follow, self._follow = self._follow, None
        if follow is not None:
            await follow.aclose()
        held, self._held = self._held, None
        if held is not None:
            await held.aclose()
