"""Ending the tasks not started by their ``expires_at``: a consumer does it now and then.

The claim filter already refuses an expired task, so this only makes the end visible: the
task becomes ``cancelled`` (error message ``expired: ...``), its dependents are told, and a
``wait`` on it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from pymongo import ReturnDocument

from ..models import Task
from ..queries import tasks as q
from ..queries import timing as eq
from .base import StoreBase, name_groups
from .driver import driver_errors

log = logging.getLogger(__name__)


class Expiry:
    def __init__(self, store: StoreBase, after_write: Callable[[Task], Awaitable[Task]]) -> None:
        self._store = store
        self._after_write = after_write  # TaskStore's: tells the dependents

    @driver_errors
    async def expire_due(self, names: Sequence[str]) -> list[str]:
        """Cancel the expired tasks of ``names``; their keys. One read when there are none."""
        store, now = self._store, self._store.clock.now()
        keys = []
        for group in name_groups(names):
            cursor = store.collection.find(eq.expired(group, now), q.KEY_ONLY)
            keys += [document["key"] async for document in cursor]
        ended = []
        for key in keys:
            found = await store.collection.find_one_and_update(
                eq.expire_filter(key, now),
                q.cancel_update(f"expired: not started by {now.isoformat()}", now),
                return_document=ReturnDocument.AFTER,
            )
            if found is not None:
                ended.append(key)
                log.info("task expired", extra={"action": "task_expired", "key": key})
                await self._after_write(Task.model_validate(found))
        return ended
