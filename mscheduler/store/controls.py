"""The control version: one number in ``<collection>.controls``, bumped by every control write
(a paused name, a limit, a schedule, a stop), so every process knows to read its controls
again (`services.controls.ControlHub` watches it)."""

from __future__ import annotations

from .. import layout
from ..queries import controls as cq
from .base import BesideTasks
from .driver import driver_errors


class ControlVersion(BesideTasks):
    SUFFIX = layout.CONTROLS

    @driver_errors
    async def bump(self) -> None:
        """After a control write: every process reads its controls again."""
        await self.collection.update_one(*cq.bump(self._tasks.clock.now()), upsert=True)

    @driver_errors
    async def read(self) -> int:
        found = await self.collection.find_one(cq.VERSION, cq.VERSION_ONLY)
        return 0 if found is None else int(found.get("version", 0))
