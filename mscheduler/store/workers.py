"""The live workers: a document per consumer in ``<collection>.workers``, beside the tasks,
and what each holds, read from the tasks themselves.

A consumer writes its document when it starts, rewrites it once per heartbeat (one small
upsert: when it was last seen) and deletes it when it stops. What a worker runs is not taken
from that document, which is as old as its last heartbeat: `Workers.all` reads it from the
running tasks' worker states (`queries.tasks.held_by_worker_pipeline`), exact as of each
task's last write (a claim, a ping, a finish), at no write of its own.

A worker that died without stopping (kill -9, a lost host) leaves its document behind. It is
judged dead (`liveness.judged`) from the first of two promises it broke: a heartbeat every
``heartbeat_ms`` (dead `liveness.STALE_AFTER_BEATS` heartbeats after the last), and a ping of every
task it runs before its lease expires (dead when its leases expired after its last
heartbeat, and none is live). The first read that finds it dead records when and why in its
document (`WorkerInfo.found_dead`), which later reads keep until it beats again: the tasks
whose leases showed it may end meanwhile. A TTL index removes the document a day later. Nothing else
reads these documents to decide anything about a task: they are what operators
(``mscheduler workers``, ``stats``, a dashboard) look at, and what the ``spread`` claim
policy counts its peers from.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from pymongo import UpdateOne

from .. import layout, liveness
from ..clock import to_bson_time
from ..models import WorkerInfo
from ..queries import tasks as q
from ..queries import workers as wq
from .base import BesideTasks, StoreBase, index_model
from .driver import driver_errors, driver_result

# How many of its running keys a worker lists (the count is always exact): keys are up to
# 512 characters, and a worker may run 100,000 tasks; the document must stay small.
MAX_LISTED_KEYS = 20
# Fields of `WorkerInfo` its reader sets, never stored by a heartbeat (``found_dead``: by the
# reader that finds it dead, `_recorded`).
_READ_ONLY = {
    "alive",
    "dead_since",
    "lease_until",
    "lease_lost_at",
    "lease_lost_claimed_at",
    wq.FOUND_DEAD,
}


class Workers(BesideTasks):
    SUFFIX = layout.WORKERS

    def __init__(self, tasks: StoreBase) -> None:
        super().__init__(tasks)
        self._ttl_ready = False

    @driver_errors
    async def beat(self, info: WorkerInfo) -> None:
        """Write the worker's document whole (an upsert): the first beat registers it, and a
        document deleted meanwhile (by hand, or the TTL after a long stall) comes back."""
        if not self._ttl_ready:
            await self.collection.create_indexes([index_model(layout.WORKERS_TTL)])
            self._ttl_ready = True
        document = info.model_dump(by_alias=True, exclude=_READ_ONLY)
        worker_id = document.pop("_id")
        await self.collection.update_one(*wq.heartbeat(worker_id, document), upsert=True)

    @driver_errors
    async def remove(self, worker_id: str) -> bool:
        result = await self.collection.delete_one(wq.by_id(worker_id))
        return bool(result.deleted_count)

    @driver_errors
    async def get(self, worker_id: str) -> WorkerInfo | None:
        """The entry of ``worker_id`` (alive or stale, as judged now), if registered."""
        document = await self.collection.find_one(wq.by_id(worker_id))
        if document is None:
            return None
        now = self._tasks.clock.now()
        held = await self._held(now)
        [info] = await self._recorded([_with_held(WorkerInfo.model_validate(document), held)], now)
        return info

    @driver_errors
    async def all(self, names: Sequence[str] | None = None) -> list[WorkerInfo]:
        """Every registered worker (serving any of ``names``), alive ones first, by id, each
        with what it holds now (one read of the running tasks, `_held`)."""
        registered = await self.registered(names)
        now = self._tasks.clock.now()
        held = await self._held(now) if registered else {}
        found = await self._recorded([_with_held(info, held) for info in registered], now)
        return sorted(found, key=lambda w: (not w.alive, w.worker_id))

    async def _recorded(self, entries: list[WorkerInfo], now: dt.datetime) -> list[WorkerInfo]:
        """``entries`` judged as of ``now``, each death found for the first time recorded in
        its entry (one bulk write, only when there is one): later reads keep its time and
        reason (`WorkerInfo.found_dead`)."""
        judged = [liveness.judged(info, now) for info in entries]
        newly = [info for info in judged if not info.alive and info.found_dead is None]
        if newly:
            await self.collection.bulk_write(
                [
                    UpdateOne(
                        *wq.record_death(
                            info.worker_id, info.last_seen_at, info.dead_since, info.dead_because
                        )
                    )
                    for info in newly
                    if info.dead_since is not None
                ],
                ordered=False,
            )
        return judged

    @driver_errors
    async def registered(self, names: Sequence[str] | None = None) -> list[WorkerInfo]:
        """The entries as the workers wrote them (serving any of ``names``), judged by their
        heartbeats alone or a death recorded: one small read, for a consumer that counts its
        peers at each heartbeat (`all` adds what each holds, from the tasks)."""
        now = self._tasks.clock.now()
        found = []
        async for document in self.collection.find(wq.serving(names)):
            found.append(liveness.judged(WorkerInfo.model_validate(document), now))
        return found

    async def _held(self, now: dt.datetime) -> dict[str, dict[str, Any]]:
        """What each worker id holds, from the running tasks: one aggregation over them."""
        await self._tasks.ready()
        pipeline = q.held_by_worker_pipeline(now, MAX_LISTED_KEYS)
        cursor = await driver_result(self._tasks.collection.aggregate(pipeline))
        return {row["_id"]: row async for row in cursor}


def _with_held(info: WorkerInfo, held: dict[str, dict[str, Any]]) -> WorkerInfo:
    row = held.get(info.worker_id, {})
    return info.model_copy(
        update={
            "running": row.get("running", 0),
            "running_keys": sorted(row.get("keys", [])),
            "lease_until": _utc(row.get("lease_until")),
            "lease_lost_at": _utc(row.get("lease_lost_at")),
            "lease_lost_claimed_at": _utc(row.get("lease_lost_claimed_at")),
        }
    )


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    return None if moment is None else to_bson_time(moment)
