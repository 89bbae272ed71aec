"""What tells a process that a control document changed (a paused name, a limit, a schedule):
one version, bumped by every control write, in ``<collection>.controls``.

Why one version in a collection of its own, rather than the control documents kept in the
tasks collection under their own kind: control documents among the tasks would be seen by
every query and index of tasks (listings, counts, the claim index's partial scans) that must
then leave them out. A version apart costs one small document. The process's one change
stream, on the database (`discovery.TaskHub`), carries its writes beside the tasks'; where the
server grants no stream on the whole database (``changeStream`` on the tasks collection
alone), `ControlHub` keeps a stream of its own on the version; without change streams it reads
the version once per poll interval. Nothing else is read while nothing changes, but for the
consumers' read of their controls every ``schedule_refresh_ms`` (below).

Invariant: a control write is followed by the bump; a process reads its controls again after
any bump it sees (and once when it starts watching), so a change is in effect there within one
event, or one poll interval, after the call that made it returned. The bump is a second write,
and may be lost on the network after the change landed; so a call that finds its change made
already (the retry of one whose bump was lost: a name paused, a limit or schedule gone) bumps
all the same, and each consumer reads its controls again every ``schedule_refresh_ms``
whatever it was told (`consumer.controls`): a change whose bump was lost holds by then.
"""

from __future__ import annotations

import datetime as dt
import logging

import anyio
from anyio.abc import TaskStatus
from pymongo.errors import PyMongoError

from ..clock import Clock
from ..errors import BackendUnavailable
from ..queries import controls as cq
from ..reconnect_backoff import Backoff, Delay
from ..store.base import StoreBase
from ..store.controls import ControlVersion
from ..store.streams import MAX_AWAIT_MS, close_quietly, open_unless_refused
from ..worker_options import Discovery, WorkerOptions
from .discovery import Subscription, TaskHub
from .runner import OneRunner

log = logging.getLogger(__name__)


class ControlHub:
    """One per store (so per `Scheduler`): the control changes from the process's stream
    (`TaskHub`), or from a stream of its own on the version, or one read of it per poll
    interval, for all the process's consumers. Each consumer calls `serve`: one of them runs
    the watch, the others wait to take over if it stops. `version` counts the changes seen
    here; `changed` waits for the next (or a deadline)."""

    def __init__(
        self, store: StoreBase, version: ControlVersion, task_hub: TaskHub, clock: Clock
    ) -> None:
        self._store = store
        self._version = version
        self._task_hub = task_hub
        self._clock = clock
        self.version = 0
        self.ready = anyio.Event()  # set while a runner watches (no change can be missed)
        self._waiting: set[anyio.Event] = set()  # each waiter's own: the clock sets it too
        self._runner = OneRunner()
        self.streams_opened = 0
        self.reads = 0
        self.polling = False

    async def changed(self, seen: int, deadline: dt.datetime | None = None) -> int:
        """Once a change after ``seen`` (a value of `version`) is known, or at ``deadline``
        (on the clock), whichever comes first: the version then."""
        while self.version <= seen:
            if deadline is not None and self._clock.now() >= deadline:
                break
            wake = anyio.Event()
            self._waiting.add(wake)
            try:
                await self._clock.wait_until(deadline, wake)
            finally:
                self._waiting.discard(wake)
            if not wake.is_set():  # timed out (a manual clock sets the event it times out)
                break
        return self.version

    def _bump(self) -> None:
        self.version += 1
        waiting, self._waiting = self._waiting, set()
        for wake in waiting:
            wake.set()

    async def serve(
        self,
        options: WorkerOptions,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the watch if none runs in this process, else stand by to take over. Started
        once the watch is up (`ready`)."""

        async def watch(started: TaskStatus[None]) -> None:
            try:
                while True:
                    if self._task_hub.carries_controls:
                        started = await self._ride(options, started)
                    started = await self._watch(
                        options.poll_interval_ms,
                        options.discovery,
                        options.reconnect_delay,
                        started,
                    )
            finally:
                self.ready = anyio.Event()

        await self._runner.serve(watch, task_status)

    async def _ride(self, options: WorkerOptions, started: TaskStatus[None]) -> TaskStatus[None]:
        """The changes from the process's stream, while it carries them: a write of the
        version, or the stream opened afresh, is a change (what happened while nobody watched
        is read again). Returns, with what is left of ``started``, once the stream no longer
        carries them (the server refused it on the database, or refused streams: this
        process polls)."""
        subscription = Subscription(options, controls=True)
        self.polling = False
        async with self._task_hub.subscription(subscription):
            if not self._task_hub.carries_controls:
                self.polling = self._task_hub.polling
                return started
            self._bump()
            self.ready.set()
            started.started()
            while True:
                await subscription.next()  # each item: read the controls again
                self._bump()
                if not self._task_hub.carries_controls:
                    self.polling = self._task_hub.polling
                    return anyio.TASK_STATUS_IGNORED

    async def _watch(
        self,
        poll_interval_ms: int,
        discovery: Discovery,
        reconnect_delay: Delay,
        task_status: TaskStatus[None],
    ) -> TaskStatus[None]:
        """The stream on the version (opened before the first read), or a read of it each poll
        interval. Every (re)start counts as a change: what happened while nobody watched is
        read again. A poll returns once the process's stream carries the controls again."""
        stream, known = None, None
        signalled = self._task_hub.control_signals  # control changes the signal counted
        backoff = Backoff(self._clock, reconnect_delay)
        try:
            while True:
                try:
                    if stream is None and not self.polling:
                        stream, refusal = await open_unless_refused(
                            self._version,
                            cq.VERSION_CHANGES,
                            discovery,
                            max_await_time_ms=MAX_AWAIT_MS,
                        )
                        if stream is not None:
                            self.streams_opened += 1
                        else:
                            self.polling = True
                            if refusal is not None:
                                log.info(
                                    "no change streams: control changes are read every %.1f s",
                                    poll_interval_ms / 1000,
                                    extra={"action": "controls_polling"},
                                )
                    if stream is None or known is None:
                        self.reads += 1
                        signalled = self._task_hub.control_signals
                        version = await self._version.read()
                        if version != known:
                            known = version
                            self._bump()
                except (BackendUnavailable, PyMongoError) as exc:
                    log.warning(str(exc), extra={"action": "controls_retry"})
                    if stream is not None:
                        await close_quietly(stream)
                        stream, known = None, None
                    await backoff.wait()
                    continue
                backoff.reset()
                self.ready.set()
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
                if stream is None:
                    # A poll interval, or sooner when the discovery hub's signal counts a
                    # control change (read at its own interval).
                    await self._task_hub.control_signal(
                        self._clock.now() + dt.timedelta(milliseconds=poll_interval_ms), signalled
                    )
                    if self._task_hub.carries_controls:
                        return task_status
                    continue
                try:
                    event = await stream.try_next()
                except PyMongoError as exc:
                    log.warning(str(exc), extra={"action": "controls_retry"})
                    await close_quietly(stream)
                    stream, known = None, None  # reopened, then read again
                    continue
                if event is not None:
                    self._bump()
                elif not stream.alive:  # ended by the server (the collection dropped)
                    await close_quietly(stream)
                    stream, known = None, None
        finally:
            if stream is not None:
                await close_quietly(stream)
