"""mongomock's collection, reading through the memory server's indexes: the speed of the
memory backend's queries, and the count of what they examine.

`IndexedCollection` is given only to the collections a `server.MemoryServer` makes (`adopt`):
any other mongomock user in the process keeps mongomock as it is.

- a query by ``_id`` alone (or ``_id`` ``$in`` a list) reads those documents, as the server's
  ``_id`` index does, instead of testing every document of the collection (the memory
  backend reads each written document back by ``_id``, for its change feed);
- any other query tests only the candidates of a declared index when one applies
  (`ordered_index.IndexSet`), and each candidate tested is counted as examined, as
  ``explain``'s ``totalDocsExamined`` counts the documents a plan fetched; a query no index
  serves examines the whole collection. A read by ``_id`` alone is not counted: it examines
  exactly what it names, and it is how the backend reads its own writes back;
- the unique ``key`` index is checked on each write as a server checks it, in the index,
  examining no document (mongomock reads the documents of that key).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from bson import ObjectId
from mongomock_motor.patches import _patch_insert_and_ensure_uniques

from . import fast_paths
from .engine import Collection, filter_applies
from .ordered_index import IndexSet

_HASHABLE_IDS = (ObjectId, str, int)  # compare as they hash; floats and documents do not


class IndexedCollection(Collection):  # type: ignore[misc]
    """A collection of the memory server's own copy of mongomock's engine (`engine`), whose
    reads go through ``index_set``."""

    index_set: IndexSet

    def _iter_documents(self, filter: Any) -> Iterator[Any]:
        store = self._store
        if type(filter) is not dict:
            return super()._iter_documents(filter)
        by_id = _by_id(store, filter)
        if by_id is not None:
            return iter(by_id)
        index_set = self.index_set
        wanted = filter.get("_id")
        found: Iterable[Any]
        if type(wanted) in _HASHABLE_IDS:  # `_id` and more (a batched claim's write)
            found = [store[wanted]] if wanted in store else []
        else:
            exact = index_set.exact(filter) if filter and "_id" not in filter else None
            if exact is not None:  # exactly the matches: nothing to test
                return _counted(index_set, [store[one] for one in list(exact) if one in store])
            candidates = index_set.candidates(filter, None)
            if candidates is None:
                index_set.examined += len(store)
                return super()._iter_documents(filter)
            found = (store[one] for one in list(candidates) if one in store)
        return (doc for doc in _counted(index_set, found) if filter_applies(filter, doc))


def adopt(collection: Any, index_set: IndexSet) -> None:
    """Make ``collection`` (mongomock's, behind mongomock-motor's wrapper) run on the engine's
    copy and read through ``index_set``. Its class is swapped for the subclass: mongomock's
    database made it, and the memory server owns it from here. mongomock-motor wrapped four
    of its methods on the instance, bound to mongomock's own class: two turn str subclasses
    (beanie's) into str in every filter (the store passes plain strings: dropped), two add
    the key to a duplicate key error (wrapped again around the subclass's methods)."""
    inner = collection.__dict__.get("_AsyncMongoMockCollection__collection", collection)
    if isinstance(inner, IndexedCollection):
        return
    inner.__class__ = IndexedCollection
    inner.index_set = index_set
    for wrapped in ("_iter_documents", "_get_dataset", "_insert", "_ensure_uniques"):
        inner.__dict__.pop(wrapped, None)
    _patch_insert_and_ensure_uniques(inner)
    inner._ensure_uniques = _uncounted(inner._ensure_uniques, index_set)


def _uncounted(check: Any, index_set: IndexSet) -> Any:
    """mongomock's unique-index check, which reads the documents of the new key: the server
    checks in the index and examines none."""

    def ensure_uniques(new_data: Any) -> None:
        examined = index_set.examined
        try:
            check(new_data)
        finally:
            index_set.examined = examined

    return ensure_uniques


def walk(
    index_set: IndexSet, store: Any, filter: Mapping[str, Any], sort: Any, limit: int
) -> list[Any] | None:
    """The ids of the first ``limit`` matches in ``sort`` order, walking a declared index and
    stopping there, as an index scan does (None: no index gives that order). Each candidate
    tested is examined."""
    order = [(field, int(direction)) for field, direction in sort or ()]
    candidates = index_set.candidates(filter, order)
    if candidates is None:
        return None
    filter = fast_paths.datetimes_as_stored(filter)  # as mongomock's own reads do
    found: list[Any] = []
    for one in candidates:
        if one not in store:
            continue
        index_set.examined += 1
        if filter_applies(filter, store[one]):
            found.append(one)
            if len(found) >= limit:
                break
    return found


def _counted(index_set: IndexSet, documents: Iterable[Any]) -> Iterator[Any]:
    for document in documents:
        index_set.examined += 1
        yield document


def _by_id(store: Any, filter: dict[str, Any]) -> list[Any] | None:
    """The documents a filter of ``_id`` alone (a value, or ``$in`` values) names."""
    if len(filter) != 1 or "_id" not in filter:
        return None
    wanted = filter["_id"]
    if type(wanted) in _HASHABLE_IDS:
        return [store[wanted]] if wanted in store else []
    if (
        type(wanted) is dict
        and list(wanted) == ["$in"]
        and all(type(one) in _HASHABLE_IDS for one in wanted["$in"])
    ):
        return [store[one] for one in dict.fromkeys(wanted["$in"]) if one in store]
    return None
