"""The discovery hub: its subscriptions, and who runs its stream or its poll (see the
package's docstring for the design and its invariants).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
from anyio.abc import TaskStatus
from pydantic import ValidationError
from pymongo.errors import OperationFailure, PyMongoError

from ...clock import Clock
from ...errors import BackendUnavailable, ConfigurationError, StoreError
from ...models import Task
from ...reconnect_backoff import Backoff
from ...store.base import StoreBase
from ...store.signal import REGISTRATION, Signal, SignalState
from ...store.streams import (
    MAX_AWAIT_MS,
    RESUME_IMPOSSIBLE,
    UNAUTHORIZED,
    ResumePoint,
    close_quietly,
    open_change_stream,
    open_unless_refused,
    refuses_streams,
)
from ...worker_options import Discovery, WorkerOptions
from ..runner import OneRunner
from .filters import Coverage, hub_pipeline, may_wake
from .poller import SIGNAL_IDLE_AFTER, SIGNAL_IDLE_INTERVAL, SIGNAL_INTERVAL, Poller
from .subscriptions import RESYNC, Subscription

log = logging.getLogger(__name__)


class Mode(enum.Enum):
    """How the hub discovers the writes (`TaskHub.mode`)."""

    STREAM = "stream"  # a change stream (or trying to open one)
    POLLING = "polling"  # the server refused a stream: a poll per interval, the stream retried
    # Every subscriber asked to poll (``discovery="poll"``): it lasts only while that holds
    # (`TaskHub._discovery`), and ends with the last subscriber.
    POLLING_BY_CHOICE = "polling by choice"


class TaskHub:
    """One per store. Each subscriber's task group calls `_serve` (through `subscription`):
    one of them runs the stream or the poll loop, the others stand by to take over, from the
    kept resume token (or poll time), when it leaves; the last to leave forgets it
    (`_leave`)."""

    def __init__(
        self,
        store: StoreBase,
        clock: Clock,
        controls_suffix: str,
        signal: Signal | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._controls_suffix = controls_suffix
        # Read between polls, where there is one (`store.signal`): the tasks are read when it
        # moved, and a control change it counts wakes the controls' hub (`control_signal`).
        self._signal = signal
        self.signal_reads = 0
        self.control_signals = 0  # control changes the signal counted, seen here
        self._control_waiters: set[anyio.Event] = set()
        # On the database, with the control version, until the server refuses that.
        self.whole_database = getattr(store.collection, "database", None) is not None
        self._subs: list[Subscription] = []
        self._runner = OneRunner()
        self._joined = anyio.Event()  # a subscriber joined: is it covered?
        self._coverage = Coverage(())
        self._lost = False  # the stream's place was lost: every subscriber resyncs
        self.position = ResumePoint()
        self.mode = Mode.STREAM
        self.streams_opened = 0
        self.reopened = 0  # stream reopened after an error or an end
        self.resyncs = 0  # fresh streams after a lost place
        self.polls = 0
        self._poller = Poller(store, clock)

    @property
    def polling(self) -> bool:
        """Polling for tasks (the server refused a stream, or by choice), not streaming."""
        return self.mode is not Mode.STREAM

    @property
    def polling_by_choice(self) -> bool:
        return self.mode is Mode.POLLING_BY_CHOICE

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
        await self.serve(sub.options, task_status=task_status)

    async def serve(
        self, options: WorkerOptions, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the stream or the poll loop if none runs in this process, else stand by to
        take over (`runner.Service`); a subscriber serves it through `subscription`."""
        await self._runner.serve(lambda started: self._run(options, started), task_status)

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
        self._coverage = Coverage(())
        self._poller = Poller(self._store, self._clock)
        if self.mode is Mode.POLLING_BY_CHOICE:  # the next subscriber's rule decides
            self.mode = Mode.STREAM

    async def _open(self, options: WorkerOptions, attempt: int) -> Any:
        """The stream from the kept place (afresh when there is none, or the server cannot
        resume from it: then every subscriber resyncs once it is open); None when refused
        and this process now polls. ``attempt``: the stream's failures in a row so far."""
        backoff = Backoff(self._clock, options.reconnect_delay, attempt=attempt)
        while True:
            self._joined = anyio.Event()
            coverage = Coverage(self._subs)
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
        self.mode = Mode.POLLING_BY_CHOICE if refusal is None else Mode.POLLING
        self._tell_controls()  # polling, this hub stops carrying the controls: their hub reads them
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

    async def control_signal(self, deadline: dt.datetime, seen: int) -> None:
        """Until the signal counted a control change after ``seen`` (a value of
        `control_signals`), or ``deadline``: how the controls' hub, polling, learns of a
        change sooner than its own interval."""
        if self.control_signals > seen:
            return
        wake = anyio.Event()  # its own: a manual clock sets the event it times out
        self._control_waiters.add(wake)
        try:
            await self._clock.wait_until(deadline, wake)
        finally:
            self._control_waiters.discard(wake)

    def _controls_signalled(self) -> None:
        self.control_signals += 1
        waiting, self._control_waiters = self._control_waiters, set()
        for wake in waiting:
            wake.set()

    async def _read_signal(self, seen: SignalState | None) -> SignalState:
        """The signal, read; registered as a poller when the registration nears its end, and
        the controls' hub told of a control change it counts."""
        assert self._signal is not None
        self.signal_reads += 1
        state = await self._signal.read()
        now = self._clock.now()
        if state.polled_until is None or state.polled_until - now < REGISTRATION / 2:
            state = SignalState(state.tasks, state.controls, await self._signal.register())
        if seen is not None and state.controls != seen.controls:
            self._controls_signalled()
        return state

    async def _poll(self, options: WorkerOptions) -> None:
        """One read per interval for every subscriber, and between them the signal every
        `SIGNAL_INTERVAL` (`SIGNAL_IDLE_INTERVAL` once it stopped moving; when shorter than
        the poll interval), the tasks read at once when it moved. With
        ``discovery="auto"`` the stream is tried again every ``stream_retry_interval_ms``;
        returns once it opens."""
        self._cover()
        backoff = Backoff(self._clock, options.reconnect_delay)  # while the poll fails
        retry = dt.timedelta(milliseconds=options.stream_retry_interval_ms)
        auto = self._discovery(options) == "auto"
        retry_at = self._clock.now() + retry if auto else None
        next_poll = self._clock.now()
        next_signal: dt.datetime | None = next_poll
        signal: SignalState | None = None
        moved_at = next_poll  # when the signal last moved (or the poll began)
        moved = False  # since the last read of writes
        while True:
            if self.polling_by_choice and self._wants_stream():
                log.info(
                    "a subscriber wants a change stream: polling stops",
                    extra={"action": "stream_restored"},
                )
                self._stop_polling()
                return
            now = self._clock.now()
            interval = dt.timedelta(milliseconds=self.poll_interval_ms)
            if self._signal is None or interval <= SIGNAL_INTERVAL:
                next_signal = None  # the poll itself comes as often
            elif next_signal is None:
                next_signal = now
            if next_signal is not None and now >= next_signal:
                active = now - moved_at < SIGNAL_IDLE_AFTER
                next_signal = now + (SIGNAL_INTERVAL if active else SIGNAL_IDLE_INTERVAL)
                try:
                    read = await self._read_signal(signal)
                except (PyMongoError, BackendUnavailable) as exc:
                    # The poll goes on at its interval (and its backoff): the signal only
                    # brings it sooner.
                    log.debug("signal not read: %s", exc, extra={"action": "signal_retry"})
                    next_signal = max(next_signal, next_poll)
                except StoreError as exc:  # refused (a role without the signal's collection)
                    log.warning(
                        "the signal cannot be read (%s): polling every %.1f s alone",
                        exc,
                        interval.total_seconds(),
                        extra={"action": "signal_refused"},
                    )
                    self._signal = None
                    next_signal = None
                else:
                    if signal is not None and read.tasks != signal.tasks:
                        moved, moved_at = True, now  # something was written: read it now
                    signal = read
            if now >= next_poll or moved:
                signalled = now < next_poll
                try:
                    self.polls += 1
                    await self._poller.poll_once(self._subs, self._hand_out, signalled=signalled)
                except (PyMongoError, BackendUnavailable) as exc:
                    log.warning("poll failed: %s", exc, extra={"action": "poll_retry"})
                    await backoff.wait()
                    continue
                backoff.reset()
                self._cover()
                moved = False
                if not signalled:
                    next_poll = now + interval
            if retry_at is not None and now >= retry_at:
                retry_at = now + retry
                if await self._stream_back():
                    return
            wake = min(t for t in (next_poll, next_signal, retry_at) if t is not None)
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
        self.mode = Mode.STREAM
        self._lose_place()  # opened afresh next: every subscriber reads again after it
        self._poller = Poller(self._store, self._clock)
