"""The live workers: a document per consumer in ``<collection>.workers``, beside the tasks,
and what each holds, read from the tasks themselves.

A consumer writes its document when it starts, rewrites it once per heartbeat (one small
upsert: when it was last seen) and deletes it when it stops. What a worker runs is not taken
from that document, which is as old as its last heartbeat: `Workers.all` reads it from the
running tasks' worker states (`queries.tasks.held_by_worker_pipeline`), exact as of each
task's last write (a claim, a ping, a finish), at no write of its own.

A worker that died without stopping (kill -9, a lost host) leaves its document behind. It is
judged dead (`WorkerInfo.judged`) from the first of two promises it broke: a heartbeat every
``heartbeat_ms`` (dead `STALE_AFTER_BEATS` heartbeats after the last), and a ping of every
task it runs before its lease expires (dead when its leases expired after its last
heartbeat, and none is live). A TTL index removes the document a day later. Nothing else
reads these documents to decide anything about a task: they are what operators
(``mscheduler workers``, ``stats``, a dashboard) look at, and what the ``spread`` claim
policy counts its peers from.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pymongo import IndexModel

from ..clock import to_bson_time
from ..models import UtcDatetime
from ..queries import tasks as q
from .base import BesideTasks, StoreBase
from .driver import driver_errors

SUFFIX = ".workers"
# A worker is dead once it missed this many heartbeats: one late write is not a death, and
# two heartbeats are a task's lease at the default ping interval and worker timeout.
STALE_AFTER_BEATS = 2
# How many of its running keys a worker lists (the count is always exact): keys are up to
# 512 characters, and a worker may run 100,000 tasks; the document must stay small.
MAX_LISTED_KEYS = 20
# A dead worker's document is deleted by MongoDB's TTL monitor this long after it was last
# seen, so crashed workers do not accumulate.
FORGET_AFTER = dt.timedelta(days=1)
_TTL_INDEX = "last_seen_ttl"
# Fields of `WorkerInfo` its reader sets, never stored.
_READ_ONLY = {"alive", "dead_since", "lease_until", "lease_lost_at"}


class WorkerInfo(BaseModel):
    """One consumer as it last described itself, with what it holds now read from the tasks
    (``running``, ``running_keys``) and ``alive`` and ``dead_since`` judged against a clock
    when read (`judged`): a worker that stopped gracefully has no document at all."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    worker_id: str = Field(alias="_id")
    host: str
    pid: int
    names: list[str]
    max_running: int
    running: int = 0  # its live leases, from the tasks when read through `Workers`
    running_keys: list[str] = Field(default_factory=list)  # `MAX_LISTED_KEYS` of them
    started_at: UtcDatetime
    last_seen_at: UtcDatetime
    heartbeat_ms: int
    # Drawn afresh each time a consumer starts: tells a restarted worker from the one that had
    # its id before (a remote stop is for one instance: `store.stops`). Empty in entries
    # written by a version that did not draw one.
    instance: str = ""
    alive: bool = True  # set by the reader (`judged`)
    dead_since: UtcDatetime | None = None  # set by the reader (`judged`): when it was found dead
    # The latest expiry of its leases that are live, and of those that expired (set by the
    # reader, from the tasks): why it was found dead, or that it still pings.
    lease_until: UtcDatetime | None = None
    lease_lost_at: UtcDatetime | None = None

    @property
    def dead_because(self) -> str:
        """Why it was found dead (empty while alive), in an operator's words."""
        if self.alive or self.dead_since is None:
            return ""
        if self.lease_lost_at is not None and self.dead_since == self.lease_lost_at:
            return "its leases expired"
        return "it missed its heartbeats"

    def stale_at(self) -> dt.datetime:
        """When it breaks its heartbeat promise, unless it beats again."""
        return self.last_seen_at + dt.timedelta(milliseconds=self.heartbeat_ms * STALE_AFTER_BEATS)

    def is_alive(self, now: dt.datetime) -> bool:
        return self.judged(now).alive

    def judged(self, now: dt.datetime) -> WorkerInfo:
        """This entry with ``alive`` and ``dead_since`` as of ``now``. Dead since the first
        promise it broke: a heartbeat (`stale_at`), or its leases, when all of them expired
        after its last heartbeat (a worker that beat since was alive then: it only lost a
        lease, say to a stall). A lease lost to a takeover is a ``timeout`` state of a task
        that runs again, counted in ``lease_lost_at`` too, so the worker stays dead while
        that task runs; once it ended, only the heartbeat rule is left to judge by (the
        tasks that ended are not read: their number grows without bound)."""
        dead_since = self.stale_at()
        lost = self.lease_lost_at
        pinging = self.lease_until is not None and self.lease_until > now
        if lost is not None and lost > self.last_seen_at and not pinging:
            dead_since = min(dead_since, lost)
        alive = now < dead_since
        return self.model_copy(update={"alive": alive, "dead_since": None if alive else dead_since})


class Workers(BesideTasks):
    SUFFIX = SUFFIX

    def __init__(self, tasks: StoreBase) -> None:
        super().__init__(tasks)
        self._ttl_ready = False

    @driver_errors
    async def beat(self, info: WorkerInfo) -> None:
        """Write the worker's document whole (an upsert): the first beat registers it, and a
        document deleted meanwhile (by hand, or the TTL after a long stall) comes back."""
        if not self._ttl_ready:
            seconds = int(FORGET_AFTER.total_seconds())
            ttl = IndexModel([("last_seen_at", 1)], name=_TTL_INDEX, expireAfterSeconds=seconds)
            await self.collection.create_indexes([ttl])
            self._ttl_ready = True
        document = info.model_dump(by_alias=True, exclude=_READ_ONLY)
        worker_id = document.pop("_id")
        await self.collection.update_one({"_id": worker_id}, {"$set": document}, upsert=True)

    @driver_errors
    async def remove(self, worker_id: str) -> bool:
        result = await self.collection.delete_one({"_id": worker_id})
        return bool(result.deleted_count)

    @driver_errors
    async def get(self, worker_id: str) -> WorkerInfo | None:
        """The entry of ``worker_id`` (alive or stale, as judged now), if registered."""
        document = await self.collection.find_one({"_id": worker_id})
        if document is None:
            return None
        now = self._tasks.clock.now()
        held = await self._held(now)
        return _with_held(WorkerInfo.model_validate(document), held).judged(now)

    @driver_errors
    async def all(self, names: Sequence[str] | None = None) -> list[WorkerInfo]:
        """Every registered worker (serving any of ``names``), alive ones first, by id, each
        with what it holds now (one read of the running tasks, `_held`)."""
        registered = await self.registered(names)
        now = self._tasks.clock.now()
        held = await self._held(now) if registered else {}
        found = [_with_held(info, held).judged(now) for info in registered]
        return sorted(found, key=lambda w: (not w.alive, w.worker_id))

    @driver_errors
    async def registered(self, names: Sequence[str] | None = None) -> list[WorkerInfo]:
        """The entries as the workers wrote them (serving any of ``names``), judged by their
        heartbeats alone: one small read, for a consumer that counts its peers at each
        heartbeat (`all` adds what each holds, from the tasks)."""
        query: dict[str, Any] = {"names": {"$in": list(names)}} if names is not None else {}
        now = self._tasks.clock.now()
        found = []
        async for document in self.collection.find(query):
            found.append(WorkerInfo.model_validate(document).judged(now))
        return found

    async def _held(self, now: dt.datetime) -> dict[str, dict[str, Any]]:
        """What each worker id holds, from the running tasks: one aggregation over them."""
        await self._tasks.ready()
        pipeline = q.held_by_worker_pipeline(now, MAX_LISTED_KEYS)
        cursor = self._tasks.collection.aggregate(pipeline)
        if inspect.isawaitable(cursor):  # pymongo's async API; Motor returns the cursor
            cursor = await cursor
        return {row["_id"]: row async for row in cursor}


def _with_held(info: WorkerInfo, held: dict[str, dict[str, Any]]) -> WorkerInfo:
    row = held.get(info.worker_id, {})
    return info.model_copy(
        update={
            "running": row.get("running", 0),
            "running_keys": sorted(row.get("keys", [])),
            "lease_until": _utc(row.get("lease_until")),
            "lease_lost_at": _utc(row.get("lease_lost_at")),
        }
    )


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    return None if moment is None else to_bson_time(moment)
