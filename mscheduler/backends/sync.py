"""pymongo's synchronous ``MongoClient`` behind the async interface the store speaks.

`SyncScheduler` runs the store's own code (the same documents, queries and checks as
`Scheduler`) in a private event loop per call, on the caller's thread. Nothing else runs in
that loop, so a blocking driver call blocks no one: each method below calls the synchronous
driver directly, with no thread hop. Sessions and transactions are the synchronous
driver's own (`with_transaction` keeps its retry rules); the transaction body, which only
awaits these methods and so never suspends, is stepped to its end inside the driver's
callback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pymongo import IndexModel, MongoClient
from pymongo.change_stream import ChangeStream
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from .. import layout
from ..errors import ConfigurationError
from .uri import check_name, new_client, ping_failure, redact

log = logging.getLogger(__name__)

T = TypeVar("T")


def step_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (it awaits only the methods below) to its end.
    One that does suspend is a bug here: refused rather than left half-run."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a transaction body awaited something other than the database")


class AsyncCursor:
    """A synchronous cursor iterated with ``async for``."""

    def __init__(self, cursor: Iterator[dict[str, Any]]) -> None:
        self._cursor = cursor

    def __aiter__(self) -> AsyncCursor:
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return next(self._cursor)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        close = getattr(self._cursor, "close", None)
        if close is not None:
            close()


class AsyncChangeStream:
    """A synchronous change stream read with ``await``: each read returns after at most the
    stream's ``max_await_time_ms``, blocking only this private loop."""

    def __init__(self, stream: ChangeStream[dict[str, Any]]) -> None:
        self._stream = stream

    @property
    def resume_token(self) -> Any:
        return self._stream.resume_token

    @property
    def alive(self) -> bool:
        return self._stream.alive

    async def try_next(self) -> dict[str, Any] | None:
        return self._stream.try_next()

    async def next(self) -> dict[str, Any]:
        return self._stream.next()

    def __aiter__(self) -> AsyncChangeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return self._stream.next()
        except StopIteration:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> AsyncChangeStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stream.close()

    async def close(self) -> None:
        self._stream.close()


class AsyncSession:
    """A synchronous session, entered with ``async with``."""

    def __init__(self, session: ClientSession) -> None:
        self._session = session

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._session.end_session()

    async def with_transaction(self, callback: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        return self._session.with_transaction(lambda session: step_to_end(callback(session)))


class AsyncClient:
    def __init__(self, client: MongoClient[dict[str, Any]]) -> None:
        self._client = client

    def start_session(self) -> AsyncSession:
        return AsyncSession(self._client.start_session())


class AsyncDatabase:
    def __init__(self, collection: Collection[dict[str, Any]]) -> None:
        self._database = collection.database

    @property
    def client(self) -> AsyncClient:
        return AsyncClient(self._database.client)

    def get_collection(self, name: str) -> AwaitableCollection:
        return AwaitableCollection(self._database.get_collection(name))

    async def command(self, command: Mapping[str, Any], **kwargs: Any) -> Any:
        return self._database.command(dict(command), **kwargs)

    async def watch(
        self, pipeline: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> AsyncChangeStream:
        return AsyncChangeStream(self._database.watch(pipeline, **kwargs))


class AwaitableCollection:
    """A synchronous pymongo `Collection` with the coroutine methods of ``AsyncCollection``
    the store calls. ``wrapped`` tells `transactions.supports_transactions` what is inside."""

    def __init__(self, collection: Collection[dict[str, Any]]) -> None:
        self.wrapped = collection
        self.name: str = collection.name
        self.full_name: str = collection.full_name

    @property
    def database(self) -> AsyncDatabase:
        return AsyncDatabase(self.wrapped)

    def find(self, *args: Any, **kwargs: Any) -> AsyncCursor:
        return AsyncCursor(self.wrapped.find(*args, **kwargs))

    async def aggregate(self, pipeline: Sequence[Mapping[str, Any]], **kwargs: Any) -> AsyncCursor:
        return AsyncCursor(self.wrapped.aggregate(list(pipeline), **kwargs))

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.find_one(*args, **kwargs)

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.find_one_and_update(*args, **kwargs)

    async def find_one_and_replace(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.find_one_and_replace(*args, **kwargs)

    async def count_documents(self, *args: Any, **kwargs: Any) -> int:
        return self.wrapped.count_documents(*args, **kwargs)

    async def insert_one(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.insert_one(*args, **kwargs)

    async def update_one(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.update_one(*args, **kwargs)

    async def update_many(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.update_many(*args, **kwargs)

    async def delete_one(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.delete_one(*args, **kwargs)

    async def delete_many(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.delete_many(*args, **kwargs)

    async def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.bulk_write(*args, **kwargs)

    async def create_indexes(self, indexes: Sequence[IndexModel], **kwargs: Any) -> list[str]:
        return self.wrapped.create_indexes(list(indexes), **kwargs)

    async def index_information(self, **kwargs: Any) -> dict[str, Any]:
        return dict(self.wrapped.index_information(**kwargs))

    async def drop_index(self, name: str, **kwargs: Any) -> None:
        self.wrapped.drop_index(name, **kwargs)

    async def drop(self, **kwargs: Any) -> None:
        self.wrapped.drop(**kwargs)

    async def watch(
        self, pipeline: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> AsyncChangeStream:
        return AsyncChangeStream(self.wrapped.watch(pipeline, **kwargs))


def open_sync_collection(
    uri: str, *, database: str | None, collection: str, server_selection_timeout_ms: int
) -> tuple[AwaitableCollection, Callable[[], None]]:
    """Connect as `uri.open_collection` does (the same URI checks, a ping so an unreachable
    server fails here), with the synchronous client; returns the collection and its closer."""
    client: MongoClient[dict[str, Any]] = new_client(MongoClient, uri, server_selection_timeout_ms)
    try:
        client.admin.command("ping")
    except PyMongoError as exc:
        client.close()
        raise ping_failure(uri, exc) from exc
    if database is None:
        database = client.get_default_database(default=layout.DEFAULT_DATABASE).name
    try:
        check_name("database", database)
    except ConfigurationError:
        client.close()
        raise
    log.info(
        "connected to MongoDB (synchronous client)",
        extra={"action": "connected", "uri": redact(uri), "database": database},
    )
    return AwaitableCollection(client[database][collection]), client.close
