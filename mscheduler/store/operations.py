"""What an operator does to the queue: list, retry failed tasks, purge old ones, expire them."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pymongo import IndexModel

from .. import constants as c
from ..clock import to_bson_time
from ..errors import ConfigurationError, TaskNotFound
from ..models import PublishResult, StatsRow, Task, TaskState
from ..queries import flows as fq
from ..queries import tasks as q

if TYPE_CHECKING:
    from .tasks import TaskStore

_RETRYABLE = (TaskState.FAIL, TaskState.CANCELLED)


def parse_state(value: str) -> TaskState:
    try:
        return TaskState(value)
    except ValueError:
        known = ", ".join(state.value for state in TaskState)
        raise ConfigurationError(f"state: {value!r} is not one of {known}") from None


async def list_tasks(
    store: TaskStore, *, name: str | None = None, state: str | None = None, limit: int = 50
) -> list[Task]:
    """The newest tasks, optionally of one name and state."""
    if state is not None:
        state = parse_state(state).value
    if limit < 1:
        raise ConfigurationError(f"limit: must be at least 1, got {limit}")
    await store._ready()
    cursor = store.collection.find(q.list_filter(name, state), sort=q.LIST_SORT, limit=limit)
    return [Task.model_validate(document) async for document in cursor]


async def retry(store: TaskStore, key: str) -> PublishResult:
    """Run a failed or cancelled task again: same name, payload and options, no history."""
    task = await store.get(key)
    if task is None:
        raise TaskNotFound(f"no task has the key {key!r}")
    if task.state not in _RETRYABLE:
        raise ConfigurationError(
            f"task {key!r} is {task.state.value}: only failed or cancelled tasks are retried"
        )
    return await store.publisher.publish(
        key,
        task.payload,
        name=task.name,
        options=task.options,
        replace_finished=True,
        depends_on=task.depends_on,
        allow_missing=True,
    )


async def retry_failed(
    store: TaskStore, *, name: str | None = None, limit: int = 1_000
) -> list[PublishResult]:
    """The dead-letter queue: run every failed task (of ``name``) again."""
    await store._ready()
    cursor = store.collection.find(q.failed_filter(name), {"key": 1}, limit=limit)
    keys = [document["key"] async for document in cursor]
    return [await retry(store, key) for key in keys]


async def purge(store: TaskStore, *, states: Sequence[str], older_than: dt.timedelta) -> int:
    """Delete finished tasks of ``states`` that ended more than ``older_than`` ago."""
    chosen = [parse_state(state) for state in states]
    unfinished = [state.value for state in chosen if not state.is_terminal]
    if unfinished:
        raise ConfigurationError(f"purge: only finished tasks can be purged, not {unfinished}")
    await store._ready()
    cutoff = store.clock.now() - older_than
    result = await store.collection.delete_many(
        q.purge_filter([state.value for state in chosen], cutoff)
    )
    return int(result.deleted_count)


async def ensure_finished_ttl(store: TaskStore, finished_ttl: dt.timedelta) -> str:
    """A TTL index: MongoDB deletes finished tasks ``finished_ttl`` after they ended and their
    dependents were told (``settled_at``; on ``finished_at`` it could delete a task before, and
    its dependents would stay blocked). Tasks that ended before ``settled_at`` existed get it
    from ``finished_at`` once, where nothing is left to tell."""
    seconds = int(finished_ttl.total_seconds())
    if seconds < 1:
        raise ConfigurationError(f"finished_ttl: must be at least one second, got {finished_ttl}")
    model = IndexModel([("settled_at", 1)], name=c.FINISHED_TTL_INDEX, expireAfterSeconds=seconds)
    await store.ensure_ttl_index(model)
    await store.collection.update_many(*fq.settled_backfill())
    return c.FINISHED_TTL_INDEX


async def stats(store: TaskStore) -> list[StatsRow]:
    """Counts by name and state in one aggregation, with running workers and oldest age."""
    await store._ready()
    cursor = store.collection.aggregate(q.stats_pipeline())
    if inspect.isawaitable(cursor):  # pymongo's async API; Motor returns the cursor
        cursor = await cursor
    now = store.clock.now()
    rows = []
    async for group in cursor:
        state = TaskState(group["_id"]["state"])
        oldest = group.get("oldest_created_at")
        age = None
        if state is TaskState.PENDING and oldest is not None:
            age = (now - to_bson_time(oldest)).total_seconds()
        rows.append(
            StatsRow(
                name=group["_id"]["name"],
                state=state,
                count=group["count"],
                running_workers=group["running_workers"],
                oldest_age_s=age,
            )
        )
    paused = await store.pauses.paused(sorted({row.name for row in rows}))
    rows = [row.model_copy(update={"paused": row.name in paused}) for row in rows]
    return sorted(rows, key=lambda row: (row.name, row.state.value))
