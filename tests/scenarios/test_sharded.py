"""Claims on a collection sharded on ``key``, behind a mongos: MongoDB 6.0 and 7.0 refuse a
findAndModify whose filter has no equality on the shard key (a claim by names has none), so
claims by name read candidates (``_id`` and ``key``) and then write each by both."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

import mscheduler as ms
from mscheduler.testing import ManualClock

pytestmark = pytest.mark.anyio
SHARD_KEY_NOT_FOUND = 61


def names_the_shard_key(filter: Any) -> bool:
    return isinstance(filter, dict) and isinstance(filter.get("key"), str)


class Mongos:
    """A collection sharded on ``key`` as a mongos serves it (what the claims meet)."""

    def __init__(self, collection: Any) -> None:
        self._collection = collection
        self.database = _Database(collection.database)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collection, name)

    async def find_one_and_update(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        if not names_the_shard_key(filter):
            raise OperationFailure(
                "Query for sharded findAndModify must contain the shard key", SHARD_KEY_NOT_FOUND
            )
        return await self._collection.find_one_and_update(filter, *args, **kwargs)

    async def bulk_write(self, requests: list[Any], **kwargs: Any) -> Any:
        for request in requests:
            if not names_the_shard_key(request._filter):
                raise OperationFailure("an update must target one shard", SHARD_KEY_NOT_FOUND)
        return await self._collection.bulk_write(requests, **kwargs)


class _Database:
    def __init__(self, database: Any) -> None:
        self._database = database

    def __getattr__(self, name: str) -> Any:
        return getattr(self._database, name)

    async def command(self, command: dict[str, Any], **kwargs: Any) -> Any:
        if "hello" in command:
            return {"isWritablePrimary": True, "msg": "isdbgrid"}
        return await self._database.command(command, **kwargs)


async def test_claims_by_name_behind_a_mongos_name_the_shard_key(
    scheduler: ms.Scheduler, clock: ManualClock
):
    scheduler = ms.Scheduler(Mongos(scheduler.collection), clock=clock)
    for n in range(4):
        await scheduler.publish(f"k{n}", None, name="job", options=ms.TaskOptions(priority=n))
    lease = await scheduler.store.tasks.claim("w", names=["job"])
    assert lease is not None and lease.key == "k3", "the best of the name"
    leases = await scheduler.store.tasks.claim_many("w", names=["job"], limit=2)
    assert [lease.key for lease in leases] == ["k2", "k1"]
    assert await scheduler.store.tasks.claim("w", key="k0") is not None
