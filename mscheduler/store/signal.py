"""The signal: one small document in ``<collection>.signal`` that writers bump after a write
that may give a consumer elsewhere work (a publish, once per batch; a retry, a release; the
dependents of a finished task told; a slot of a limit freed; a control change), so that a
process without change streams reads that one document by ``_id`` often and the tasks only
when it moved (`services.discovery.TaskHub`).

Writers bump only while some process polls: each polling process registers in the document
(``polled_until``, renewed long before it lapses), and a writer reads it when its cached
registration has lapsed, at most every `RECHECK`. So with change streams (nobody polls) a
writer pays one small read per `RECHECK` while it writes, and no write at all.

Invariant: a bump follows the write it signals (outside a batch: a batch bumps once, after
its last write, so a reader never reads before the writes it was told of). A lost bump, or a
writer that learned of a new poller late (within `RECHECK`), costs a poll interval, never a
task: the poll reads every write since the previous one whatever the signal said, and a bump
that fails is not the caller's failure (its write landed).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import NamedTuple

from pymongo.errors import PyMongoError

from .. import layout
from ..clock import to_bson_time
from ..queries import signal as sq
from .base import BesideTasks, StoreBase
from .driver import driver_errors

log = logging.getLogger(__name__)

# A poller's registration lasts this long; it renews it when less than half is left, so the
# fleet's pollers write it about once per half of it, together.
REGISTRATION = dt.timedelta(seconds=60)
# A writer that read that nobody polls reads again after this, when it writes: how late it
# may learn of a process that started polling (that process reads those writes at its poll).
RECHECK = dt.timedelta(seconds=10)


class SignalState(NamedTuple):
    """The document as read: the counts a reader compares, and the registration."""

    tasks: int
    controls: int
    polled_until: dt.datetime | None


class Signal(BesideTasks):
    SUFFIX = layout.SIGNAL

    def __init__(self, tasks: StoreBase) -> None:
        super().__init__(tasks)
        self._polled_until: dt.datetime | None = None  # the last registration read
        self._checked_at: dt.datetime | None = None  # when it was read
        self.bumps = 0  # sent by this process (the benchmarks and tests count them)
        self.reads = 0

    async def bump(self, *, controls: bool = False) -> None:
        """After a write that may give work (``controls``: a control change): one small
        write, while some process polls; otherwise nothing (a read per `RECHECK` at most)."""
        try:
            if not await self._wanted():
                return
            self.bumps += 1
            await self.collection.update_one(*sq.bump(controls=controls), upsert=True)
        except PyMongoError as exc:  # the write it signals landed: the poll reads it anyway
            log.info("signal not bumped: %s", exc, extra={"action": "signal_not_bumped"})

    async def _wanted(self) -> bool:
        now = self._tasks.clock.now()
        if self._polled_until is not None and self._polled_until > now:
            return True
        if self._checked_at is not None and now - self._checked_at < RECHECK:
            return False
        until = (await self._read()).polled_until
        return until is not None and until > now

    @driver_errors
    async def read(self) -> SignalState:
        """The document (zeros before the first bump): a poller's read between polls."""
        return await self._read()

    async def _read(self) -> SignalState:
        self.reads += 1
        found = await self.collection.find_one(sq.SIGNAL, sq.SIGNAL_FIELDS)
        found = found or {}
        until = found.get("polled_until")
        self._polled_until = None if until is None else to_bson_time(until)
        self._checked_at = self._tasks.clock.now()
        return SignalState(
            int(found.get("tasks", 0)), int(found.get("controls", 0)), self._polled_until
        )

    @driver_errors
    async def register(self) -> dt.datetime:
        """This process polls: writers bump for `REGISTRATION` from now. Returns its end."""
        until = self._tasks.clock.now() + REGISTRATION
        await self.collection.update_one(*sq.register(until), upsert=True)
        self._polled_until, self._checked_at = until, self._tasks.clock.now()
        return until
