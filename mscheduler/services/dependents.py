"""`OwedDependents`: the finished tasks whose dependents this process failed to tell, and who
is woken to tell them.

A write that ended a task tells its dependents in its next round trip (`store.tasks`); when
that fails on the network the write itself has landed, so the store says so here
(`store.tasks.DependentsOwed`) instead of raising. The consumers' recovery loops listen, and
tell them (`recover`) with backoff, without waiting for a restart: none stays owed.
"""

from __future__ import annotations

from collections.abc import Callable

from ..store.tasks import TaskStore


class OwedDependents:
    """One per store (so per `Scheduler`). ``keys``: the finished tasks (keys, or ids where no
    key was read) whose dependents this process failed to tell, until a `recover` that began
    after they were owed returns."""

    def __init__(self, tasks: TaskStore) -> None:
        self._tasks = tasks
        self.keys: set[str] = set()
        self._listeners: list[Callable[[], None]] = []

    def owe(self, *tasks: str) -> None:
        """`recover` catches up every unnotified task; this only wakes who calls it."""
        self.keys.update(tasks)
        for listener in self._listeners:
            listener()

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        """``wake`` is called on each `owe` (at once when some are owed already); returns
        what stops that."""
        self._listeners.append(wake)
        if self.keys:
            wake()
        return lambda: self._listeners.remove(wake)

    async def recover(self) -> int:
        """Tell the dependents of every finished task whose writer did not (owed here, or
        left by a crashed writer anywhere): how many tasks were caught up. What was owed
        before the call is told by it; what is owed meanwhile stays owed."""
        owed = set(self.keys)
        told = await self._tasks.recover_dependents()
        self.keys -= owed
        return told
