"""Live refresh: a server-sent event each time something happens to a task, so open pages
reload their data.

What happens is told by the task events (`Scheduler.events`: published, started, progress,
succeeded, failed, cancelled) through the process's discovery hub: its change stream, or
where the server has none (a standalone server, the wire tier) its poll every
``poll_interval`` seconds. A write that is no event (a payload updated, an attempt released)
refreshes nothing by itself. Bursts are merged: at most one event per ``min_interval``
seconds, and never one lost (a change during the pause is sent once the pause ends).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from ..api import Scheduler
from ..clock import sleep


class _Pending:
    """Whether a change has not been told yet; `wait` returns once one has happened."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def take(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


async def _listen(scheduler: Scheduler, pending: _Pending, poll_interval: float) -> None:
    interval_ms = max(10, round(poll_interval * 1000))
    async with scheduler.events(poll_interval_ms=interval_ms) as events:  # the hub held
        async for _ in events:
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
        group.start_soon(_listen, scheduler, pending, poll_interval)
        while True:
            await pending.take()
            await send()
            await sleep(scheduler.clock, min_interval)
