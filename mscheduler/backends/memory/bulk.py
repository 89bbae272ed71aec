"""``bulk_write`` on the memory backend: each request in turn, through the collection's own
writes (so each publishes its change and keeps the indexes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, DocumentTooLarge, WriteError
from pymongo.results import BulkWriteResult


# The collection is `server.MemoryCollection` (typed Any: this module is imported by it).
async def bulk_write(collection: Any, requests: Iterable[Any], *, ordered: bool) -> Any:
    """Each request in turn (pymongo's request classes keep their arguments in ``_filter``
    and ``_doc``), as the server runs a bulk: a failed request (a duplicate key, a document
    too large) is reported in a `BulkWriteError` with its index; an ordered bulk stops there,
    an unordered one goes on with the others."""
    counts: dict[str, Any] = {
        "nInserted": 0,
        "nMatched": 0,
        "nModified": 0,
        "nRemoved": 0,
        "nUpserted": 0,
        "upserted": [],
        "writeErrors": [],
        "writeConcernErrors": [],
    }
    for index, request in enumerate(requests):
        try:
            await _one(collection, request, index, counts)
        except (WriteError, DocumentTooLarge) as exc:
            code = getattr(exc, "code", None) or 2
            counts["writeErrors"].append({"index": index, "code": code, "errmsg": str(exc)})
            if ordered:
                break
    if counts["writeErrors"]:
        raise BulkWriteError(counts)
    del counts["writeErrors"], counts["writeConcernErrors"]
    return BulkWriteResult(counts, acknowledged=True)


async def _one(collection: Any, request: Any, index: int, counts: dict[str, Any]) -> None:
    if isinstance(request, InsertOne):
        await collection.insert_one(request._doc)
        counts["nInserted"] += 1
    elif isinstance(request, ReplaceOne):
        replaced = await collection.find_one_and_replace(request._filter, request._doc)
        counts["nMatched"] += int(replaced is not None)
        counts["nModified"] += int(replaced is not None)
    elif isinstance(request, (UpdateOne, UpdateMany)):
        result = await collection._update(
            request._filter,
            request._doc,
            upsert=bool(request._upsert),
            many=isinstance(request, UpdateMany),
        )
        if result.upserted_id is not None:
            counts["nUpserted"] += 1
            counts["upserted"].append({"index": index, "_id": result.upserted_id})
        else:
            counts["nMatched"] += result.matched_count
            counts["nModified"] += result.modified_count
    elif isinstance(request, (DeleteOne, DeleteMany)):
        result = await collection._delete(request._filter, many=isinstance(request, DeleteMany))
        counts["nRemoved"] += result.deleted_count
    else:
        raise TypeError(f"bulk_write: unsupported request {request!r}")
