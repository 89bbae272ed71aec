"""The small pymongo objects the memory collection hands out besides documents: the cursor
of an aggregation, and a database that has no commands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pymongo.errors import OperationFailure

if TYPE_CHECKING:
    from .changefeed import ChangeFeed, MemoryChangeStream


@dataclass
class AggregateCursor:
    """What ``await collection.aggregate(...)`` returns: async iteration and ``to_list``."""

    documents: list[dict[str, Any]]

    def __aiter__(self) -> AggregateCursor:
        self._iterator = iter(self.documents)
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return next(self._iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def to_list(self, length: int | None = None) -> list[dict[str, Any]]:
        return self.documents if length is None else self.documents[:length]

    async def close(self) -> None:
        return None


class MemoryDatabase:
    """Database commands, as a server that has none of them answers; its collections; a
    change stream on all of them (``db.watch()``)."""

    def __init__(self, get_collection: Any, feed: ChangeFeed, *, change_streams: bool) -> None:
        self.get_collection = get_collection
        self._feed = feed
        self._change_streams = change_streams

    async def watch(
        self,
        pipeline: Sequence[Mapping[str, Any]] | None = None,
        full_document: str | None = None,
        resume_after: Mapping[str, Any] | None = None,
        *,
        start_after: Mapping[str, Any] | None = None,
        max_await_time_ms: int | None = None,
        collection: str | None = None,
        **_: Any,
    ) -> MemoryChangeStream:
        """A stream on the database, or (``collection``: what a collection's own ``watch``
        asks) on one of its collections."""
        if not self._change_streams:  # as a standalone mongod answers
            raise OperationFailure(
                "The $changeStream stage is only supported on replica sets", code=40573
            )
        return self._feed.open(
            pipeline,
            full_document,
            resume_after,
            start_after=start_after,
            max_await_time_ms=max_await_time_ms,
            collection=collection,
        )

    async def command(self, command: Mapping[str, Any], **_: Any) -> Any:
        name = next(iter(command))
        raise OperationFailure(f"no such command: '{name}'", 59)  # CommandNotFound
