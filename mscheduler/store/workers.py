"""The live workers: a document per consumer in ``<collection>.workers``, beside the tasks.

A consumer writes its document when it starts, rewrites it once per heartbeat (one small
upsert: when it was last seen and what it runs now) and deletes it when it stops. A worker
that died without stopping (kill -9, a lost host) leaves its document behind: it is shown as
stale once ``last_seen_at`` is older than `models.STALE_AFTER_BEATS` heartbeats, and a TTL index
removes it a day later. Nothing else reads these documents to decide anything about a task:
they are what operators (``mscheduler workers``, ``stats``, a dashboard) look at.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import layout
from ..models import WorkerInfo
from ..queries import workers as wq
from .base import BesideTasks, StoreBase, index_model
from .driver import driver_errors

# A worker is stale once it missed this many heartbeats: one late write is not a death.
STALE_AFTER_BEATS = 3
# How many of its running keys a worker lists (the count is always exact): keys are up to
# 512 characters, and a worker may run 100,000 tasks; the document must stay small.
MAX_LISTED_KEYS = 20


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
        document = info.model_dump(by_alias=True, exclude={"alive"})
        worker_id = document.pop("_id")
        await self.collection.update_one(*wq.put(worker_id, document), upsert=True)

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
        info = WorkerInfo.model_validate(document)
        return info.model_copy(update={"alive": info.is_alive(self._tasks.clock.now())})

    @driver_errors
    async def all(self, names: Sequence[str] | None = None) -> list[WorkerInfo]:
        """Every registered worker (serving any of ``names``), alive ones first, by id."""
        now = self._tasks.clock.now()
        found = []
        async for document in self.collection.find(wq.serving(names)):
            info = WorkerInfo.model_validate(document)
            found.append(info.model_copy(update={"alive": info.is_alive(now)}))
        return sorted(found, key=lambda w: (not w.alive, w.worker_id))
