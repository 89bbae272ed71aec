"""The embedded ``memory://`` backend: mongomock-motor plus a change feed and an index check.

It runs the store's very filters and updates. What makes it behave like the server where
mongomock does not on its own:
- every write publishes a change event (`changefeed.ChangeFeed`), so the consumer's change
  stream listener runs for real;
- it runs on its own copy of mongomock's engine (`engine`), where what mongomock evaluates
  otherwise than MongoDB is made to agree (`agreement`) and its slow paths faster
  (`fast_paths`); mongomock itself is left as it is for anyone else in the process;
- with ``notablescan`` (as the server parameter of that name) a query that no declared index
  serves raises ``OperationFailure`` code 291, so the test suite proves index coverage;
- a document over 16 MiB or nested over 100 levels is refused, written by no one
  (`document_size`).

Operations run synchronously in the event loop: each is atomic, as a one-document write is.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mongomock_motor import AsyncMongoMockClient
from pymongo import IndexModel
from pymongo.errors import OperationFailure, WriteError
from pymongo.results import UpdateResult

from .bulk import bulk_write
from .changefeed import ChangeFeed, MemoryChangeStream
from .document_size import refuse_insert, refuse_update
from .index_plan import index_serves
from .indexed import adopt, walk
from .inserts import insert_new, inserted_by, stored_copy
from .ordered_index import IndexSet
from .replies import AggregateCursor, MemoryDatabase

# A declared index: its name, its keys, and its partialFilterExpression (None: whole).
Declared = tuple[str, list[tuple[str, int]], Mapping[str, Any] | None]

NO_QUERY_EXECUTION_PLANS = 291
_NONE = object()


# ---------------------------------------------------------------- the collection


class MemoryCollection:
    """The subset of pymongo's ``AsyncCollection`` the library uses, on mongomock."""

    def __init__(
        self,
        inner: Any,
        feed: ChangeFeed,
        indexes: list[Declared],
        ordered: IndexSet,
        *,
        notablescan: bool = False,
        change_streams: bool = True,
        sibling: Any = None,
    ) -> None:
        self._sibling = sibling  # name -> the collection of that name in this database
        self._inner = inner
        self.changes = feed
        self.notablescan = notablescan
        self.change_streams = change_streams
        self.name: str = inner.name
        self.full_name: str = inner.full_name
        self._indexes = indexes  # shared by every wrapper of this collection
        self._store = inner._store  # mongomock's documents by _id
        self._ordered = ordered  # likewise

    # -- indexes

    async def create_indexes(self, indexes: Sequence[IndexModel], **_: Any) -> list[str]:
        names = await self._inner.create_indexes(list(indexes))
        for model in indexes:
            spec = model.document
            keys = [(field, int(direction)) for field, direction in spec["key"].items()]
            if spec["name"] not in {name for name, _, _ in self._indexes}:
                self._indexes.append((spec["name"], keys, spec.get("partialFilterExpression")))
            self._ordered.declare(spec["name"], keys, self._inner._store.documents)
        return list(names)

    async def index_information(self) -> dict[str, Any]:
        return dict(await self._inner.index_information())

    async def drop_index(self, name: str, **_: Any) -> None:
        await self._inner.drop_index(name)
        self._ordered.drop(name)
        self._indexes[:] = [index for index in self._indexes if index[0] != name]

    @property
    def docs_examined(self) -> int:
        """Documents this collection's queries have tested against their filters so far (of
        every wrapper of it), as ``explain``'s ``totalDocsExamined`` counts them."""
        return self._ordered.examined

    @property
    def database(self) -> MemoryDatabase:
        return MemoryDatabase(self._sibling, self.changes, change_streams=self.change_streams)

    def _check_plan(self, query: Mapping[str, Any] | None, sort: Any = None) -> None:
        if not self.notablescan:
            return
        sort_keys = [(field, int(direction)) for field, direction in sort or ()]
        if any(
            index_serves(keys, query or {}, sort_keys, partial=partial)
            for _, keys, partial in self._indexes
        ):
            return
        raise OperationFailure(
            f"No query solutions: no index serves filter {dict(query or {})!r} with sort "
            f"{sort_keys!r} (notablescan)",
            code=NO_QUERY_EXECUTION_PLANS,
        )

    # -- reads

    def find(
        self,
        filter: Mapping[str, Any] | None = None,
        projection: Any = None,
        *,
        sort: Any = None,
        limit: int = 0,
        skip: int = 0,
        **_: Any,
    ) -> Any:
        self._check_plan(filter, sort)
        if sort and limit and not skip:
            found = self._walk(filter or {}, sort, limit)
            if found is not None:  # those, in the sort's order: mongomock sorts them again
                return self._inner.find({"_id": {"$in": found}}, projection, sort=sort)
        return self._inner.find(filter or {}, projection, sort=sort, limit=limit, skip=skip)

    def _walk(self, filter: Mapping[str, Any], sort: Any, limit: int) -> list[Any] | None:
        return walk(self._ordered, self._store, filter, sort, limit)

    async def find_one(
        self, filter: Mapping[str, Any] | None = None, projection: Any = None, **kwargs: Any
    ) -> dict[str, Any] | None:
        kwargs.pop("session", None)
        self._check_plan(filter, kwargs.get("sort"))
        return await self._inner.find_one(filter or {}, projection, **kwargs)

    async def count_documents(self, filter: Mapping[str, Any], **_: Any) -> int:
        self._check_plan(filter)
        return int(await self._inner.count_documents(filter))

    async def aggregate(self, pipeline: Sequence[Mapping[str, Any]], **_: Any) -> AggregateCursor:
        first = pipeline[0] if pipeline else {}
        if "$match" in first:
            following = pipeline[1] if len(pipeline) > 1 else {}
            self._check_plan(first["$match"], list(following.get("$sort", {}).items()) or None)
        elif "$sort" in first:
            self._check_plan({}, list(first["$sort"].items()))
        else:
            self._check_plan({})
        return AggregateCursor(await self._inner.aggregate(list(pipeline)).to_list(None))

    async def watch(
        self,
        pipeline: Sequence[Mapping[str, Any]] | None = None,
        full_document: str | None = None,
        resume_after: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> MemoryChangeStream:
        return await self.database.watch(
            pipeline, full_document, resume_after, collection=self.name, **options
        )

    async def drop(self, **_: Any) -> None:
        """Documents and indexes go; open streams read ``drop`` then ``invalidate``."""
        async for document in self._inner.find({}):
            self._ordered.changed(document, None)
        await self._inner.drop()
        for name, _keys, _partial in self._indexes[1:]:
            self._ordered.drop(name)
        del self._indexes[1:]
        self.changes.invalidate(self.name, "drop")

    # -- writes: each one publishes the change it made

    def _emit(self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        self._ordered.changed(before, after)
        if after is None and before is not None:
            self.changes.publish("delete", before["_id"], None, collection=self.name)
        elif before is None and after is not None:
            self.changes.publish("insert", after["_id"], after, collection=self.name)
        elif before is not None and after is not None and before != after:
            self.changes.publish("update", after["_id"], after, before, collection=self.name)

    async def insert_one(self, document: dict[str, Any], **_: Any) -> Any:
        refuse_insert(document)
        result = await self._inner.insert_one(document)
        self._emit(None, self._stored(result.inserted_id))
        return result

    async def _insert_new(self, document: dict[str, Any]) -> Any:
        return await insert_new(self, document)

    def _stored(self, document_id: Any) -> dict[str, Any]:
        """The document as stored, read back after a write for the change feed and the
        indexes: what ``find_one`` by ``_id`` returns, without a cursor."""
        return stored_copy(self._store, document_id)

    async def find_one_and_update(
        self,
        filter: Mapping[str, Any],
        update: Any,
        projection: Any = None,
        *,
        sort: Any = None,
        upsert: bool = False,
        return_document: bool = False,
        **_: Any,
    ) -> dict[str, Any] | None:
        self._check_plan(filter, sort)
        if upsert:
            before = await self._inner.find_one(filter, sort=sort)
            target = {"_id": before["_id"]} if before is not None else filter
            after = await self._inner.find_one_and_update(
                target, update, upsert=before is None, return_document=True
            )
            if after is not None:
                await self._undo_unless_storable(before, after)
            self._emit(before, after)
        else:
            before, after = await self._modify(filter, update, sort)
        chosen = after if return_document else before
        if chosen is not None and projection is not None:
            chosen = await self._inner.find_one({"_id": chosen["_id"]}, projection)
        return chosen

    async def _modify(
        self, filter: Mapping[str, Any], update: Any, sort: Any
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Update the first match of ``filter`` in ``sort`` order: the document before and
        after, or two Nones. Two reads of mongomock's, where a read before the write, the
        write and a read after took four (mongomock reads the document before it writes)."""
        first = self._walk(filter, sort, 1) if sort else None
        if first == []:  # nothing matches
            return None, None
        target, sort = ({"_id": first[0]}, None) if first else (filter, sort)
        before = await self._inner.find_one_and_update(target, update, sort=sort)
        after = None if before is None else await self._inner.find_one({"_id": before["_id"]})
        if after is not None:
            await self._undo_unless_storable(before, after)
        self._emit(before, after)
        return before, after

    async def find_one_and_replace(
        self,
        filter: Mapping[str, Any],
        replacement: Mapping[str, Any],
        *,
        return_document: bool = False,
        **_: Any,
    ) -> dict[str, Any] | None:
        self._check_plan(filter)
        before = await self._inner.find_one(filter)
        if before is None:
            return None
        refuse_update({**replacement, "_id": before["_id"]})
        await self._inner.replace_one({"_id": before["_id"]}, dict(replacement))
        after = await self._inner.find_one({"_id": before["_id"]})
        self._ordered.changed(before, after)
        if before != after:
            self.changes.publish("replace", before["_id"], after, collection=self.name)
        return after if return_document else before

    async def update_one(
        self, filter: Mapping[str, Any], update: Any, upsert: bool = False, **_: Any
    ) -> Any:
        return await self._update(filter, update, upsert=upsert, many=False)

    async def update_many(
        self, filter: Mapping[str, Any], update: Any, upsert: bool = False, **_: Any
    ) -> Any:
        return await self._update(filter, update, upsert=upsert, many=True)

    async def _update(
        self, filter: Mapping[str, Any], update: Any, *, upsert: bool, many: bool
    ) -> Any:
        self._check_plan(filter)
        if not many and not upsert:
            before, after = await self._modify(filter, update, None)
            changed = before is not None and before != after
            return UpdateResult({"n": int(before is not None), "nModified": int(changed)}, True)
        befores = await self._matching(filter, many)
        document = inserted_by(filter, update) if upsert and not befores else None
        if document is not None:
            inserted_id = await self._insert_new(document)
            return UpdateResult({"n": 1, "nModified": 0, "upserted": inserted_id}, True)
        if not befores:
            result = await self._inner.update_one(filter, update, upsert=upsert)
            if result.upserted_id is not None:
                inserted = await self._inner.find_one({"_id": result.upserted_id})
                await self._undo_unless_storable(None, inserted)
                self._emit(None, inserted)
            return result
        ids = [doc["_id"] for doc in befores]
        result = await self._inner.update_many({"_id": {"$in": ids}}, update)
        afters = {doc["_id"]: doc async for doc in self._inner.find({"_id": {"$in": ids}})}
        refused: Exception | None = None
        for before in befores:
            after = afters.get(before["_id"])
            try:
                await self._undo_unless_storable(before, after)
            except WriteError as exc:  # as on the server: the others stay written
                refused = exc
                continue
            self._emit(before, after)
        if refused is not None:
            raise refused
        return result

    async def _undo_unless_storable(
        self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
    ) -> None:
        """mongomock writes first; a result the server would have refused is put back."""
        if after is None:
            return
        try:
            refuse_update(after)
        except WriteError:
            if before is None:
                await self._inner.delete_one({"_id": after["_id"]})
            else:
                await self._inner.replace_one({"_id": before["_id"]}, dict(before))
            raise

    async def delete_one(self, filter: Mapping[str, Any], **_: Any) -> Any:
        return await self._delete(filter, many=False)

    async def delete_many(self, filter: Mapping[str, Any], **_: Any) -> Any:
        return await self._delete(filter, many=True)

    async def _delete(self, filter: Mapping[str, Any], *, many: bool) -> Any:
        self._check_plan(filter)
        befores = await self._matching(filter, many)
        result = await self._inner.delete_many({"_id": {"$in": [d["_id"] for d in befores]}})
        for before in befores:
            self._emit(before, None)
        return result

    async def _matching(self, filter: Mapping[str, Any], many: bool) -> list[dict[str, Any]]:
        if len(filter) == 1:
            ((field, value),) = filter.items()
            # A string equals only that string: a hash index that does not hold it says that
            # no document matches (a publish's upsert of a new key), without a plan.
            if type(value) is str and field != "_id" and self._ordered.holds(field, value) is False:
                return []
        exact = self._ordered.exact(filter) if filter and "_id" not in filter else None
        if exact is not None and next(exact, _NONE) is _NONE:
            return []  # the index has none: an upsert's usual case (a new key)
        cursor = self._inner.find(filter, limit=0 if many else 1)
        return [doc async for doc in cursor]

    async def bulk_write(self, requests: Iterable[Any], ordered: bool = True, **_: Any) -> Any:
        return await bulk_write(self, requests, ordered=ordered)


# ---------------------------------------------------------------- named in-process databases


class MemoryServer:
    """One in-process "server"; ``memory://NAME`` URIs with the same NAME share it."""

    def __init__(self) -> None:
        self.client: Any = AsyncMongoMockClient(tz_aware=False)
        self._feeds: dict[str, ChangeFeed] = {}  # by database: one log for its collections
        self._indexes: dict[tuple[str, str], list[Declared]] = {}
        self._ordered: dict[tuple[str, str], IndexSet] = {}

    def collection(self, database: str, collection: str, **flags: bool) -> MemoryCollection:
        """``flags``: ``notablescan``, ``change_streams`` (see `MemoryCollection`)."""
        namespace = (database, collection)
        feed = self._feeds.get(database)
        if feed is None:
            feed = self._feeds[database] = ChangeFeed(database)
        indexes = self._indexes.setdefault(namespace, [("_id_", [("_id", 1)], None)])
        inner = self.client[database][collection]
        ordered = self._ordered.get(namespace)
        if ordered is None:
            ordered = self._ordered[namespace] = IndexSet()
        # mongomock's own reads (updates, deletes, counts) take their candidates from it.
        adopt(inner, ordered)
        beside = functools.partial(self.collection, database)
        return MemoryCollection(inner, feed, indexes, ordered, sibling=beside, **flags)


_servers: dict[str, MemoryServer] = {}
_servers_lock = threading.Lock()


def memory_server(name: str) -> MemoryServer:
    """The shared server called ``name``; an empty name always gives a new, private one."""
    if not name:
        return MemoryServer()
    with _servers_lock:
        return _servers.setdefault(name, MemoryServer())


def memory_server_exists(name: str) -> bool:
    return name in _servers  # one dict lookup: atomic


def forget_memory_server(name: str) -> None:
    with _servers_lock:
        _servers.pop(name, None)
