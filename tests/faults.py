"""Collections that misbehave on purpose: network errors before or after the operation, and
writes held up until the test lets them through (a slow network)."""

from __future__ import annotations

import inspect
import random
from typing import Any

import anyio
from pymongo.errors import AutoReconnect, NetworkTimeout, NotPrimaryError

from mscheduler.backends.counting import CountingCollection

ERRORS = (
    lambda: AutoReconnect("connection reset by peer"),
    lambda: NetworkTimeout("timed out"),
    lambda: NotPrimaryError("not primary", {"code": 10107}),
)
FAULTY = ("find_one_and_update", "find_one", "bulk_write", "update_many", "update_one")


class BrokenCursor:
    """A cursor whose first read fails on the network (awaited too: pymongo's ``aggregate``
    is awaited before its cursor is read)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __aiter__(self) -> BrokenCursor:
        return self

    async def __anext__(self) -> Any:
        raise self.error

    def __await__(self) -> Any:
        raise self.error
        yield  # a generator, as __await__ must be


class FaultyCollection:
    """Raises a random network error on ``rate`` of the calls to ``FAULTY`` methods: half of
    them before the call reaches the database, half after it was applied (the reply lost).
    With ``cursor_faults``, on ``rate`` of the cursors of ``find`` too (at their first read)."""

    def __init__(
        self, collection: Any, rate: float, seed: int = 0, *, cursor_faults: bool = False
    ) -> None:
        self.wrapped = collection
        self.rate = rate
        self.random = random.Random(seed)
        self.cursor_faults = cursor_faults
        self.injected = {"before": 0, "after": 0, "cursor": 0}
        for name in FAULTY:
            setattr(self, name, self._faulty(name))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        if self.cursor_faults and self.random.random() < self.rate:
            self.injected["cursor"] += 1
            return BrokenCursor(self.random.choice(ERRORS)())
        return self.wrapped.find(*args, **kwargs)

    def _faulty(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            fault = self.random.random() < self.rate
            after = self.random.random() < 0.5
            if fault and not after:
                self.injected["before"] += 1
                raise self.random.choice(ERRORS)()
            result = await getattr(self.wrapped, name)(*args, **kwargs)
            if fault:
                self.injected["after"] += 1
                raise self.random.choice(ERRORS)()
            return result

        return call


class HeldWrites:
    """Every fenced write (``find_one_and_update``, ``bulk_write``) made while ``holding``
    waits until the test sets its gate in ``held``, in the order they came: a slow network,
    made step by step. With ``replies``, the next write alone is held, and only its reply:
    applied at once, the database and every reader see it before the writer learns that it
    landed."""

    def __init__(self, collection: Any, *, replies: bool = False) -> None:
        self.wrapped = collection
        self.held: list[anyio.Event] = []
        self.holding = True
        self.replies = replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def _through(self, name: str, *args: Any, **kwargs: Any) -> Any:
        gate = anyio.Event() if self.holding else None
        if gate is not None:
            self.held.append(gate)
            self.holding = not self.replies
            if not self.replies:
                await gate.wait()
        result = getattr(self.wrapped, name)(*args, **kwargs)
        result = await result if inspect.isawaitable(result) else result
        if gate is not None and self.replies:
            await gate.wait()
        return result

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("find_one_and_update", *args, **kwargs)

    async def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("bulk_write", *args, **kwargs)


class LosesClaimAndLookUp(CountingCollection):
    """The first claim lands and its reply is lost, and so is the look-up by its run_id: the
    consumer holds a lease it cannot see (``lost`` counts the two losses)."""

    def __init__(self, collection: Any) -> None:
        super().__init__(collection)
        self.lost = 0

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        found = await self.wrapped.find_one_and_update(*args, **kwargs)
        if self.lost == 0:
            self.lost += 1
            raise AutoReconnect("connection reset after the claim was applied")
        return found

    async def find_one(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "worker_states.run_id" in query and self.lost == 1:
            self.lost += 1
            raise AutoReconnect("connection reset during the look-up")
        return await self.wrapped.find_one(query, *args, **kwargs)


class LosesWrites:
    """A collection whose next ``count`` calls to ``update_one`` fail on the network before
    they reach the database."""

    def __init__(self, collection: Any, count: int = 1) -> None:
        self.wrapped = collection
        self.count = count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def update_one(self, *args: Any, **kwargs: Any) -> Any:
        if self.count:
            self.count -= 1
            raise AutoReconnect("connection reset before the write")
        return await self.wrapped.update_one(*args, **kwargs)


class _Database:
    """A database whose collections named in ``replaced`` are the ones given there."""

    def __init__(self, database: Any, replaced: dict[str, Any]) -> None:
        self.wrapped = database
        self.replaced = replaced

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name in self.replaced:
            return self.replaced[name]
        return self.wrapped.get_collection(name, *args, **kwargs)


class LosesBesideWrites:
    """A tasks collection whose collection beside it named with ``suffix`` (``.controls``: the
    version a control write bumps) loses its next ``count`` updates on the network: a control
    change written, its signal lost."""

    def __init__(self, collection: Any, suffix: str, count: int = 1) -> None:
        self.wrapped = collection
        self.beside = LosesWrites(
            collection.database.get_collection(collection.name + suffix), count
        )
        self.database = _Database(collection.database, {collection.name + suffix: self.beside})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        return await self.wrapped.find_one_and_update(*args, **kwargs)
