"""Live refresh: a server-sent event each time tasks change, so open pages reload their data.

The change stream tells of every change; where the server has none (a standalone server,
the wire tier), the stream is replaced by a poll: an event every ``poll_interval`` seconds.
Bursts are merged: at most one event per ``min_interval`` seconds, and never one lost (a
change during the pause is sent once the pause ends).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from ..api import Scheduler
from ..clock import sleep
from ..errors import StoreError

log = logging.getLogger(__name__)


class _Pending:
    """Whether a change has not been told yet; `wait` returns once one has happened."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def take(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


async def _watch(scheduler: Scheduler, pending: _Pending, poll_interval: float) -> None:
    try:
        async for _ in scheduler.watch():
            pending.set()
    except StoreError as exc:  # the server refused a change stream: poll instead
        log.info(
            "dashboard: no change stream (%s); refreshing every %gs",
            exc,
            poll_interval,
            extra={"action": "dashboard_polling"},
        )
    while True:
        await sleep(scheduler.clock, poll_interval)
        pending.set()


async def refresh_signals(
    scheduler: Scheduler,
    send: Callable[[], Awaitable[None]],
    *,
    poll_interval: float,
    min_interval: float,
) -> None:
    """Call ``send`` after each change (or poll), at most once per ``min_interval``; runs
    until cancelled."""
    pending = _Pending()
    async with anyio.create_task_group() as group:
        group.start_soon(_watch, scheduler, pending, poll_interval)
        while True:
            await pending.take()
            await send()
            await sleep(scheduler.clock, min_interval)
