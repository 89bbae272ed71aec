"""The small pymongo objects the memory collection hands out besides documents: the cursor
of an aggregation, and a database that has no commands."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pymongo.errors import OperationFailure


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
    """Database commands, as a server that has none of them answers; its collections."""

    def __init__(self, get_collection: Any) -> None:
        self.get_collection = get_collection

    async def command(self, command: Mapping[str, Any], **_: Any) -> Any:
        name = next(iter(command))
        raise OperationFailure(f"no such command: '{name}'", 59)  # CommandNotFound
