"""All-or-nothing groups of writes: a MongoDB transaction, or the memory backend's equivalent.

The store's logic runs unchanged inside a transaction: it is handed a view of the collection
that passes the session to every call. The memory backend has no sessions; there the caller
validates everything first, and the writes run without yielding to the event loop, so no
other coroutine sees a half-done batch.
"""

from __future__ import annotations

import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import anyio
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import OperationFailure
from pymongo.synchronous.collection import Collection

from ..collection import TasksCollection

log = logging.getLogger(__name__)

T = TypeVar("T")

_NO_TRANSACTIONS = {20}  # IllegalOperation: "only allowed on a replica set member or mongos"
_WRITE_CONFLICT = 112
_CONFLICT_RETRIES = 50
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
    """A collection whose every call runs in ``session`` (so it never starts another)."""

    def __init__(self, collection: TasksCollection, session: Any) -> None:
        self._collection = collection
        self._session = session

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name not in _SESSION_METHODS:
            return attribute

        def bound(*args: Any, **kwargs: Any) -> Any:
            return attribute(*args, session=self._session, **kwargs)

        return bound


def supports_transactions(collection: object) -> bool:
    """Decided from the collection's type, never by reading an attribute of it: on a pymongo
    collection ``collection.anything`` is a sub-collection, not a flag. A driver collection
    may run transactions (a standalone server then refuses, see `run_atomically`); the memory
    backend and a session-bound view may not. A wrapper that keeps the collection it wraps in
    ``wrapped`` (the testing helpers) answers for that collection."""
    if isinstance(collection, (AsyncCollection, Collection)):  # Collection: `SyncScheduler`
        return True
    if type(collection).__module__.split(".")[0] == "motor":
        return True
    wrapped = vars(collection).get("wrapped") if hasattr(collection, "__dict__") else None
    return wrapped is not None and supports_transactions(wrapped)


def _unlabelled_write_conflict(exc: OperationFailure) -> bool:
    """A transaction that lost a write conflict and that ``with_transaction`` did not retry.
    MongoDB labels WriteConflict (112) TransientTransactionError, and ``with_transaction``
    already retries those (for up to two minutes): retrying them here too would repeat that.
    An engine that omits the label (mongoeco says only "Write conflict during transaction
    commit") is retried here, the same way."""
    if exc.has_error_label("TransientTransactionError"):
        return False
    return exc.code == _WRITE_CONFLICT or "write conflict" in str(exc).lower()


async def run_atomically(
    collection: TasksCollection, work: Callable[[TasksCollection], Awaitable[T]]
) -> T:
    """``work(collection)`` in a transaction (run again from the start after a write
    conflict); on the memory backend, as is. A standalone server has no transactions: the
    work then runs without one, after a warning (callers validate first, so it fails before
    writing)."""
    if not supports_transactions(collection):
        return await work(collection)
    for attempt in range(_CONFLICT_RETRIES):
        try:
            return await _in_transaction(collection, work)
        except OperationFailure as exc:
            if exc.code in _NO_TRANSACTIONS:
                log.warning(
                    "the server has no transactions (not a replica set); writing without one: %s",
                    exc,
                    extra={"action": "no_transaction"},
                )
                return await work(collection)
            if not _unlabelled_write_conflict(exc) or attempt == _CONFLICT_RETRIES - 1:
                raise
            log.debug("transaction write conflict, running it again: %s", exc)
            await anyio.sleep(random.uniform(0, 0.005 * 2 ** min(attempt, 6)))
    raise AssertionError("unreachable")  # pragma: no cover


async def _in_transaction(
    collection: TasksCollection, work: Callable[[TasksCollection], Awaitable[T]]
) -> T:
    # Only a driver's database has a client (`supports_transactions` decided that): sessions
    # are not part of `TasksCollection`, which the memory backend also satisfies.
    session = cast(Any, collection.database).client.start_session()
    if inspect.isawaitable(session):
        session = await session
    async with session:

        async def callback(active_session: Any) -> T:
            return await work(SessionCollection(collection, active_session))

        result: T = await session.with_transaction(callback)
        return result
