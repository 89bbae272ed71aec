"""Inserts into the memory backend's store: an upsert that matches nothing, as the server
builds its document, put straight into mongomock's store when our indexes can check the unique
keys. mongomock's insert encoded the document to BSON again (`document_size.refuse_insert`
does), copied it twice, and read the documents of its key to check the unique index; applying
``$setOnInsert`` field by field through its update machinery was most of a `publish_many`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import ObjectId
from pymongo.errors import DuplicateKeyError

from . import fast_paths
from .compact import compact
from .document_size import refuse_insert


def inserted_by(filter: Mapping[str, Any], update: Any) -> dict[str, Any] | None:
    """The document an upsert of ``$setOnInsert`` alone inserts when nothing matches: the
    filter's equalities and those fields (as the server builds it), or None for any other
    upsert."""
    if type(update) is not dict or list(update) != ["$setOnInsert"]:
        return None
    fields = update["$setOnInsert"]
    for key, value in filter.items():
        if key[:1] == "$" or "." in key or isinstance(value, Mapping):
            return None
    for key in fields:
        if key[:1] == "$" or "." in key or key in filter:
            return None
    return {**filter, **fields}


# The collection is `server.MemoryCollection` (typed Any: this module is imported by it).
async def insert_new(collection: Any, document: dict[str, Any]) -> Any:
    """Insert what an upsert built (its top-level names checked); its ``_id``."""
    refuse_insert(document)  # encodable (no NUL in a name), within size and depth
    document.setdefault("_id", ObjectId())
    store = collection._store
    unique = [list(spec["key"]) for spec in store.indexes.values() if spec.get("unique")]
    fields = [keys[0][0] for keys in unique if len(keys) == 1]
    held = [collection._ordered.holds(field, document.get(field)) for field in fields]
    # mongomock's own dict of documents: its `in` takes a lock and looks for expired TTL
    # documents first (a new ObjectId is in no document; a TTL index deletes in its own time
    # on a server too).
    if len(fields) != len(unique) or None in held or document["_id"] in store._documents:
        result = await collection._inner.insert_one(document)  # mongomock checks them
        collection._emit(None, stored_copy(store, result.inserted_id))
        return result.inserted_id
    for field, taken in zip(fields, held, strict=True):
        if taken:
            value = document.get(field)
            raise DuplicateKeyError(
                f"E11000 duplicate key error: {field} {value!r}",
                11000,
                {"keyPattern": {field: 1}, "keyValue": {field: value}},
            )
    # A copy, dates as BSON keeps them, in a dict that shares its keys with the others'.
    stored = compact(fast_paths.datetimes_as_stored(document))
    store[document["_id"]] = stored
    collection._emit(None, stored)  # read, and copied by the change feed: never changed
    return document["_id"]


def stored_copy(store: Any, document_id: Any) -> dict[str, Any]:
    """A stored document as a read returns it (mongomock keeps OrderedDicts)."""
    return {key: fast_paths.document_copy(value) for key, value in store[document_id].items()}
