"""What a consumer keeps up besides its tasks: the schedules of its names (publishing their
due occurrences, ending expired tasks) and which of its names are paused."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
from anyio.abc import TaskStatus
from pymongo.errors import PyMongoError

from .. import otel_metrics
from ..clock import sleep
from ..errors import BackendUnavailable, MSchedulerError
from ..store import operations
from ..store.streams import close_quietly, open_unless_refused
from ..store.tasks import TaskStore
from ..worker_options import WorkerOptions

log = logging.getLogger(__name__)


async def refresh_task_counts(store: TaskStore) -> None:
    """OpenTelemetry's task-count gauge, refreshed only once a reader has collected it. A
    failed refresh is logged and left for the next round: metrics never stop housekeeping."""
    recorder = otel_metrics.instance()
    if recorder is None or not recorder.counts_wanted():
        return
    try:
        rows = await operations.stats(store)
    except (MSchedulerError, PyMongoError) as exc:
        log.warning("task counts not refreshed: %s", exc, extra={"action": "metrics_error"})
        return
    recorder.set_counts(store.collection.full_name, rows)


class Controls:
    def __init__(
        self,
        store: TaskStore,
        names: Sequence[str],
        options: WorkerOptions,
        fetch: Callable[[], Awaitable[None]],
        refresh_limits: Callable[[Sequence[str]], Awaitable[None]],
    ) -> None:
        self._refresh_limits = refresh_limits  # the consumer's `Quotas.refresh`
        self._store = store
        self._clock = store.clock
        self._names = list(names)
        self._options = options
        self._fetch = fetch  # the consumer's: a resumed name's tasks go back in its heap
        self.paused: set[str] = set()

    async def schedule_loop(self) -> None:
        """Publish the due occurrences of the schedules of our names (`periodic`) and end
        their expired tasks (`store.expiry`), then sleep until the next occurrence, or
        ``schedule_refresh_ms`` to find new schedules. Every consumer does it: an
        occurrence's key makes it one task however many publish it."""
        attempt = 0
        while True:
            try:
                await self._store.schedules.publish_due(self._names)
                await self._refresh_limits(self._names)
                await self._store.expiry.expire_due(self._names)  # housekeeping, as often
                await refresh_task_counts(self._store)
                upcoming = await self._store.schedules.next_due(self._names)
            except BackendUnavailable as exc:
                log.warning(str(exc), extra={"action": "schedule_retry"})
                await sleep(self._clock, self._options.reconnect_delay(attempt))
                attempt += 1
                continue
            attempt = 0
            refresh = self._clock.now() + dt.timedelta(
                milliseconds=self._options.schedule_refresh_ms
            )
            deadline = refresh if upcoming is None else min(upcoming, refresh)
            await self._clock.wait_until(deadline, anyio.Event())

    async def pause_loop(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep `paused` current: re-read on each change of the paused names (a change
        stream, opened before the first read so no change is missed), or every poll interval
        where the server has none. A resumed name is fetched again."""
        pauses, stream, attempt = self._store.pauses, None, 0
        try:
            while True:
                try:
                    if stream is None and self._options.discovery != "poll":
                        stream, _ = await open_unless_refused(pauses, [], "auto")
                    now_paused = set(await pauses.paused(self._names))
                except (BackendUnavailable, PyMongoError) as exc:
                    log.warning(str(exc), extra={"action": "pause_retry"})
                    await sleep(self._clock, self._options.reconnect_delay(attempt))
                    attempt += 1
                    continue
                attempt = 0
                resumed = self.paused - now_paused
                if now_paused != self.paused:
                    log.info(
                        "paused names: %s",
                        ", ".join(sorted(now_paused)) or "none",
                        extra={"action": "paused", "names": sorted(now_paused)},
                    )
                self.paused = now_paused
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
                if resumed:
                    await self._fetch()
                if stream is None:
                    await sleep(self._clock, self._options.poll_interval_ms / 1000)
                    continue
                try:
                    await stream.next()
                except (PyMongoError, StopAsyncIteration):
                    await close_quietly(stream)
                    stream = None
        finally:
            if stream is not None:
                await close_quietly(stream)
