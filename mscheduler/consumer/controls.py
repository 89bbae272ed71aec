"""What a consumer keeps up besides its tasks: the schedules of its names (publishing their
due occurrences, ending expired tasks), which of its names are paused, and their limits."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from anyio.abc import TaskStatus
from pymongo.errors import PyMongoError

from ..clock import sleep
from ..errors import BackendUnavailable
from ..store.limits import LIMIT_CHANGES
from ..store.streams import Watched, close_quietly, open_unless_refused
from ..store.tasks import TaskStore
from ..worker_options import WorkerOptions

log = logging.getLogger(__name__)


class Controls:
    def __init__(
        self,
        store: TaskStore,
        names: Sequence[str],
        options: WorkerOptions,
        fetch: Callable[[], Awaitable[None]],
        read_limits: Callable[[], Awaitable[None]],
    ) -> None:
        self._read_limits = read_limits  # the consumer's: reads them, wakes what they free
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
                await self._store.expiry.expire_due(self._names)  # housekeeping, as often
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
        """Keep `paused` current: re-read on each change of the paused names. A resumed name
        is fetched again."""
        await self._watch(self._store.pauses, [], self._read_pauses, "pause_retry", task_status)

    async def limit_loop(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the limits of our names current: re-read on each change of one, so a removed
        or raised limit lets the tasks it held back start within one event (or poll)."""
        await self._watch(
            self._store.limits, LIMIT_CHANGES, self._read_limits, "limit_retry", task_status
        )

    async def _read_pauses(self) -> None:
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
            await self._fetch()

    async def _watch(
        self,
        part: Watched,
        pipeline: list[dict[str, Any]],
        read: Callable[[], Awaitable[None]],
        action: str,
        task_status: TaskStatus[None],
    ) -> None:
        """``read`` at start and after each change of ``part``'s documents: a change stream
        opened before the first read (so no change is missed), or every poll interval where
        the server has none. Started once the first read is done."""
        stream, attempt = None, 0
        try:
            while True:
                try:
                    if stream is None and self._options.discovery != "poll":
                        stream, _ = await open_unless_refused(part, pipeline, "auto")
                    await read()
                except (BackendUnavailable, PyMongoError) as exc:
                    log.warning(str(exc), extra={"action": action})
                    await sleep(self._clock, self._options.reconnect_delay(attempt))
                    attempt += 1
                    continue
                attempt = 0
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
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
