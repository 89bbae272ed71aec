"""Injectable time: every "now" the store writes comes from a `Clock`, never from ``$$NOW``.

Workers compare their own clock against ``ping_expire_at`` written by other workers, so the
clocks of all workers must agree to well within ``worker_timeout_ms`` (NTP is enough).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import anyio

UTC = dt.timezone.utc


def to_bson_time(moment: dt.datetime) -> dt.datetime:
    """Aware UTC, truncated to the millisecond, as BSON stores it (so reads equal writes)."""
    if moment.tzinfo is None:  # naive: UTC, as the driver reads dates back
        moment = moment.replace(tzinfo=UTC)
    elif moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    if moment.microsecond % 1000:
        moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    return moment


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, aware UTC, millisecond precision."""
        ...

    async def wait_until(self, deadline: dt.datetime | None, event: anyio.Event) -> None:
        """Return when ``event`` is set or the clock reaches ``deadline`` (None: no deadline).

        Every timer of the consumer goes through this, so a test's clock drives them all."""
        ...


async def sleep(clock: Clock, seconds: float) -> None:
    await clock.wait_until(clock.now() + dt.timedelta(seconds=seconds), anyio.Event())


class SystemClock:
    def now(self) -> dt.datetime:
        return to_bson_time(dt.datetime.now(UTC))

    async def wait_until(self, deadline: dt.datetime | None, event: anyio.Event) -> None:
        if deadline is None:
            await event.wait()
            return
        delay = (deadline - dt.datetime.now(UTC)).total_seconds()
        with anyio.move_on_after(max(delay, 0.0)):
            await event.wait()


class ManualClock:
    """A clock that moves only when told to: tests use it to expire leases without sleeping."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = to_bson_time(start or dt.datetime(2030, 1, 1, tzinfo=UTC))
        self._waiters: list[tuple[dt.datetime, anyio.Event]] = []

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float = 0.0, *, ms: int = 0) -> dt.datetime:
        self.set(self._now + dt.timedelta(seconds=seconds, milliseconds=ms))
        return self._now

    def set(self, moment: dt.datetime) -> None:
        self._now = to_bson_time(moment)
        due = [(deadline, event) for deadline, event in self._waiters if deadline <= self._now]
        for entry in due:
            self._waiters.remove(entry)
            entry[1].set()

    @property
    def next_deadline(self) -> dt.datetime | None:
        """The earliest time someone waits for: tests advance to it to step the consumer."""
        return min((deadline for deadline, _ in self._waiters), default=None)

    async def wait_until(self, deadline: dt.datetime | None, event: anyio.Event) -> None:
        if deadline is not None and deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        entry = None if deadline is None else (deadline, event)
        if entry is not None:
            self._waiters.append(entry)
        try:
            await event.wait()
        finally:
            if entry is not None and entry in self._waiters:
                self._waiters.remove(entry)
