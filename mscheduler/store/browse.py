"""Reads for an operator's view of the queue (the dashboard): pages of tasks, the names, a
task's dependents, why names are paused, and how many tasks ended per time bucket. Each read
is served by a declared index (`queries.browse` says which), whatever the collection's size.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bson import ObjectId
from bson.errors import InvalidId

from .. import constants as c
from ..clock import to_bson_time
from ..errors import ConfigurationError
from ..models import FinishedCount, PausedName, Task, TaskPage, TaskState
from ..queries import browse as q
from ..queries import tasks as tq
from .driver import driver_errors
from .operations import parse_state

if TYPE_CHECKING:
    from .whole import WholeStore


def _position(task: Task, order: str) -> str:
    if order == "key":
        return "k:" + task.key
    if order == "newest":
        return "i:" + str(task.id)
    place = task.turn or task.created_at  # a partitioned task's place is its turn
    millis = int(to_bson_time(place).timestamp() * 1000)
    return f"c:{task.options.priority}:{millis}:{task.id}"


def _parse_position(after: str, order: str) -> str | ObjectId | tuple[int, dt.datetime, ObjectId]:
    """The position ``after`` names, for a page in ``order``; a token of another order, or
    one that was tampered with, is refused rather than read as the first page. So is one
    whose numbers no task can have (a priority out of its range, a time past any date): no
    engine would find it, and a server would fail to encode it."""
    kind, _, rest = after.partition(":")
    try:
        if order == "key" and kind == "k":
            return rest
        if order == "newest" and kind == "i":
            return ObjectId(rest)
        if order == "claim" and kind == "c":
            priority_text, millis, task_id = rest.split(":")
            priority = int(priority_text)
            created = dt.datetime.fromtimestamp(int(millis) / 1000, dt.timezone.utc)
            if c.MIN_PRIORITY <= priority <= c.MAX_PRIORITY:
                return priority, created, ObjectId(task_id)
    except (ValueError, InvalidId, OverflowError, OSError):
        pass
    raise ConfigurationError(f"after: {after!r} is not a position in this list")


class Browse:
    """The operator's reads of a store (`Store` ``.browse``): the dashboard's pages."""

    def __init__(self, store: WholeStore) -> None:
        self._store = store

    @driver_errors
    async def task_names(self, limit: int = c.MAX_NAMES) -> list[str]:
        """Every task name, in order: one index seek per name (a loose scan of claim_order_v2)."""
        store = self._store
        await store.ready()
        names: list[str] = []
        last: str | None = None
        while len(names) < limit:
            found = await store.collection.find_one(
                q.name_after_filter(last), q.NAME_ONLY, sort=q.NAME_ORDER
            )
            if found is None:
                break
            last = str(found["name"])
            names.append(last)
        return names

    @driver_errors
    async def task_page(
        self,
        *,
        name: str | None = None,
        state: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> TaskPage:
        """One page of tasks filtered by name, state and key prefix, and the token of the next.

        The filter chooses the order, so an index both selects and sorts the rows: a key prefix
        pages through its range of keys; a name or a state through claim_order_v2 in claim order
        (a state alone over every name, listed by `task_names`); no filter, newest first."""
        store = self._store
        if state is not None:
            state = parse_state(state).value
        if not 1 <= limit <= c.MAX_PAGE:
            raise ConfigurationError(f"limit: expected 1 to {c.MAX_PAGE}, got {limit}")
        await store.ready()
        order = "key" if prefix else "claim" if name or state else "newest"
        position = _parse_position(after, order) if after else None
        if order == "key":
            assert prefix
            query = q.prefix_page_filter(prefix, name, state, position)  # type: ignore[arg-type]
            sort = q.KEY_ORDER
        elif order == "claim":
            names = [name] if name else await self.task_names()
            states = [state] if state else [s.value for s in TaskState]
            query = q.claim_order_page_filter(names, states, position)  # type: ignore[arg-type]
            sort = tq.CLAIM_SORT
        else:
            query = q.newest_page_filter(position)  # type: ignore[arg-type]
            sort = q.NEWEST_ORDER
        # One row more than the page tells whether a next page exists, without a count.
        cursor = store.collection.find(query, sort=sort, limit=limit + 1)
        tasks = [Task.model_validate(document) async for document in cursor]
        more = len(tasks) > limit
        tasks = tasks[:limit]
        return TaskPage(tasks, _position(tasks[-1], order) if more else None, order)

    @driver_errors
    async def states_of(self, keys: Sequence[str]) -> dict[str, TaskState]:
        """The state of each task of ``keys`` that exists, in one read."""
        store = self._store
        await store.ready()
        cursor = store.collection.find(tq.by_keys(keys), q.KEY_AND_STATE)
        return {document["key"]: TaskState(document["state"]) async for document in cursor}

    @driver_errors
    async def dependents(self, key: str, limit: int = 100) -> list[Task]:
        """The tasks that depend on ``key``: at most ``limit`` of them, shown in key order."""
        store = self._store
        await store.ready()
        cursor = store.collection.find(q.dependents_filter(key), limit=limit)
        found = [Task.model_validate(document) async for document in cursor]
        return sorted(found, key=lambda task: task.key)

    @driver_errors
    async def paused_names(self) -> dict[str, PausedName]:
        """The paused names, with when and why each was paused."""
        store = self._store
        return {
            document["_id"]: PausedName(document["paused_at"], str(document.get("reason") or ""))
            async for document in store.pauses.collection.find(q.EVERY)
        }

    @driver_errors
    async def finished_counts(
        self, *, until: dt.datetime, bucket: dt.timedelta, buckets: int
    ) -> list[FinishedCount]:
        """How many tasks succeeded and failed in each of ``buckets`` buckets ending at ``until``,
        oldest first: two counts per bucket, each a range of the finished index (a count of
        index keys, no document read)."""
        store = self._store
        await store.ready()
        found = []
        for n in range(buckets, 0, -1):
            end = until - bucket * (n - 1)
            start = end - bucket
            counts = [
                int(
                    await store.collection.count_documents(
                        q.finished_filter(state.value, start, end)
                    )
                )
                for state in (TaskState.SUCCESS, TaskState.FAIL)
            ]
            found.append(FinishedCount(start, end, counts[0], counts[1]))
        return found
