"""What an operator does to the queue: read, cancel and change tasks by key, list them, retry
failed ones, purge old ones, count them, expire them (`Store.operations`)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pymongo import ReturnDocument

from .. import layout
from ..clock import to_bson_time
from ..encoding import check_document_size
from ..errors import ConfigurationError, StoreError, TaskNotFound
from ..models import (
    PublishResult,
    StatsRow,
    Task,
    TaskOptions,
    TaskState,
    check_key,
    check_name,
    checked,
)
from ..queries import flows as fq
from ..queries import tasks as q
from ..specs import PublishSpec
from .base import index_model
from .driver import driver_errors, driver_result

if TYPE_CHECKING:
    from .whole import WholeStore

log = logging.getLogger(__name__)

_RETRYABLE = (TaskState.FAIL, TaskState.CANCELLED)
_RETRY_ATTEMPTS = 5  # re-reads when another writer changed the task under a retry


def _cancelled_by(task: Task, dependency: str) -> bool:
    """Whether ``task`` is cancelled because ``dependency`` ended without success (what
    `queries.tasks.cancelled_by_filter` finds), not by an operator or another cause."""
    return (
        task.state is TaskState.CANCELLED
        and task.error is not None
        and task.error.type == "DependencyFailed"
        and dependency in task.deps_failed
    )


def parse_state(value: str | TaskState, field: str = "state") -> TaskState:
    try:
        return TaskState(value)
    except ValueError:
        known = ", ".join(state.value for state in TaskState)
        raise ConfigurationError(f"{field}: {value!r} is not one of {known}") from None


class Operations:
    """The operator's side of the store: each method one decision on tasks by key or by
    filter, written through the store's collection."""

    def __init__(self, store: WholeStore) -> None:
        self._store = store

    async def ensure_indexes(self, *, finished_ttl: dt.timedelta | None = None) -> list[str]:
        """The declared indexes; with ``finished_ttl``, also the TTL index of finished tasks."""
        names = await self._store.ensure_indexes()
        if finished_ttl is not None:
            names.append(await self.ensure_finished_ttl(finished_ttl))
        return names

    async def get(self, key: str) -> Task | None:
        return await self._store.get(key)

    @driver_errors
    async def cancel(self, key: str, reason: str = "cancelled") -> bool:
        """True if this call cancelled the task, False if it had already ended; `TaskNotFound`
        if no task has the key (a read more, only when nothing was cancelled)."""
        store = self._store
        await store.ready()
        now = store.clock.now()
        found = await store.collection.find_one_and_update(
            q.cancel_filter(checked(check_key, key)),
            q.cancel_update(reason, now),
            return_document=ReturnDocument.AFTER,
        )
        if found is None:
            if await store.collection.find_one(q.by_key(key), q.KEY_ONLY) is None:
                raise TaskNotFound(f"no task has the key {key!r}")
            return False
        log.info("task cancelled", extra={"action": "task_cancelled", "key": key})
        await store.tasks.after_write(Task.model_validate(found))
        return True

    @driver_errors
    async def cancel_many(
        self, name: str, states: Sequence[str | TaskState], reason: str = "cancelled"
    ) -> int:
        """Cancel every task of ``name`` in one of ``states`` (unfinished states only) in one
        write; how many it cancelled. Their holders hear of it as of `cancel` (the write wakes
        them); the dependents of those that have some are then told, as after `cancel`, by the
        catch-up that tells those of any finished task not told yet
        (`TaskStore.recover_dependents`).
        A task that changed state meanwhile is cancelled only if its state is still one of
        ``states`` when the write reaches it: each document is matched and written at once."""
        name = checked(check_name, name)
        if isinstance(states, str) or not states:
            raise ConfigurationError(f"states: expected a non-empty list of states, got {states!r}")
        chosen = [parse_state(state, "states") for state in states]
        finished = sorted(state.value for state in chosen if state.is_terminal)
        if finished:
            raise ConfigurationError(
                f"states: only unfinished tasks can be cancelled (pending, blocked, running), "
                f"not {finished}"
            )
        store = self._store
        await store.ready()
        result = await store.collection.update_many(
            q.cancel_many_filter(name, [state.value for state in chosen]),
            q.cancel_update(reason, store.clock.now()),
        )
        cancelled = int(result.modified_count)
        if cancelled:
            log.info(
                "tasks cancelled",
                extra={"action": "tasks_cancelled", "task_name": name, "count": cancelled},
            )
            await store.tasks.recover_dependents()
        return cancelled

    @driver_errors
    async def set_options(self, key: str, options: TaskOptions) -> Task | None:
        """Change the options of a task that has not finished; None if it has (or is gone)."""
        if not isinstance(options, TaskOptions):
            raise ConfigurationError(f"options: expected TaskOptions, got {type(options).__name__}")
        store = self._store
        key = checked(check_key, key)
        await store.ready()
        # New options may keep more room for results and states (a larger
        # concurrent_worker_cnt): the payload must still fit, as at publish.
        base = await store.collection.find_one(q.by_key(key), q.GROWING_FIELDS_EXCLUDED)
        if base is not None:
            check_document_size(base, options)
        found = await store.collection.find_one_and_update(
            q.options_filter(key),
            q.options_update(options, store.clock.now()),
            return_document=ReturnDocument.AFTER,
        )
        return None if found is None else await store.tasks.after_write(Task.model_validate(found))

    @driver_errors
    async def add_dependencies(self, edges: Sequence[tuple[str, str]]) -> list[Task]:
        await self._store.ready()
        return await self._store.flows.add_dependencies(edges)

    @driver_errors
    async def list_tasks(
        self, *, name: str | None = None, state: str | None = None, limit: int = 50
    ) -> list[Task]:
        """The newest tasks, optionally of one name and state."""
        if state is not None:
            state = parse_state(state).value
        if limit < 1:
            raise ConfigurationError(f"limit: must be at least 1, got {limit}")
        store = self._store
        await store.ready()
        cursor = store.collection.find(q.list_filter(name, state), sort=q.LIST_SORT, limit=limit)
        return [Task.model_validate(document) async for document in cursor]

    async def retry(self, key: str, *, with_dependents: bool = False) -> PublishResult:
        """Run a failed or cancelled task again: same name, payload and options, as the next
        run of its key (the attempts of the earlier runs are kept: `queries.history`).

        ``with_dependents``: also run again the dependents that its end cancelled, and theirs
        in turn (the cancellations it caused, a ``DependencyFailed`` naming it), dependencies
        first, so each waits for the one revived before it; a dependent that another failed
        dependency also cancelled stays as it is (it would only be cancelled again). Their
        keys are in the result's ``revived``."""
        result = await self._retry_one(key)
        if not with_dependents:
            return result
        revived: list[str] = []
        queue = [key]
        again = {key}
        while queue:
            dependency = queue.pop(0)
            for dependent in await self.cancelled_by(dependency):
                if dependent.key in again or not set(dependent.deps_failed) <= again:
                    continue
                try:
                    await self._retry_one(dependent.key, cancelled_by=dependency)
                except (ConfigurationError, TaskNotFound):
                    continue  # retried, changed or deleted meanwhile: not ours to revive
                again.add(dependent.key)
                revived.append(dependent.key)
                queue.append(dependent.key)
        if revived:
            log.info(
                "dependents revived",
                extra={"action": "dependents_revived", "key": key, "revived": revived},
            )
        return result.model_copy(update={"revived": revived})

    @driver_errors
    async def cancelled_by(self, key: str) -> list[Task]:
        """The dependents of ``key`` that its failure or cancellation cancelled, in key order."""
        store = self._store
        await store.ready()
        cursor = store.collection.find(q.cancelled_by_filter(key), sort=q.CANCELLED_BY_ORDER)
        return [Task.model_validate(document) async for document in cursor]

    async def _retry_one(self, key: str, *, cancelled_by: str | None = None) -> PublishResult:
        """The next run of ``key``, decided on one read and written only at that read's version
        (`Publisher.rerun`): a retry that raced another writer (a retry that ran it to success,
        an operator's cancel) decides again on what is there now. ``cancelled_by``: only while
        the end of that dependency is still what cancelled it."""
        for _ in range(_RETRY_ATTEMPTS):
            task = await self._store.get(key)
            if task is None:
                raise TaskNotFound(f"no task has the key {key!r}")
            if task.state not in _RETRYABLE:
                raise ConfigurationError(
                    f"task {key!r} is {task.state.value}: only failed or cancelled tasks are "
                    "retried"
                )
            if cancelled_by is not None and not _cancelled_by(task, cancelled_by):
                raise ConfigurationError(f"task {key!r} was not cancelled by {cancelled_by!r}")
            spec = PublishSpec.of(
                key,
                task.payload,
                name=task.name,
                options=task.options,
                replace_finished=True,
                depends_on=task.depends_on,
                allow_missing=True,
            )
            result = await self._store.publisher.rerun(task, spec)
            if result is not None:
                return result
        raise StoreError(f"retry {key!r}: the task kept changing; try again")

    @driver_errors
    async def retry_failed(
        self, *, name: str | None = None, limit: int = 1_000
    ) -> list[PublishResult]:
        """The dead-letter queue: run every failed task (of ``name``) again."""
        store = self._store
        await store.ready()
        cursor = store.collection.find(q.failed_filter(name), q.KEY_ONLY, limit=limit)
        keys = [document["key"] async for document in cursor]
        return [await self.retry(key) for key in keys]

    @driver_errors
    async def purge(
        self, states: Sequence[str], older_than: dt.timedelta, *, dry_run: bool = False
    ) -> int:
        """Delete finished tasks of ``states`` that ended more than ``older_than`` ago; with
        ``dry_run``, count them (the same filter, so the count is what a purge now deletes)."""
        chosen = [parse_state(state) for state in states]
        unfinished = [state.value for state in chosen if not state.is_terminal]
        if unfinished:
            raise ConfigurationError(f"purge: only finished tasks can be purged, not {unfinished}")
        store = self._store
        await store.ready()
        cutoff = store.clock.now() - older_than
        query = q.purge_filter([state.value for state in chosen], cutoff)
        if dry_run:
            return int(await store.collection.count_documents(query))
        result = await store.collection.delete_many(query)
        return int(result.deleted_count)

    @driver_errors
    async def ensure_finished_ttl(self, finished_ttl: dt.timedelta) -> str:
        """A TTL index: MongoDB deletes finished tasks ``finished_ttl`` after they ended and
        their dependents were told (``settled_at``; on ``finished_at`` it could delete a task
        before, and its dependents would stay blocked). Tasks that ended before ``settled_at``
        existed get it from ``finished_at`` once, where nothing is left to tell."""
        seconds = int(finished_ttl.total_seconds())
        if seconds < 1:
            raise ConfigurationError(
                f"finished_ttl: must be at least one second, got {finished_ttl}"
            )
        model = index_model(layout.FINISHED_TTL, expireAfterSeconds=seconds)
        await self._store.ensure_ttl_index(model)
        await self._store.collection.update_many(*fq.settled_backfill())
        return layout.FINISHED_TTL_INDEX

    @driver_errors
    async def stats(self) -> list[StatsRow]:
        """Counts by name and state in one aggregation, with running attempts and oldest age;
        then the paused names and the live workers (two small reads beside the tasks)."""
        store = self._store
        await store.ready()
        cursor = await driver_result(store.collection.aggregate(q.stats_pipeline()))
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
        # A paused name with no task is still listed (as 0 pending), so the pause is seen.
        paused = await store.pauses.reasons()
        for name in sorted(set(paused) - {row.name for row in rows}):
            rows.append(StatsRow(name=name, state=TaskState.PENDING, count=0))
        live: dict[str, int] = {}
        for worker in await store.workers.all():
            for name in worker.names if worker.alive else ():
                live[name] = live.get(name, 0) + 1
        rows = [
            row.model_copy(
                update={
                    "paused": row.name in paused,
                    "pause_reason": paused.get(row.name),
                    "live_workers": live.get(row.name, 0),
                }
            )
            for row in rows
        ]
        return sorted(rows, key=lambda row: (row.name, row.state.value))
