"""Helpers for testing code that uses mscheduler, and for measuring it.

`CountingCollection` counts the database round trips made through a collection: the number
of calls per task holds on any machine, unlike timings."""

from __future__ import annotations

import collections
import inspect
import time
from collections.abc import Callable, Coroutine
from typing import Any

_ASYNC_METHODS = (
    "aggregate",
    "bulk_write",
    "count_documents",
    "create_indexes",
    "delete_many",
    "find_one",
    "find_one_and_replace",
    "find_one_and_update",
    "update_many",
    "update_one",
    "watch",
)


def _counted(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def method(self: CountingCollection, *args: Any, **kwargs: Any) -> Any:
        self.counts[name] += 1
        started = time.process_time()
        try:
            result = getattr(self.wrapped, name)(*args, **kwargs)
            # pymongo's async aggregate/watch are coroutines; Motor's return the cursor itself.
            return await result if inspect.isawaitable(result) else result
        finally:
            # CPU seconds inside the call: exact on the memory backend (its calls never
            # yield); on a server, other tasks' CPU during the wait would count too.
            self.cpu_seconds += time.process_time() - started

    method.__name__ = name
    return method


class CountingCollection:
    """Wraps a collection and counts every call to it, by method name.

    ``bulk_write`` counts once however many requests it carries; a change stream counts once
    when opened. Use `calls` for the total, `counts` for the breakdown, `reset` between phases.
    """

    def __init__(self, collection: Any) -> None:
        self.wrapped = collection
        self.counts: collections.Counter[str] = collections.Counter()
        self.cpu_seconds = 0.0

    @property
    def calls(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
        self.cpu_seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        """Synchronous, as on the driver: it returns a cursor, whose iteration (where the query
        runs) is counted in `cpu_seconds` too."""
        self.counts["find"] += 1
        return _CountedCursor(self, self.wrapped.find(*args, **kwargs))


class _CountedCursor:
    """A cursor whose batches' CPU counts as time in the database."""

    def __init__(self, counting: CountingCollection, cursor: Any) -> None:
        self._counting = counting
        self._cursor = cursor

    def __aiter__(self) -> _CountedCursor:
        return self

    async def __anext__(self) -> Any:
        started = time.process_time()
        try:
            return await self._cursor.__anext__()
        finally:
            self._counting.cpu_seconds += time.process_time() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


for _name in _ASYNC_METHODS:
    setattr(CountingCollection, _name, _counted(_name))
