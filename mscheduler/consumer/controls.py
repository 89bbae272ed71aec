"""What a consumer keeps up besides its tasks: the schedules of its names (publishing their
due occurrences, ending expired tasks), which of its names are paused, their limits, and
whether it was asked to stop (`Scheduler.stop_worker`).

All four are read again on each change the process's `ControlHub` sees (one stream, or one
read of a version per poll interval, for all the consumers of a `Scheduler`), so a pause, a
limit or a schedule set while consumers run holds within one change event or poll interval;
and again every ``schedule_refresh_ms`` whatever the hub saw, so a change whose signal (the
version's bump, a write of its own) was lost on the network holds by then, not only at the
next change.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
from anyio.abc import TaskStatus
from pymongo.errors import PyMongoError

from ..errors import MSchedulerError
from ..observability import otel_metrics
from ..reconnect_backoff import retrying
from ..services.root import Services
from ..store.components import Store
from ..worker_options import WorkerOptions
from .presence import Presence

log = logging.getLogger(__name__)


async def refresh_task_counts(store: Store) -> None:
    """OpenTelemetry's task-count gauge, refreshed only once a reader has collected it. A
    failed refresh is logged and left for the next round: metrics never stop housekeeping."""
    recorder = otel_metrics.instance()
    if recorder is None or not recorder.counts_wanted():
        return
    try:
        rows = await store.operations.stats()
    except (MSchedulerError, PyMongoError) as exc:
        log.warning("task counts not refreshed: %s", exc, extra={"action": "metrics_error"})
        return
    recorder.set_counts(store.full_name, rows)


class Controls:
    def __init__(
        self,
        services: Services,
        names: Sequence[str],
        options: WorkerOptions,
    ) -> None:
        self._store = services.store
        self._clock = services.clock
        self._names = list(names)
        self._options = options
        self.paused: set[str] = set()
        self._hub = services.control_hub

    async def schedule_loop(self) -> None:
        """Publish the due occurrences of the schedules of our names (`periodic`) and end
        their expired tasks (`store.expiry`), then sleep until the next occurrence, or
        ``schedule_refresh_ms``, or the next change of the controls (a schedule added, changed
        or removed). Every consumer does it: an occurrence's key makes it one task however
        many publish it."""
        seen = self._hub.version  # taken before the read: no change is missed
        while True:
            upcoming = await retrying(
                self._publish_due,
                clock=self._clock,
                delay=self._options.reconnect_delay,
                logger=log,
                action="schedule_retry",
            )
            refresh = self._clock.now() + dt.timedelta(
                milliseconds=self._options.schedule_refresh_ms
            )
            deadline = refresh if upcoming is None else min(upcoming, refresh)
            seen = await self._hub.changed(seen, deadline)

    async def _publish_due(self) -> dt.datetime | None:
        """The due occurrences published, the expired tasks ended; when the next one comes."""
        await self._store.schedules.publish_due(self._names)
        await self._store.expiry.expire_due(self._names)  # housekeeping, as often
        await refresh_task_counts(self._store)
        return await self._store.schedules.next_due(self._names)

    async def pause_loop(
        self,
        fetch: Callable[[], Awaitable[None]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep `paused` current: re-read on each change of the controls. A resumed name is
        fetched again (``fetch``: its tasks go back in the heap)."""
        await self._follow(lambda: self._read_pauses(fetch), "pause_retry", task_status)

    async def limit_loop(
        self,
        read_limits: Callable[[], Awaitable[None]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep the limits of our names current: ``read_limits`` (it reads them and wakes
        what they free) on each change of the controls, so a set, lowered, raised or removed
        limit holds within one event (or poll interval)."""
        await self._follow(read_limits, "limit_retry", task_status)

    async def stop_loop(
        self,
        presence: Presence,
        stop: Callable[[bool], None],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Apply a stop requested of this worker (`store.stops`): re-read on each change of
        the controls, so it holds within one event (or poll interval). ``stop(drain)`` is
        called for a request naming this run (``presence.instance``), which is then deleted;
        a request made before this run started was for an earlier one, and is deleted
        unapplied. Start it once the worker is listed (``presence`` started): a stop can only
        be requested of a listed worker."""

        async def read() -> None:
            found = await self._store.stops.of(self._options.worker_id)
            if found is None:
                return
            if found.instance == presence.instance:
                stop(found.drain)
                await self._store.stops.clear(found)
            elif presence.started_at is not None and found.requested_at < presence.started_at:
                await self._store.stops.clear(found)

        await self._follow(read, "stop_retry", task_status)

    async def _read_pauses(self, fetch: Callable[[], Awaitable[None]]) -> None:
        now_paused = set(await self._store.pauses.paused(self._names))
        resumed = self.paused - now_paused
        if now_paused != self.paused:
            log.info(
                "paused names: %s",
                ", ".join(sorted(now_paused)) or "none",
                extra={"action": "paused", "names": sorted(now_paused)},
            )
        self.paused = now_paused
        if resumed:
            await fetch()

    async def serve_hub(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the process's `ControlHub` (or stand by to take it over); started once it
        watches."""
        await self._hub.serve(self._options, task_status=task_status)

    async def _follow(
        self,
        read: Callable[[], Awaitable[None]],
        action: str,
        task_status: TaskStatus[None],
    ) -> None:
        """``read`` at start, after each change the hub sees (it watches before the first
        read, so no change is missed), and ``schedule_refresh_ms`` after the last read at the
        latest (a change whose signal was lost). Started once the first read is done."""
        seen = self._hub.version
        refresh = dt.timedelta(milliseconds=self._options.schedule_refresh_ms)
        while True:
            await retrying(
                read,
                clock=self._clock,
                delay=self._options.reconnect_delay,
                logger=log,
                action=action,
            )
            task_status.started()
            task_status = anyio.TASK_STATUS_IGNORED
            seen = await self._hub.changed(seen, self._clock.now() + refresh)
