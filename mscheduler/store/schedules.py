"""Periodic tasks in the database: schedule documents, and publishing their occurrences.

Any consumer runs `ScheduleStore.publish_due` (see `Consumer`); N of them at once publish each
occurrence once, as its key is derived from the schedule and the time (`periodic`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from pymongo.errors import DuplicateKeyError

from .. import layout
from ..errors import StoreError
from ..models import PublishResult, TaskOptions, TaskState
from ..observability import tracing
from ..periodic import Schedule, due, reregistered, schedule_document
from ..queries import schedules as sq
from ..specs import PublishSpec
from .base import BesideTasks, StoreBase, index_model
from .driver import driver_errors
from .publisher import Publisher

log = logging.getLogger(__name__)

# Registrations of one id that may lose to other writes in a row before giving up: each loss
# is another worker's advance or registration, a few a minute at most.
_PUT_ATTEMPTS = 16


class ScheduleStore(BesideTasks):
    """The schedules beside a task collection (``tasks`` → ``tasks.schedules``)."""

    SUFFIX = layout.SCHEDULES

    def __init__(self, tasks: StoreBase, publisher: Publisher) -> None:
        super().__init__(tasks)
        self._publisher = publisher

    async def _ready(self) -> None:
        models = [index_model(index) for index in layout.SCHEDULE_INDEXES]
        await self.collection.create_indexes(models)

    @driver_errors
    async def put(self, wanted: Schedule) -> Schedule:
        """Create a schedule, or register it again by id: an unchanged one is left as it is
        (no write), a changed one keeps its state as far as the change allows
        (`periodic.reregistered`). Returns the schedule as stored."""
        await self._ready()
        now = self._tasks.clock.now()
        for _ in range(_PUT_ATTEMPTS):
            found = await self.collection.find_one(sq.by_id(wanted.id))
            if found is None:
                try:
                    await self.collection.insert_one(schedule_document(wanted))
                    await self._tasks.control_changed()
                    return wanted
                except DuplicateKeyError:  # registered meanwhile: merge with that one
                    continue
            stored = Schedule.model_validate(found)
            merged = reregistered(stored, wanted, now)
            if merged is stored:
                return stored
            merged = merged.model_copy(update={"version": stored.version + 1})
            replaced = await self.collection.find_one_and_replace(
                sq.at_version(stored.id, stored.version), schedule_document(merged)
            )
            if replaced is not None:
                await self._tasks.control_changed()
                return merged
            # Advanced or registered meanwhile: merge with what is there now.
        raise StoreError(
            f"schedule {wanted.id!r}: changed by others {_PUT_ATTEMPTS} times while it was "
            "registered; nothing was written"
        )

    @driver_errors
    async def remove(self, schedule_id: str) -> bool:
        """True if the schedule was there. The control version is bumped either way
        (`store.controls`)."""
        result = await self.collection.delete_one(sq.by_id(schedule_id))
        await self._tasks.control_changed()
        return bool(result.deleted_count)

    @driver_errors
    async def all(self, names: Sequence[str] | None = None) -> list[Schedule]:
        cursor = self.collection.find(sq.listed(names), sort=sq.ID_ORDER)
        return [Schedule.model_validate(document) async for document in cursor]

    @driver_errors
    async def next_due(self, names: Sequence[str]) -> dt.datetime | None:
        """When the next occurrence of ``names`` comes, for a consumer to sleep until."""
        found = await self.collection.find_one(sq.of_names(names), sort=sq.NEXT_SORT)
        return None if found is None else Schedule.model_validate(found).next_at

    @driver_errors
    async def publish_due(self, names: Sequence[str]) -> list[PublishResult]:
        """Publish every due occurrence of the schedules of ``names``; one read when none is."""
        now = self._tasks.clock.now()
        published: list[PublishResult] = []
        async for document in self.collection.find(sq.due_filter(names, now)):
            published += await self._publish_occurrences(Schedule.model_validate(document), now)
        return published

    async def _publish_occurrences(
        self, schedule: Schedule, now: dt.datetime
    ) -> list[PublishResult]:
        occurrences, next_at = due(schedule, now)
        published: list[PublishResult] = []
        last_key = schedule.last_key
        for occurrence in occurrences:
            if schedule.skip_if_running and await self._still_running(last_key):
                log.info(
                    "schedule %r: the previous occurrence still runs; %s skipped",
                    schedule.id,
                    occurrence.isoformat(),
                    extra={"action": "schedule_skip", "schedule": schedule.id, "key": last_key},
                )
                continue
            key = schedule.key_of(occurrence)
            options = TaskOptions.model_validate(
                {**schedule.options.model_dump(), "not_before": schedule.start_of(occurrence)}
            )
            with tracing.publishing("publish", [schedule.name], key=key, schedule_id=schedule.id):
                published.append(
                    await self._publisher.publish(
                        PublishSpec.of(key, schedule.payload, name=schedule.name, options=options)
                    )
                )
            last_key = key
        await self.collection.update_one(
            *sq.advance(schedule.id, schedule.next_at, next_at, last_key, now)
        )
        return published

    async def _still_running(self, key: str | None) -> bool:
        if key is None:
            return False
        task = await self._tasks.get(key)
        return task is not None and task.state in (
            TaskState.PENDING,
            TaskState.BLOCKED,
            TaskState.RUNNING,
        )
