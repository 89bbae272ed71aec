"""Dependencies between tasks: publishing dependents, telling them outcomes, late edges.

No polling: when a task with dependents ends, the writer that ended it tells them (one update
per finished dependency). Three interleavings are closed explicitly:
- a dependency ends while its dependent is being published: the publisher re-reads the
  dependencies *after* counting itself in, so either it sees the outcome or the finisher sees
  the dependent (the updates are idempotent, so both doing it is harmless);
- the finisher crashes before telling: the task stays ``dependents_notified: false`` and the
  next consumer fetch (`recover`) tells them;
- a failure cascades: dependents cancelled by it are told to their own dependents in turn.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pymongo import ReturnDocument

from ..encoding import check_document_size
from ..errors import DependencyError, TaskRunning
from ..models import Task, TaskState
from ..queries import flows as fq
from ..queries import tasks as q
from ..specs import check_dependencies

if TYPE_CHECKING:
    from .base import StoreBase

log = logging.getLogger(__name__)


class Flows:
    def __init__(self, store: StoreBase) -> None:
        self._store = store

    async def resolve(
        self, key: str, depends_on: Sequence[str], allow_missing: bool
    ) -> tuple[list[str], list[str], list[str]]:
        """(depends_on, still pending, failed) for a task about to be published. A missing
        dependency is an error, or with ``allow_missing`` is left out (counted as met)."""
        found = {task.key: task for task in await self._store.get_many(depends_on)}
        missing = [dependency for dependency in depends_on if dependency not in found]
        if missing and not allow_missing:
            raise DependencyError(
                f"depends_on: no task has the key(s) {missing} (allow_missing=True to ignore)"
            )
        present = [dependency for dependency in depends_on if dependency in found]
        pending = [d for d in present if found[d].state is not TaskState.SUCCESS]
        failed = [d for d in pending if found[d].state in (TaskState.FAIL, TaskState.CANCELLED)]
        return present, [d for d in pending if d not in failed], failed

    async def attach(self, task: Task) -> None:
        """After inserting ``task``: count it in on its dependencies, then catch up with any
        that ended meanwhile (they may not have seen it)."""
        if not task.depends_on:
            return
        collection = self._store.collection
        await collection.update_many(*fq.count_dependent(task.depends_on))
        for dependency in await self._store.get_many(task.deps_pending):
            if dependency.state.is_terminal:
                await self._tell(dependency, only=task.key)

    async def catch_up(self, dependency: Task, dependents: Sequence[str]) -> None:
        """Tell newly counted-in ``dependents`` of a ``dependency`` that ended before it could
        see them (a batch's `Flows.attach`)."""
        for key in dependents:
            await self._tell(dependency, only=key)

    async def notify(self, finished: Task) -> None:
        """Tell the dependents of a finished task, and theirs if it cancelled them."""
        queue = [finished]
        while queue:
            task = queue.pop(0)
            queue.extend(await self._tell(task))
            await self._store.collection.update_one(
                *fq.mark_notified(task.key, self._store.clock.now())
            )
        await self._store.work_written()  # a dependent may start now

    async def _tell(self, dependency: Task, only: str | None = None) -> list[Task]:
        """Apply ``dependency``'s outcome to its waiting dependents; return those it ended."""
        now = self._store.clock.now()
        query = fq.dependents_waiting_on(dependency.key)
        if only is not None:
            query["key"] = only
        if dependency.state is TaskState.SUCCESS:
            update = fq.dependency_succeeded(dependency.key, now)
        else:
            update = fq.dependency_failed(dependency.key, f"ended as {dependency.state.value}", now)
        await self._store.collection.update_many(query, update)
        if dependency.state is TaskState.SUCCESS:
            return []
        ended = await self._ended_dependents_of(dependency.key)
        if only is not None:
            for task in ended:
                if task.key == only:
                    await self.notify(task)
            return []
        return ended

    async def _ended_dependents_of(self, key: str) -> list[Task]:
        cursor = self._store.collection.find(fq.unnotified_dependents_of(key))
        return [Task.model_validate(document) async for document in cursor]

    async def forget(self, keys: Sequence[str]) -> None:
        """Tasks deleted (by a commit) while others wait for them: the waiting ones are told
        the dependency is gone, as if it had failed: cancelled with a reason naming it, or run
        with ``on_dependency_failure="run"``. Never left blocked on a key that no longer
        exists: nothing would ever tell them. Dependents deleted in the same commit are
        simply gone."""
        for key in keys:
            now = self._store.clock.now()
            await self._store.collection.update_many(
                fq.dependents_waiting_on(key), fq.dependency_failed(key, "was deleted", now)
            )
            for task in await self._ended_dependents_of(key):
                await self.notify(task)

    async def recover(self) -> int:
        """Tell the dependents that a crashed writer did not; returns how many tasks."""
        cursor = self._store.collection.find(fq.unnotified())
        stranded = [Task.model_validate(document) async for document in cursor]
        for task in stranded:
            log.info(
                "telling dependents of a finished task",
                extra={"action": "dependents_recovered", "key": task.key},
            )
            await self.notify(task)
        return len(stranded)

    async def add_dependencies(self, edges: Sequence[tuple[str, str]]) -> list[Task]:
        """Make each ``after`` wait for its ``before``. Checked first, written after: an
        ``after`` that started or finished, a missing task or a cycle writes nothing."""
        edges = [(before, after) for before, after in edges]
        for before, after in edges:
            check_dependencies(after, [before])
        keys = list(dict.fromkeys(k for edge in edges for k in edge))
        tasks = {task.key: task for task in await self._store.get_many(keys)}
        missing = [k for k in keys if k not in tasks]
        if missing:
            raise DependencyError(f"add_dependencies: no task has the key(s) {missing}")
        for _, after in edges:
            state = tasks[after].state
            if state is TaskState.RUNNING:
                raise TaskRunning(f"add_dependencies: {after!r} is already running")
            if state.is_terminal:
                raise DependencyError(f"add_dependencies: {after!r} has already {state.value}")
        await self.refuse_cycles(edges, "add_dependencies")
        for after in dict.fromkeys(after for _, after in edges):
            # The task grows by its new edges: within its own budget, as at publish.
            base = await self._store.collection.find_one(q.by_key(after), q.GROWING_FIELDS_EXCLUDED)
            if base is not None:
                added = [before for before, edge_after in edges if edge_after == after]
                base["depends_on"] = [*base.get("depends_on", []), *added]
                base["deps_pending"] = [*base.get("deps_pending", []), *added]
                check_document_size(base, tasks[after].options, field="depends_on")

        updated: list[Task] = []
        for before, after in edges:
            now = self._store.clock.now()
            await self._store.collection.update_many(*fq.count_dependent([before]))
            still_pending = tasks[before].state is not TaskState.SUCCESS
            found = await self._store.collection.find_one_and_update(
                fq.add_dependency_filter(after),
                fq.add_dependency(before, still_pending, now),
                return_document=ReturnDocument.AFTER,
            )
            if found is None:
                raise TaskRunning(f"add_dependencies: {after!r} started meanwhile")
            current = await self._store.get(before)
            if current is not None and current.state.is_terminal:
                await self._tell(current, only=after)
            updated.append(Task.model_validate(found))
        return updated

    async def refuse_cycles(self, edges: Sequence[tuple[str, str]], operation: str) -> None:
        """An edge before→after closes a cycle when ``before`` already (transitively, with
        the other new edges) depends on ``after``. Every entry point that gives an existing
        key dependencies asks this first: `add_dependencies`, `replace` and a commit that
        replaces a key (a replace that skipped it could make two tasks wait for each other
        for ever)."""
        added: dict[str, set[str]] = {}
        known: dict[str, list[str]] = {}
        for before, after in edges:
            frontier, seen = [before], {before}
            while frontier:
                unknown = [k for k in frontier if k not in known]
                if unknown:
                    for task in await self._store.get_many(unknown):
                        known[task.key] = task.depends_on
                    for k in unknown:
                        known.setdefault(k, [])
                following: list[str] = []
                for k in frontier:
                    for dependency in [*known[k], *added.get(k, ())]:
                        if dependency == after:
                            raise DependencyError(
                                f"{operation}: {before!r} → {after!r} closes a cycle "
                                f"({before!r} already depends on {after!r})"
                            )
                        if dependency not in seen:
                            seen.add(dependency)
                            following.append(dependency)
                frontier = following
            added.setdefault(after, set()).add(before)
