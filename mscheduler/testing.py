"""Helpers for testing code that uses mscheduler, and for measuring it.

`CountingCollection` counts the database round trips made through a collection: the number
of calls per task holds on any machine, unlike timings."""

from __future__ import annotations

import collections
from typing import Any


class CountingCollection:
    """Wraps a collection and counts every call to it, by method name.

    ``bulk_write`` counts once however many requests it carries; a change stream counts once
    when opened. Use `calls` for the total, `counts` for the breakdown, `reset` between phases.
    """

    def __init__(self, collection: Any) -> None:
        self.wrapped = collection
        self.counts: collections.Counter[str] = collections.Counter()

    @property
    def calls(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["find_one_and_update"] += 1
        return await self.wrapped.find_one_and_update(*args, **kwargs)

    async def find_one_and_replace(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["find_one_and_replace"] += 1
        return await self.wrapped.find_one_and_replace(*args, **kwargs)

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["find_one"] += 1
        return await self.wrapped.find_one(*args, **kwargs)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["find"] += 1
        return self.wrapped.find(*args, **kwargs)

    async def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["bulk_write"] += 1
        return await self.wrapped.bulk_write(*args, **kwargs)

    async def update_one(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["update_one"] += 1
        return await self.wrapped.update_one(*args, **kwargs)

    async def update_many(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["update_many"] += 1
        return await self.wrapped.update_many(*args, **kwargs)

    async def delete_many(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["delete_many"] += 1
        return await self.wrapped.delete_many(*args, **kwargs)

    async def count_documents(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["count_documents"] += 1
        return await self.wrapped.count_documents(*args, **kwargs)

    async def aggregate(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["aggregate"] += 1
        cursor = self.wrapped.aggregate(*args, **kwargs)
        return await cursor if hasattr(cursor, "__await__") else cursor

    async def create_indexes(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["create_indexes"] += 1
        return await self.wrapped.create_indexes(*args, **kwargs)

    async def watch(self, *args: Any, **kwargs: Any) -> Any:
        self.counts["watch"] += 1
        stream = self.wrapped.watch(*args, **kwargs)
        return await stream if hasattr(stream, "__await__") else stream
