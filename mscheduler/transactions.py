"""All-or-nothing groups of writes: a MongoDB transaction, or the memory backend's equivalent.

The store's logic runs unchanged inside a transaction: it is handed a view of the collection
that passes the session to every call. The memory backend has no sessions; there the caller
validates everything first, and the writes run without yielding to the event loop, so no
other coroutine sees a half-done batch.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pymongo.errors import OperationFailure

log = logging.getLogger(__name__)

T = TypeVar("T")

_NO_TRANSACTIONS = {20}  # IllegalOperation: "only allowed on a replica set member or mongos"
_SESSION_METHODS = frozenset(
    {
        "bulk_write",
        "count_documents",
        "delete_many",
        "delete_one",
        "find",
        "find_one",
        "find_one_and_replace",
        "find_one_and_update",
        "insert_one",
        "update_many",
        "update_one",
    }
)


class SessionCollection:
    """A collection whose every call runs in ``session``."""

    supports_transactions = False  # already inside one

    def __init__(self, collection: Any, session: Any) -> None:
        self._collection = collection
        self._session = session

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name not in _SESSION_METHODS:
            return attribute

        def bound(*args: Any, **kwargs: Any) -> Any:
            return attribute(*args, session=self._session, **kwargs)

        return bound


def supports_transactions(collection: Any) -> bool:
    flag = getattr(collection, "supports_transactions", None)
    if flag is not None:
        return bool(flag)
    return hasattr(collection, "database")


async def run_atomically(collection: Any, work: Callable[[Any], Awaitable[T]]) -> T:
    """``work(collection)`` in a transaction (retried by the driver on transient errors);
    on the memory backend, as is. A standalone server has no transactions: the work then runs
    without one, after a warning (callers validate first, so it fails before writing)."""
    if not supports_transactions(collection):
        return await work(collection)
    client = collection.database.client
    session = client.start_session()
    if inspect.isawaitable(session):
        session = await session
    try:
        async with session:

            async def callback(active_session: Any) -> T:
                return await work(SessionCollection(collection, active_session))

            result: T = await session.with_transaction(callback)
            return result
    except OperationFailure as exc:
        if exc.code not in _NO_TRANSACTIONS:
            raise
        log.warning(
            "the server has no transactions (not a replica set); writing without one: %s",
            exc,
            extra={"action": "no_transaction"},
        )
        return await work(collection)
