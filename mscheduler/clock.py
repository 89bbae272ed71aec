"""Injectable time: every "now" the store writes comes from a `Clock`, never from ``$$NOW``.

Workers compare their own clock against ``ping_expire_at`` written by other workers, so the
clocks of all workers must agree to well within ``worker_timeout_ms`` (NTP is enough).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

UTC = dt.timezone.utc


def to_bson_time(moment: dt.datetime) -> dt.datetime:
    """Aware UTC, truncated to the millisecond, as BSON stores it (so reads equal writes)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, aware UTC, millisecond precision."""
        ...


class SystemClock:
    def now(self) -> dt.datetime:
        return to_bson_time(dt.datetime.now(UTC))


class ManualClock:
    """A clock that moves only when told to: tests use it to expire leases without sleeping."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = to_bson_time(start or dt.datetime(2030, 1, 1, tzinfo=UTC))

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float = 0.0, *, ms: int = 0) -> dt.datetime:
        self._now = to_bson_time(self._now + dt.timedelta(seconds=seconds, milliseconds=ms))
        return self._now

    def set(self, moment: dt.datetime) -> None:
        self._now = to_bson_time(moment)
