"""`TasksCollection`: the collection the store talks to, as the methods it calls (public:
what `Scheduler` takes, for a type annotation or a wrapper of your own).

The store is written against this declaration, not against a driver: pymongo's
``AsyncCollection``, Motor's ``AsyncIOMotorCollection``, the memory backend's
``MemoryCollection`` and the synchronous client's adapter (`backends.sync`) all satisfy it,
which ``tests/static/collection_protocol.py`` proves under mypy. A method we start calling is
declared here first, so an engine that lacks it fails the type check, not a user's worker.
On pymongo and Motor the check proves the signatures of the methods they have: their
``collection.anything`` is a sub-collection, so a name they lack passes; the memory backend
and the synchronous adapter are checked whole.

Only the arguments the store passes are declared (a filter, an update, a projection, and the
keywords named); every engine accepts more. Where the drivers differ in shape, the
declaration is the union the store handles: pymongo's ``aggregate`` and ``watch`` are
coroutines, Motor's return the cursor or stream itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

from pymongo import IndexModel
from pymongo.results import BulkWriteResult, DeleteResult, InsertOneResult, UpdateResult

__all__ = ["TasksCollection", "TasksDatabase"]

Filter = Mapping[str, Any]
# An update document, or an aggregation pipeline of stages.
Update = Mapping[str, Any] | Sequence[Mapping[str, Any]]
# A stored document, as every engine returns it.
Document = dict[str, Any]
Cursor = AsyncIterable[Document]


class _Watched(Protocol):
    """A change stream on it (a database's covers every collection in it)."""

    def watch(
        self,
        pipeline: Sequence[Mapping[str, Any]],
        /,
        *,
        full_document: str | None = None,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        max_await_time_ms: int | None = None,
    ) -> Any: ...


class TasksDatabase(_Watched, Protocol):
    """The database a `TasksCollection` lives in: the collections beside the tasks, a
    command (``hello``, ``collMod``), and a change stream on every collection at once."""

    def get_collection(self, name: str, /) -> TasksCollection: ...

    def command(self, command: dict[str, Any], /) -> Awaitable[Any]: ...


class TasksCollection(_Watched, Protocol):
    """The tasks collection, or one beside it (schedules, paused names, limits, live workers,
    remote stops, controls): every call the store makes on either."""

    @property
    def name(self) -> str: ...

    @property
    def database(self) -> TasksDatabase: ...

    # -- reads

    def find(
        self,
        filter: Filter,
        projection: Mapping[str, Any] | None = None,
        /,
        *,
        sort: Any = None,
        limit: int = 0,
        batch_size: int = 0,
    ) -> Cursor: ...

    async def find_one(
        self, filter: Filter, projection: Mapping[str, Any] | None = None, /, *, sort: Any = None
    ) -> Document | None: ...

    async def count_documents(self, filter: Filter, /) -> int: ...

    def aggregate(self, pipeline: Sequence[Mapping[str, Any]], /) -> Awaitable[Cursor] | Cursor: ...

    # -- writes

    async def insert_one(self, document: dict[str, Any], /) -> InsertOneResult: ...

    async def update_one(
        self, filter: Filter, update: Update, /, upsert: bool = False
    ) -> UpdateResult: ...

    async def update_many(
        self, filter: Filter, update: Update, /, upsert: bool = False
    ) -> UpdateResult: ...

    async def find_one_and_update(
        self,
        filter: Filter,
        update: Update,
        projection: Mapping[str, Any] | None = None,
        /,
        *,
        sort: Any = None,
        upsert: bool = False,
        return_document: bool = False,
    ) -> Document | None: ...

    async def find_one_and_replace(
        self,
        filter: Filter,
        replacement: Mapping[str, Any],
        /,
        *,
        return_document: bool = False,
    ) -> Document | None: ...

    async def delete_one(self, filter: Filter, /) -> DeleteResult: ...

    async def delete_many(self, filter: Filter, /) -> DeleteResult: ...

    async def bulk_write(
        self, requests: Sequence[Any], /, ordered: bool = True
    ) -> BulkWriteResult: ...

    # -- indexes

    async def create_indexes(self, indexes: Sequence[IndexModel], /) -> list[str]: ...

    async def index_information(self) -> MutableMapping[str, Any]: ...

    async def drop_index(self, name: str, /) -> None: ...
