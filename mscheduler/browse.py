"""`Browse`: the operator's reads of the queue, `Scheduler.browse`.

What a view of the queue needs beyond `Scheduler.get`, `Scheduler.stats` and the other
methods of the scheduler: pages of tasks in an order an index serves, the names, a task's
dependents and the states of its dependencies, why names are paused, how many tasks ended
per time bucket. The dashboard is built on these reads alone; a page of your own can be too.
Each is served by a declared index, whatever the collection's size, and returns the public
models of `mscheduler.models`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from . import constants as c
from .models import FinishedCount, PausedName, Task, TaskPage, TaskState
from .store.components import Store

__all__ = ["Browse"]


class Browse:
    """Read-only views of the queue (`Scheduler.browse`): nothing here writes."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def task_names(self, limit: int = c.MAX_NAMES) -> list[str]:
        """Every task name, in order (at most ``limit``)."""
        return await self._store.browse.task_names(limit)

    async def task_page(
        self,
        *,
        name: str | None = None,
        state: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> TaskPage:
        """One page of at most ``limit`` tasks (1 to `constants.MAX_PAGE`), filtered by
        ``name``, ``state`` and key ``prefix``, and the token of the next page (pass it as
        ``after``). The filter chooses the order: a key prefix lists keys in order; a name or
        a state lists tasks in claim order (priority, then age); no filter, newest first. A
        token of another order, or one that was tampered with, is refused
        (`ConfigurationError` naming ``after``)."""
        return await self._store.browse.task_page(
            name=name, state=state, prefix=prefix, after=after, limit=limit
        )

    async def states_of(self, keys: Sequence[str]) -> dict[str, TaskState]:
        """The state of each task of ``keys`` that exists, in one read."""
        return await self._store.browse.states_of(keys)

    async def dependents(self, key: str, *, limit: int = 100) -> list[Task]:
        """The tasks that depend on ``key``: at most ``limit`` of them, in key order."""
        return await self._store.browse.dependents(key, limit)

    async def cancelled_dependents(self, key: str) -> list[Task]:
        """The dependents of ``key`` that its failure or cancellation cancelled, in key
        order: what `Scheduler.retry` with ``with_dependents`` runs again first."""
        return await self._store.operations.cancelled_by(key)

    async def paused_names(self) -> dict[str, PausedName]:
        """The paused names, with when and why each was paused."""
        return await self._store.browse.paused_names()

    async def finished_counts(
        self, *, until: dt.datetime, bucket: dt.timedelta, buckets: int
    ) -> list[FinishedCount]:
        """How many tasks succeeded and failed in each of ``buckets`` buckets of length
        ``bucket`` ending at ``until``, oldest first (counted on an index, no document read)."""
        return await self._store.browse.finished_counts(until=until, bucket=bucket, buckets=buckets)
