"""The discovery hub: one task change stream per process (per `TaskStore`, so per `Scheduler`),
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

Poll: one read per interval for the whole process (`TaskHub._poll_once`): the tasks of the
subscribers' names written since the previous read began, less `CLOCK_SKEW` (writers stamp
``updated_at`` with their own clocks); and every `STATE_READ_INTERVAL` at most, read by state
rather than by that stamp, the consumers' tasks due for a claim and the waiters' tasks that
ended. A write stamped long before it became visible (a slow transaction) escapes the first
read, never the others. Each version of a task is handed out once.

Invariant: no event is lost without a resync. A subscriber's buffer is bounded; a subscriber
that falls behind has its buffer dropped and gets `RESYNC` in its place, the same signal as a
stream that could not resume: it reads everything it needs again, so a slow one never blocks
the others and never silently misses a change.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any, Final, NamedTuple

import anyio
from anyio.abc import TaskStatus
from pydantic import ValidationError
from pymongo.errors import OperationFailure, PyMongoError

from ..backoff import Backoff
from ..clock import Clock
from ..errors import BackendUnavailable, ConfigurationError
from ..models import Task, TaskState
from ..worker_options import Discovery, WorkerOptions
from .base import KEYS_PER_READ, StoreBase
from .streams import (
    CONSUMER_NEEDLESS,
    MAX_AWAIT_MS,
    RESUME_IMPOSSIBLE,
    UNAUTHORIZED,
    WAITER_NEEDLESS,
    OneRunner,
    ResumePoint,
    close_quietly,
    open_change_stream,
    open_unless_refused,
    refuses_streams,
    without,
)

log = logging.getLogger(__name__)

# Handed to a subscriber in place of the events it lost: read everything you need again.
RESYNC: Final = None
# Events a subscriber may have waiting before it is told to resync instead.
BUFFER_SIZE = 10_000
# How far behind the previous poll a poll reads again: writers' clocks within this of ours,
# and a write in flight across a poll, are seen there; the reads by state cover the rest.
CLOCK_SKEW = dt.timedelta(seconds=1)
# The tasks due soonest of one name that a poll reads for the consumers: a due task the time
# window missed is found once it is among them, as consumers claim in that order anyway.
DUE_PAGE = 20
# Names whose due tasks one poll reads, and waited keys whose end it reads, taken in turns:
# the cost of a poll stays bounded whatever the names and keys (the rest wait a few polls).
DUE_NAMES_PER_POLL = 8
ENDED_KEYS_PER_POLL = KEYS_PER_READ  # one read
# How often the poll reads by state, at most: a write that showed up late is rare (a slow
# transaction, a clock behind), and this bounds what catching it costs a busy process.
STATE_READ_INTERVAL = dt.timedelta(seconds=5)

_WRITES = ["insert", "update", "replace"]
_WHOLE = ["insert", "replace"]


class Subscription:
    """What one consumer, waiter or watch hears of: ``wakes`` (names: writes that may give
    work), ``states`` (keys: state changes), ``every`` (names, or all names when ``None`` is
    among them: every write), ``controls`` (each control change, as a `RESYNC`). Read with
    `next`; `RESYNC` means "read everything again".
    ``options`` say how to discover (``discovery``, ``poll_interval_ms``, the backoff) when
    this subscriber runs the hub."""

    def __init__(
        self,
        options: WorkerOptions,
        *,
        wakes: Iterable[str] = (),
        states: Iterable[str] = (),
        every: Iterable[str | None] = (),
        buffer_size: int = BUFFER_SIZE,
        holds: Callable[[str], bool] = lambda key: False,
        controls: bool = False,
        worker_id: str | None = None,
    ) -> None:
        self.options = options
        # A consumer's worker: the poll reads for it the due tasks it may claim (not those
        # pinned to other workers). None: any worker's.
        self.worker_id = worker_id
        self.controls = controls  # told (as `RESYNC`) of every write of the control version
        self.holds = holds  # a consumer's running keys: every change of them matters to it
        self.wakes = frozenset(wakes)
        self.states = frozenset(states)
        self.every = frozenset(every)
        self.buffer_size = buffer_size
        # A waiter's tasks' names, once read: the poll's read of writes covers them too.
        self.names: set[str] = set()
        self.named: set[str] = set()  # keys of ``states`` read at least once
        self.ended: set[str] = set()  # keys of ``states`` seen terminal: not read again
        self.resyncs = 0  # times told to resync (fell behind, or the stream lost its place)
        self._buffer: collections.deque[Task | None] = collections.deque()
        self._ready = anyio.Event()
        self.covered = anyio.Event()  # the hub's stream (or poll) covers this subscription

    def wants(self, task: Task, woke: bool) -> bool:
        """``woke``: the write may give a consumer work (see `may_wake`)."""
        return (
            (task.name in self.wakes and (woke or self.holds(task.key)))
            or task.key in self.states
            or task.name in self.every
            or None in self.every
        )

    def note(self, task: Task) -> None:
        """A waited-for task was read (by the hub or by its waiter): its name joins the poll's
        read of writes, and once it has ended its key is not read again."""
        if task.key in self.states:
            self.names.add(task.name)
            self.named.add(task.key)
            if task.state.is_terminal:
                self.ended.add(task.key)

    @property
    def waiting(self) -> frozenset[str]:
        """Keys of ``states`` not yet seen terminal: what the poll reads by key."""
        return self.states - self.ended

    @property
    def unnamed(self) -> frozenset[str]:
        """Keys of ``states`` never read (not published yet): read by key every poll, as no
        read of writes by name covers them."""
        return self.states - self.named

    def deliver(self, item: Task | None) -> None:
        """Never blocks: past ``buffer_size`` the waiting events are dropped for one RESYNC."""
        if item is not RESYNC:
            self.note(item)
        if item is RESYNC or len(self._buffer) >= self.buffer_size:
            self._buffer.clear()
            self._buffer.append(RESYNC)
            self.resyncs += 1
        else:
            self._buffer.append(item)
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    async def next(self) -> Task | None:
        while not self._buffer:
            self._ready = anyio.Event()
            await self._ready.wait()
        return self._buffer.popleft()


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


class _Coverage:
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
    cover = _Coverage(subscriptions)
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


class TaskHub:
    """One per store. Each subscriber's task group calls `_serve` (through `subscription`):
    one of them runs the stream or the poll loop, the others stand by to take over, from the
    kept resume token (or poll time), when it leaves; the last to leave forgets it
    (`_leave`)."""

    def __init__(self, store: StoreBase, clock: Clock, controls_suffix: str) -> None:
        self._store = store
        self._clock = clock
        self._controls_suffix = controls_suffix
        # On the database, with the control version, until the server refuses that.
        self.whole_database = getattr(store.collection, "database", None) is not None
        self._subs: list[Subscription] = []
        self._runner = OneRunner()
        self._joined = anyio.Event()  # a subscriber joined: is it covered?
        self._coverage = _Coverage(())
        self._lost = False  # the stream's place was lost: every subscriber resyncs
        self.position = ResumePoint()
        self.polling = False
        # Polling because every subscriber asked to (``discovery="poll"``), not because the
        # server refused a stream: it lasts only while that holds (`_discovery`).
        self.polling_by_choice = False
        self.streams_opened = 0
        self.reopened = 0  # stream reopened after an error or an end
        self.resyncs = 0  # fresh streams after a lost place
        self.polls = 0
        self._since: dt.datetime | None = None
        self._seen: dict[str, _Version] = {}  # key -> the version handed out
        self._due_seen: dict[str, _Version] = {}  # ... to consumers, read as due
        self._due_turn = 0
        self._ended_turn = 0
        self._read_by_state_at: dt.datetime | None = None

    @property
    def subscribers(self) -> int:
        """Those of tasks: consumers, waiters, watches (not the controls' `ControlHub`)."""
        return sum(not sub.controls for sub in self._subs)

    @property
    def carries_controls(self) -> bool:
        """Whether the control changes come through this hub's stream (see the module)."""
        return self.whole_database and not self.polling

    def _pipeline(self) -> list[dict[str, Any]]:
        if not self.whole_database:
            return hub_pipeline(self._subs)
        tasks = self._store.collection.name
        return hub_pipeline(self._subs, (tasks, tasks + self._controls_suffix))

    @contextlib.asynccontextmanager
    async def subscription(self, sub: Subscription) -> AsyncIterator[Subscription]:
        """Subscribed, and covered by the process's stream (or poll), for the block: a first
        read inside it misses nothing. Runs or stands by for the hub meanwhile."""
        self._subs.append(sub)
        self._joined.set()
        try:
            async with anyio.create_task_group() as task_group:
                try:
                    await task_group.start(self._serve, sub)
                except ConfigurationError as exc:
                    refused: ConfigurationError | None = (
                        exc  # raised below as itself, not inside a group
                    )
                    task_group.cancel_scope.cancel()
                else:
                    refused = None
                    if (
                        self.polling
                        and not self.polling_by_choice
                        and sub.options.discovery == "stream"
                    ):
                        refused = ConfigurationError(
                            "discovery: 'stream' was asked for, but this process polls for "
                            "tasks (the server refused a change stream)"
                        )
                        task_group.cancel_scope.cancel()
                failed: Exception | None = refused
                if refused is None:
                    if self.polling:  # read from the next poll on: nothing written is missed
                        sub.covered.set()
                    await sub.covered.wait()
                    try:
                        yield sub
                    except Exception as exc:  # the block's: raised as itself, not in a group
                        failed = exc
                    finally:
                        task_group.cancel_scope.cancel()
            if failed is not None:
                raise failed
        finally:
            self._leave(sub)

    async def follow(self, sub: Subscription) -> AsyncGenerator[Task | None, None]:
        """A subscription for an async iterator (a watch), which cannot hold a task group
        across its yields. Subscribed from the first step to the generator's end (``finally``:
        on ``aclose``, or when the abandoned generator is finalized), so nothing is missed in
        between; it serves the hub only while it waits for an event: it stands by while
        another subscriber runs the hub, and takes over when it waits alone (reopening the
        stream from the kept resume token, or polling from the kept time: nothing lost)."""
        self._subs.append(sub)
        self._joined.set()
        try:
            while True:
                yield await self._next_serving(sub)
        finally:
            self._leave(sub)

    def _leave(self, sub: Subscription) -> None:
        """Unsubscribed; the last subscriber to leave takes the hub's place with it.

        Invariant: a position (the stream's resume token, the poll's time and the versions it
        handed out) lives only while a subscriber does. Kept, it lets a subscriber take over
        from another, or a watch serve again after a yield, without losing an event. Kept
        past the last subscriber, it would make the next one replay the writes made while
        nobody listened, each older than what that subscriber reads first (a failure before
        the retry it waits on). A subscriber that finds the hub empty opens it afresh, before
        its first read, as the first one did."""
        self._subs.remove(sub)
        if not self._subs:
            self._forget_place()

    async def _next_serving(self, sub: Subscription) -> Task | None:
        if sub.covered.is_set() and sub.pending:
            return await sub.next()  # no wait: the hub's runner is left alone
        async with anyio.create_task_group() as task_group:
            await task_group.start(self._serve, sub)
            if self.polling:  # read from the next poll on: nothing written is missed
                sub.covered.set()
            await sub.covered.wait()
            item = await sub.next()
            task_group.cancel_scope.cancel()
        return item

    async def _serve(
        self, sub: Subscription, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await self._runner.serve(lambda started: self._run(sub.options, started), task_status)

    def _cover(self) -> None:
        for sub in self._subs:
            if self.polling or self._coverage.covers(sub):
                sub.covered.set()

    def _tell_controls(self) -> None:
        """The control changes: every write of the version, and whenever the hub stops
        carrying them (see `carries_controls`)."""
        for sub in self._subs:
            if sub.controls:
                sub.deliver(RESYNC)

    def _resync_all(self) -> None:
        for sub in self._subs:
            sub.deliver(RESYNC)

    def _hand_out(self, task: Task, woke: bool) -> None:
        for sub in self._subs:
            if sub.wants(task, woke):
                sub.deliver(task)

    # ------------------------------------------------------------ the stream

    async def _run(self, options: WorkerOptions, task_status: TaskStatus[None]) -> None:
        """As the runner: the stream (reopened as long as it fails), or the poll loop while
        the server refuses one."""
        backoff = Backoff(self._clock, options.reconnect_delay)  # while the stream fails
        while True:
            if self.polling:
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
                await self._poll(options)  # returns once the stream is back
                continue
            stream = await self._open(options, backoff.attempt)
            if stream is None:
                continue  # refused: poll
            task_status.started()
            task_status = anyio.TASK_STATUS_IGNORED
            opened_at = self._clock.now()
            try:
                if await self._read(stream):
                    continue  # a subscriber joined: reopened from the token, wider
                log.warning("change stream ended, reopening", extra={"action": "stream_ended"})
            except PyMongoError as exc:
                log.warning(
                    "change stream failed, reopening: %s", exc, extra={"action": "stream_error"}
                )
                if isinstance(exc, OperationFailure) and self.position.read_failed():
                    log.warning(
                        "change stream keeps failing at one resume token; opening a fresh "
                        "one and re-fetching all tasks",
                        extra={"action": "stream_resync"},
                    )
                    self._lose_place()
            finally:
                await close_quietly(stream)
            # The backoff grows while the stream keeps failing; a stream that stayed up for
            # the longest backoff was healthy, so an isolated error later starts from the base.
            if (self._clock.now() - opened_at).total_seconds() >= (
                options.reconnect_backoff_max_ms / 1000
            ):
                backoff.reset()
            await backoff.wait()
            self.reopened += 1

    def _lose_place(self) -> None:
        self.position = ResumePoint()
        self._lost = True

    def _forget_place(self) -> None:
        """Nobody subscribes: the next subscriber starts from its own first read (see
        `_leave`), so there is nothing to resync."""
        self.position = ResumePoint()
        self._lost = False
        self._coverage = _Coverage(())
        self._since, self._seen, self._due_seen = None, {}, {}
        self._read_by_state_at = None
        if self.polling_by_choice:  # the next subscriber's rule decides
            self.polling = self.polling_by_choice = False

    async def _open(self, options: WorkerOptions, attempt: int) -> Any:
        """The stream from the kept place (afresh when there is none, or the server cannot
        resume from it: then every subscriber resyncs once it is open); None when refused
        and this process now polls. ``attempt``: the stream's failures in a row so far."""
        backoff = Backoff(self._clock, options.reconnect_delay, attempt=attempt)
        while True:
            self._joined = anyio.Event()
            coverage = _Coverage(self._subs)
            try:
                stream, refusal = await open_unless_refused(
                    self._store,
                    self._pipeline(),
                    self._discovery(options),
                    max_await_time_ms=MAX_AWAIT_MS,
                    whole_database=self.whole_database,
                    **self.position.open_options(),
                )
            except OperationFailure as exc:
                if self.whole_database and refuses_streams(exc):
                    # Unauthorized (13): a role granting streams on some collections only.
                    # Any other refusal: a stream on the collection is tried before polling.
                    log.log(
                        logging.WARNING if exc.code == UNAUTHORIZED else logging.INFO,
                        "the server refused a change stream on the database (%s); watching the "
                        "tasks and the control version apart, two streams in this process",
                        exc,
                        extra={"action": "stream_per_collection"},
                    )
                    self.whole_database = False
                    if self.position.token is not None:
                        self._lose_place()  # a database stream's token: not the collection's
                    self._tell_controls()  # the controls' hub: to a stream of its own
                    continue
                if self.position.token is not None and exc.code in RESUME_IMPOSSIBLE:
                    log.warning(
                        "change stream cannot resume (%s); re-fetching all tasks",
                        exc,
                        extra={"action": "stream_resync"},
                    )
                    self._lose_place()
                    continue
                log.warning(
                    "cannot open the change stream yet: %s", exc, extra={"action": "stream_error"}
                )
            except PyMongoError as exc:
                log.warning(
                    "cannot open the change stream yet: %s", exc, extra={"action": "stream_error"}
                )
            else:
                if stream is None:
                    self._warn_polling(refusal, options)
                    return None
                self.streams_opened += 1
                self._coverage = coverage
                if self.position.token is None:
                    self.position.opened(stream)
                    if self._lost:
                        self._lost = False
                        self.resyncs += 1
                        self._resync_all()
                self._cover()
                return stream
            await backoff.wait()

    async def _read(self, stream: Any) -> bool:
        """Until the server ends the stream (False), or a subscriber joins that it does not
        cover (True: reopen from the kept place with the wider filter). A read cancelled for
        that has moved nothing: the place moves only after a read returns."""
        widened = False
        failed: PyMongoError | None = None
        async with anyio.create_task_group() as task_group:

            async def on_join() -> None:
                nonlocal widened
                while True:
                    await self._joined.wait()
                    self._joined = anyio.Event()
                    if not all(self._coverage.covers(sub) for sub in self._subs):
                        widened = True
                        task_group.cancel_scope.cancel()
                        return
                    self._cover()

            task_group.start_soon(on_join)
            try:
                await self._events(stream)
            except PyMongoError as exc:
                failed = exc  # raised as itself, not inside a group
            task_group.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return widened

    async def _events(self, stream: Any) -> None:
        while stream.alive:
            event = await stream.try_next()
            self.position.read(stream, event)
            if event is None:
                continue
            if self.whole_database and event.get("ns", {}).get("coll") != (
                self._store.collection.name
            ):
                self._tell_controls()  # the control version: the $match lets no other by
                continue
            document = event.get("fullDocument")
            if document is None:
                continue  # deleted before the lookup, or not a write (invalidate)
            try:
                task = Task.model_validate(document)
            except ValidationError as exc:
                log.warning(
                    "ignoring a document that is not a task: %s",
                    exc,
                    extra={"action": "foreign_document"},
                )
                continue
            # A stream of consumers alone carries only writes that wake them (its $match).
            widened = bool(self._coverage.states or self._coverage.every)
            self._hand_out(task, not widened or may_wake(task, self._clock.now()))

    def _discovery(self, options: WorkerOptions) -> Discovery:
        """How the runner discovers: its own rule, but a hub polls by choice only while
        every subscriber asked to poll. One that asked for a stream, or for ``auto``, has
        the process stream (or try to) whoever runs the hub: a waiter that asked to poll does
        not make the consumers beside it poll, nor fail one that asked for a stream."""
        if options.discovery == "poll" and self._wants_stream():
            return "auto"
        return options.discovery

    def _wants_stream(self) -> bool:
        return any(sub.options.discovery != "poll" for sub in self._subs)

    def _warn_polling(self, refusal: OperationFailure | None, options: WorkerOptions) -> None:
        self.polling = True
        self.polling_by_choice = refusal is None
        self._tell_controls()  # no longer carried here: the controls' hub reads them itself
        interval = self.poll_interval_ms / 1000
        if refusal is None:
            log.info(
                "discovery='poll': polling for tasks every %.1f s",
                interval,
                extra={"action": "polling"},
            )
            return
        log.warning(
            "the server refused to open a change stream (%s); polling for tasks every %.1f s "
            "instead (one poll per interval for the whole process), which reacts more slowly; "
            "trying the stream again every %.0f s",
            refusal,
            interval,
            options.stream_retry_interval_ms / 1000,
            extra={"action": "polling_fallback"},
        )

    # ------------------------------------------------------------ the poll

    @property
    def poll_interval_ms(self) -> int:
        return min((sub.options.poll_interval_ms for sub in self._subs), default=1_000)

    async def _poll(self, options: WorkerOptions) -> None:
        """One read per interval for every subscriber. With ``discovery="auto"`` the stream
        is tried again every ``stream_retry_interval_ms``; returns once it opens."""
        self._cover()
        backoff = Backoff(self._clock, options.reconnect_delay)  # while the poll fails
        retry = dt.timedelta(milliseconds=options.stream_retry_interval_ms)
        auto = self._discovery(options) == "auto"
        retry_at = self._clock.now() + retry if auto else None
        next_poll = self._clock.now()
        while True:
            if self.polling_by_choice and self._wants_stream():
                log.info(
                    "a subscriber wants a change stream: polling stops",
                    extra={"action": "stream_restored"},
                )
                self._stop_polling()
                return
            now = self._clock.now()
            if now >= next_poll:
                try:
                    await self._poll_once()
                except (PyMongoError, BackendUnavailable) as exc:
                    log.warning("poll failed: %s", exc, extra={"action": "poll_retry"})
                    await backoff.wait()
                    continue
                backoff.reset()
                self._cover()
                next_poll = now + dt.timedelta(milliseconds=self.poll_interval_ms)
            if retry_at is not None and now >= retry_at:
                retry_at = now + retry
                if await self._stream_back():
                    return
            wake = min(next_poll, retry_at) if retry_at is not None else next_poll
            self._joined = anyio.Event()  # a subscriber that joins may want a stream
            await self._clock.wait_until(wake, self._joined)

    async def _stream_back(self) -> bool:
        """Whether the server now grants a stream (on the database, else on the collection:
        then for good, as in `_open`)."""
        for whole_database in (True, False) if self.whole_database else (False,):
            try:
                stream = await open_change_stream(
                    self._store,
                    self._pipeline(),
                    max_await_time_ms=MAX_AWAIT_MS,
                    whole_database=whole_database,
                )
            except PyMongoError as exc:
                log.debug("change stream still refused: %s", exc, extra={"action": "polling"})
                continue
            await close_quietly(stream)
            log.info("the change stream opened; polling stops", extra={"action": "stream_restored"})
            self.whole_database = whole_database
            self._stop_polling()
            return True
        return False

    def _stop_polling(self) -> None:
        self.polling = self.polling_by_choice = False
        self._lose_place()  # opened afresh next: every subscriber reads again after it
        self._since, self._seen, self._due_seen = None, {}, {}
        self._read_by_state_at = None

    async def _poll_once(self) -> None:
        """A read of writes, and reads by state, each only while someone needs it:

        - the tasks of every subscriber's names (a waiter's, once read) written since the
          previous poll began (less `CLOCK_SKEW`): the fast path, every kind of write, for
          every subscriber; and the waited keys never read yet (a task a flow will publish);
        - at most every `STATE_READ_INTERVAL`, the end of waited keys, and the due tasks of
          consumers' names (the first `DUE_PAGE` of a name), a few names and keys a time, in
          turns: read by state, not by the time of a write, as a write is stamped before it
          is sent and may become visible after the poll passed its stamp (a transaction's, any
          write on a server that stalls), and a lease expires without a write at all. Due
          tasks, read without their payload, go to consumers alone.

        Each version of a task is handed out once to each subscriber: not again in the
        overlap of two polls, nor while it stays due (a limit, a pause, a busy consumer); an
        older version never after a newer one. A version the consumers were not handed (a
        claim, read by the read of writes) goes to them once read as due (`_Version`)."""
        started = self._clock.now()
        since = self._since or started - CLOCK_SKEW
        wakes: set[str] = set()
        named: set[str] = set()
        every_name = False
        waiting: set[str] = set()
        unnamed: set[str] = set()
        for sub in self._subs:
            wakes |= sub.wakes
            named |= sub.names | {name for name in sub.every if name is not None}
            every_name = every_name or None in sub.every
            waiting |= sub.waiting
            unnamed |= sub.unnamed
        self.polls += 1
        written: list[Task] = []
        if wakes or named or every_name:
            names = None if every_name else sorted(wakes | named)
            written = await self._store.changed_since(since, names)
        if unnamed:
            written += await self._store.get_many(sorted(unnamed))
        ended: list[Task] = []
        due: list[Task] = []
        due_names: list[str] = []
        workers: set[str] | None = set()
        for sub in self._subs:
            if sub.wakes and workers is not None:
                workers = None if sub.worker_id is None else workers | {sub.worker_id}
        last = self._read_by_state_at
        if last is None or started - last >= STATE_READ_INTERVAL:
            self._read_by_state_at = started
            keys, self._ended_turn = _in_turn(
                sorted(waiting - unnamed), self._ended_turn, ENDED_KEYS_PER_POLL
            )
            ended = await self._store.ended(keys) if keys else []
            due_names, self._due_turn = _in_turn(sorted(wakes), self._due_turn, DUE_NAMES_PER_POLL)
            for name in due_names:
                due += await self._store.due(
                    name, started, DUE_PAGE, None if workers is None else sorted(workers)
                )
        handed: dict[str, _Version] = {}
        for task in [*written, *ended]:
            if _newer(task, self._seen, handed):
                woke = may_wake(task, started)
                handed[task.key] = _Version(task.id, task.version, woke, task.name)
                self._hand_out(task, woke)
        for task in due:
            if _new_to_consumers(task, self._seen, handed, self._due_seen):
                handed[task.key] = _Version(task.id, task.version, True, task.name)
                for sub in self._subs:
                    if task.name in sub.wakes:
                        sub.deliver(task)
        self._since = started - CLOCK_SKEW
        # What the next poll may read again, and no more: the overlap's writes for everyone,
        # each as it went out (to the consumers or not); the due tasks, for the consumers, of
        # this poll's names and of those not read now. Every due task read here went to the
        # consumers, now or before, unless a newer version of it was read.
        known = {**self._seen, **handed}
        self._seen = {}
        for task in [*written, *ended]:
            was = known.get(task.key)
            if (
                task.updated_at >= self._since
                and was is not None
                and not _newer(task, {task.key: was})
            ):
                self._seen[task.key] = was
        read = set(due_names)
        self._due_seen = {
            key: seen for key, seen in self._due_seen.items() if seen.name not in read
        }
        self._due_seen.update((t.key, _Version(t.id, t.version, True, t.name)) for t in due)


class _Version(NamedTuple):
    """A version of a task the poll handed out, and whether the consumers had it: a due
    task always goes to them, a write only when it may give them work (`may_wake`).

    Invariant: each version of a task goes to each subscriber once, and a version the
    consumers did not get counts as handed out to everyone but them: read again as due
    (its lease expired, its retry came), it goes to the consumers then."""

    id: Any
    version: int
    to_consumers: bool
    name: str


def _newer(task: Task, *handed_out: dict[str, _Version]) -> bool:
    """Whether ``task`` is a later version than any of ``handed_out`` holds; a key deleted
    and published again has a new ``_id``."""
    for seen in handed_out:
        was = seen.get(task.key)
        if was is not None and was.id == task.id and was.version >= task.version:
            return False
    return True


def _new_to_consumers(task: Task, *handed_out: dict[str, _Version]) -> bool:
    """Whether the consumers have had neither this version of ``task`` nor a newer one
    (a newer one handed to anyone makes this one stale)."""
    for seen in handed_out:
        was = seen.get(task.key)
        if was is None or was.id != task.id:
            continue
        if was.version > task.version or (was.version == task.version and was.to_consumers):
            return False
    return True


def _in_turn(items: list[str], turn: int, count: int) -> tuple[list[str], int]:
    """``count`` of ``items`` from position ``turn`` on, wrapping; and the next turn."""
    if len(items) <= count:
        return items, 0
    turn %= len(items)
    return (items[turn:] + items[:turn])[:count], turn + count
