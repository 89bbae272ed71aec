"""`CountingCollection`, what the benchmarks and the round-trip tests measure with: it counts
the database round trips made through a collection (the number of calls per task holds on
any machine, unlike timings) and the CPU spent inside them."""

from __future__ import annotations

import collections
import inspect
import time
from collections.abc import Callable, Coroutine, Generator
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


class _Timed:
    """Awaits ``awaitable``, adding to ``counting.cpu_seconds`` the CPU of each of its steps
    (from one resume to its next suspension) and nothing of what runs while it is suspended:
    other coroutines' CPU is theirs, whichever call they wait in."""

    def __init__(self, counting: CountingCollection, awaitable: Any) -> None:
        self._counting = counting
        self._awaitable = awaitable

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self._awaitable.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = time.process_time()
            try:
                suspended = steps.throw(thrown) if thrown is not None else steps.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                self._counting.cpu_seconds += time.process_time() - started
            try:
                sent = yield suspended
                thrown = None
            except BaseException as exc:  # a cancellation delivered while it waits: passed in
                sent = None
                thrown = exc


async def _call(
    counting: CountingCollection, target: Any, name: str, *args: Any, **kwargs: Any
) -> Any:
    """``target.name(...)``, counted and timed in ``counting`` (the collection, or its
    database's change stream)."""
    counting.counts[name] += 1
    started = time.process_time()
    try:
        result = getattr(target, name)(*args, **kwargs)
    finally:
        counting.cpu_seconds += time.process_time() - started
    # pymongo's async aggregate/watch are coroutines; Motor's return the cursor itself.
    if inspect.isawaitable(result):
        result = await _Timed(counting, result)
    return _CountedStream(counting, result) if name == "watch" else result


def _counted(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def method(self: CountingCollection, *args: Any, **kwargs: Any) -> Any:
        return await _call(self, self.wrapped, name, *args, **kwargs)

    method.__name__ = name
    return method


class CountingCollection:
    """Wraps a collection and counts every call to it, by method name.

    ``bulk_write`` counts once however many requests it carries; a change stream counts once
    when opened. `cpu_seconds` is the CPU spent inside the calls, their cursors' and change
    streams' reads included: only their own steps, not what other coroutines run while they
    wait (on a server, that is the driver's own work; on the memory backend, the database's).
    Use `calls` for the total, `counts` for the breakdown, `reset` between phases.
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

    @property
    def database(self) -> _CountedDatabase:
        """The collection's database, whose change streams count here: the process's one
        stream is opened on the database (``db.watch()``), for the tasks and the controls."""
        return _CountedDatabase(self, self.wrapped.database)

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
        return await _Timed(self._counting, self._cursor.__anext__())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _CountedDatabase:
    def __init__(self, counting: CountingCollection, database: Any) -> None:
        self._counting = counting
        self._database = database

    async def watch(self, *args: Any, **kwargs: Any) -> Any:
        return await _call(self._counting, self._database, "watch", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._database, name)


class _CountedStream:
    """A change stream whose reads' CPU counts as time in the database: matching, shaping
    and copying the events is the server's work (on the memory backend, in this process)."""

    def __init__(self, counting: CountingCollection, stream: Any) -> None:
        self._counting = counting
        self._stream = stream

    def __aiter__(self) -> _CountedStream:
        return self

    async def __anext__(self) -> Any:
        return await _Timed(self._counting, self._stream.__anext__())

    async def next(self) -> Any:
        return await _Timed(self._counting, self._stream.next())

    async def try_next(self) -> Any:
        return await _Timed(self._counting, self._stream.try_next())

    async def __aenter__(self) -> _CountedStream:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stream.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


for _name in _ASYNC_METHODS:
    setattr(CountingCollection, _name, _counted(_name))
