"""Remote stops: a document per worker id in ``<collection>.stops``, asking that worker to stop
(`Scheduler.stop_worker`). Carried like a pause: the write is followed by the control
version's bump (`store.controls`), and each consumer reads its own stop document on every
control change and every ``schedule_refresh_ms`` (`consumer.controls`), so a stop whose bump
was lost still arrives.

Invariants:
- A stop names the *instance* of the worker it is for (`WorkerInfo.instance`, drawn afresh
  each time a consumer starts), read from the live workers when it is requested: a worker
  that restarts under the same id is a new instance, and a stop meant for the old one never
  stops it.
- A stop document is deleted once applied (matched on its own ``request`` token, so a later
  stop written meanwhile, say ``drain=False`` after ``drain=True``, is not deleted unread), or
  by the next instance of the id when it was requested before that instance started (it was
  for an earlier one), or by a TTL index `layout.FORGET_AFTER` later (a worker that died unstopped).
  "Before" compares the requester's clock with the worker's: with clocks far apart a stale
  request may outlive a quick restart, ignored (its instance is not this run's) until the TTL.
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field

from .. import layout
from ..models import UtcDatetime, WorkerInfo
from ..queries import workers as wq
from .base import BesideTasks, StoreBase, index_model
from .driver import driver_errors


class StopRequest(BaseModel):
    """A request that the worker ``worker_id`` (its start ``instance``) stop: after its
    running tasks (``drain``) or releasing them at once."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    worker_id: str = Field(alias="_id")
    instance: str
    drain: bool
    request: str  # this request's own token: what its deletion matches
    requested_at: UtcDatetime


class Stops(BesideTasks):
    SUFFIX = layout.STOPS

    def __init__(self, tasks: StoreBase) -> None:
        super().__init__(tasks)
        self._ttl_ready = False

    @driver_errors
    async def request(self, worker: WorkerInfo, drain: bool) -> StopRequest:
        """Ask ``worker`` (the instance described) to stop; replaces an earlier request for
        its id. The control version is bumped whatever happened before: a retried call tells
        the consumers at once (`store.controls`)."""
        if not self._ttl_ready:
            await self.collection.create_indexes([index_model(layout.STOPS_TTL)])
            self._ttl_ready = True
        stop = StopRequest(
            worker_id=worker.worker_id,
            instance=worker.instance,
            drain=drain,
            request=uuid.uuid4().hex,
            requested_at=self._tasks.clock.now(),
        )
        document = stop.model_dump(by_alias=True)
        document.pop("_id")
        await self.collection.update_one(*wq.put(stop.worker_id, document), upsert=True)
        await self._tasks.control_changed()
        return stop

    @driver_errors
    async def of(self, worker_id: str) -> StopRequest | None:
        """The stop requested of ``worker_id``, if any (for whichever instance)."""
        found = await self.collection.find_one(wq.by_id(worker_id))
        return None if found is None else StopRequest.model_validate(found)

    @driver_errors
    async def clear(self, stop: StopRequest) -> bool:
        """Delete ``stop`` (applied, or stale), unless another request replaced it."""
        found = await self.collection.delete_one(wq.this_request(stop.worker_id, stop.request))
        return bool(found.deleted_count)
