"""Partitions' turns (`queries.partitions`): where a partitioned task takes its place in its
name's claim order, decided as it is published. Only publishes of partitioned tasks come
here; a task without a partition costs nothing (no read, no write, no field)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pymongo import ReturnDocument

from .. import layout
from ..clock import to_bson_time
from ..errors import StoreError
from ..queries import partitions as pq
from ..specs import PublishSpec
from .base import BesideTasks, StoreBase, index_model
from .driver import driver_errors


class Partitions(BesideTasks):
    SUFFIX = layout.PARTITIONS

    def __init__(self, tasks: StoreBase) -> None:
        super().__init__(tasks)
        self._ttl_ready = False

    @driver_errors
    async def head(self, name: str, priority: int) -> dt.datetime:
        """The place of the first task a claim of ``name`` at ``priority`` would take now, or
        now if it is later or there is none: where a partition without a backlog starts.
        One indexed read of one document."""
        now = self._tasks.clock.now()
        # A find of one (not find_one): the memory engine walks its index for a find's limit.
        cursor = self._tasks.collection.find(
            pq.head_of(name, priority, now), pq.HEAD_PROJECTION, sort=pq.HEAD_SORT, limit=1
        )
        first = [document async for document in cursor]
        if not first:
            return now
        return min(to_bson_time(first[0]["created_at"]), now)

    @driver_errors
    async def take(self, name: str, partition: str, head: dt.datetime, count: int) -> dt.datetime:
        """The first of ``count`` turns of ``partition`` of ``name`` (the others follow it
        `queries.partitions.QUANTUM_MS` apart): one atomic update."""
        if not self._ttl_ready:
            await self.collection.create_indexes([index_model(layout.PARTITIONS_TTL)])
            self._ttl_ready = True
        now = self._tasks.clock.now()
        after = await self.collection.find_one_and_update(
            *pq.take_turns(name, partition, head, count, now),
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
        if after is None:  # pragma: no cover - an upsert returning the document after it
            raise StoreError(f"partition {partition!r} of {name!r}: its turns were not returned")
        return to_bson_time(pq.first_of(after, count))

    @driver_errors
    async def untake(self, name: str, partition: str, turn: dt.datetime) -> None:
        """``turn``, taken for a publish that created nothing, is given back
        (`queries.partitions.untake_turn`): one update, only on that path."""
        await self.collection.update_one(*pq.untake_turn(name, partition, turn))

    async def turns(self, specs: Sequence[PublishSpec]) -> dict[str, dt.datetime]:
        """The turn of each partitioned spec of ``specs`` (new tasks), by key, in their order
        within each partition: one read of the head per name and priority, one update per
        name and partition, whatever the number of tasks. Specs without a partition get none
        and cost nothing. Sent outside any transaction of the caller: turns taken for a
        batch that is not written are skipped, which nobody waits for."""
        groups: dict[tuple[str, int, str], list[str]] = {}
        for spec in specs:
            partition = spec.options.partition
            if partition is not None:
                group = groups.setdefault((spec.name, spec.options.priority, partition), [])
                group.append(spec.key)
        heads: dict[tuple[str, int], dt.datetime] = {}
        turns: dict[str, dt.datetime] = {}
        for (name, priority, partition), keys in groups.items():
            if (name, priority) not in heads:
                heads[name, priority] = await self.head(name, priority)
            turn = await self.take(name, partition, heads[name, priority], len(keys))
            for key in keys:
                turns[key] = turn
                turn += dt.timedelta(milliseconds=pq.QUANTUM_MS)
        return turns
