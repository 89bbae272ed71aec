"""Paused task names: a document per name in ``<collection>.paused``; consumers claim none.

Pausing is advisory for claims, not a lock: a claim already on its way when the pause is
written may still land; after that, consumers of the name stop claiming it (within one change event,
one poll interval without change streams: `store.controls`). Running tasks finish as usual.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pymongo.errors import DuplicateKeyError

from .. import layout
from ..models import check_name, checked
from ..queries import pauses as pq
from .base import BesideTasks
from .driver import driver_errors


class Pauses(BesideTasks):
    SUFFIX = layout.PAUSED

    @driver_errors
    async def pause(self, name: str, reason: str = "") -> bool:
        """True if this call paused ``name``; False if it was paused already. The control
        version is bumped either way (`store.controls`)."""
        name = checked(check_name, name)
        document = {"_id": name, "reason": reason, "paused_at": self._tasks.clock.now()}
        try:
            await self.collection.insert_one(document)
        except DuplicateKeyError:
            paused = False
        else:
            paused = True
        await self._tasks.control_changed()
        return paused

    @driver_errors
    async def resume(self, name: str) -> bool:
        """True if ``name`` was paused. The control version is bumped either way."""
        result = await self.collection.delete_one(pq.by_name(checked(check_name, name)))
        await self._tasks.control_changed()
        return bool(result.deleted_count)

    @driver_errors
    async def paused(self, names: Sequence[str] | None = None) -> dict[str, dt.datetime]:
        """Paused names (of ``names``), with when each was paused."""
        cursor = self.collection.find(pq.of_names(names))
        return {d["_id"]: d["paused_at"] async for d in cursor}

    @driver_errors
    async def reasons(self, names: Sequence[str] | None = None) -> dict[str, str]:
        """Paused names (of ``names``), with the reason each was paused for."""
        cursor = self.collection.find(pq.of_names(names))
        return {d["_id"]: d.get("reason", "") async for d in cursor}
