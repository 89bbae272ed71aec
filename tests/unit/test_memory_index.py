"""The memory backend's ordered indexes answer every query as mongomock's full scan does: the
same documents, in the same order, through writes that move documents between keys."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from typing import Any

import pytest
from bson import ObjectId

import mscheduler as ms
from mscheduler.backends.memory.ordered_index import IndexSet
from mscheduler.backends.memory.server import MemoryCollection, memory_server
from mscheduler.queries import tasks as q
from mscheduler.queries import timing

pytestmark = pytest.mark.anyio

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NAMES = ["email", "sms", "report"]
STATES = ["pending", "running", "blocked", "success", "fail"]


def _document(rng: random.Random, n: int) -> dict[str, Any]:
    return {
        "_id": ObjectId(),
        "key": f"k{n}",
        "name": rng.choice(NAMES),
        "state": rng.choice(STATES),
        "options": {
            "priority": rng.choice([-5, 0, 0, 0, 3, 10]),
            "specific_worker_ids": [],
            "expires_at": rng.choice([None, T0 + dt.timedelta(seconds=rng.randrange(60))]),
        },
        "created_at": T0 + dt.timedelta(seconds=rng.randrange(20)),  # ties on purpose
        "next_claim_at": rng.choice([None, T0 + dt.timedelta(seconds=rng.randrange(60))]),
        "deps_pending": [],
        "worker_states": [],
        "dropped_attempts": 0,
        "dropped_failures": 0,
        "finished_at": None,
        "dependents_notified": rng.choice([None, False, True]),
    }


async def _pair() -> tuple[MemoryCollection, MemoryCollection]:
    """One collection with the store's indexes, one without (mongomock scans it)."""
    server = memory_server("")
    indexed = server.collection("db", uuid.uuid4().hex)
    await ms.Scheduler(indexed).ensure_indexes()
    return indexed, server.collection("db", uuid.uuid4().hex)


async def _found(collection: MemoryCollection, query: Any, sort: Any, limit: int) -> list[Any]:
    """Keys in the sort's order; without a sort, as a set would (no order is promised, and
    the index gives its own)."""
    cursor = collection.find(query, {"key": 1}, sort=sort, limit=limit)
    keys = [doc["key"] async for doc in cursor]
    return keys if sort else sorted(keys, key=repr)


async def test_the_index_answers_as_a_scan_does():
    rng = random.Random(12)
    indexed, scanned = await _pair()
    for n in range(400):
        document = _document(rng, n)
        await indexed.insert_one(dict(document))
        await scanned.insert_one(dict(document))
    for round_ in range(60):
        now = T0 + dt.timedelta(seconds=rng.randrange(70))
        names = rng.sample(NAMES, rng.randrange(1, 4))
        queries = [
            (q.claim_filter("w1", now, names=names), q.CLAIM_SORT, 1),
            (q.claim_filter("w1", now, names=names), q.CLAIM_SORT, 7),
            (q.fetch_filter(names, "w1"), q.FETCH_SORT, 25),
            (q.by_keys([f"k{rng.randrange(450)}" for _ in range(30)]), None, 0),
            (q.by_keys([f"k{rng.randrange(450)}" for _ in range(300)]), None, 0),
            ({"name": {"$in": names}, "state": rng.choice(STATES)}, None, 0),
            (q.by_key(f"k{rng.randrange(450)}"), None, 0),
            ({"dependents_notified": False}, None, 0),
            # Ranges after the equality prefix are bounds on the index keys, within their type
            # (a null next_claim_at, or a number bound against dates, matches nothing).
            ({"name": {"$in": names}, "state": "pending", "next_claim_at": {"$gt": now}}, None, 0),
            (
                {
                    "name": {"$in": names},
                    "state": {"$in": ["pending", "running"]},
                    "next_claim_at": {"$gte": now - dt.timedelta(seconds=20), "$lt": now},
                },
                q.CLAIM_SORT,
                0,
            ),
            ({"name": {"$in": names}, "state": "pending", "next_claim_at": {"$lte": 5}}, None, 0),
            # A range right after the prefix bounds the walk itself, within the bound's type.
            (
                {"name": {"$in": names}, "state": "pending", "next_claim_at": {"$lte": now}},
                None,
                0,
            ),
            (timing.expired(names, now), None, 0),
            (
                {
                    "name": names[0],
                    "state": {"$in": ["pending", "blocked"]},
                    "options.expires_at": {"$type": "date", "$gt": now},
                },
                None,
                0,
            ),
        ]
        for query, sort, limit in queries:
            expected = await _found(scanned, query, sort, limit)
            assert await _found(indexed, query, sort, limit) == expected, (round_, query)
            if sort is not None and limit == 1:
                first = await indexed.find_one_and_update(
                    query, {"$set": {"touched": round_}}, sort=sort
                )
                await scanned.find_one_and_update(query, {"$set": {"touched": round_}}, sort=sort)
                assert ([first["key"]] if first else []) == expected
        # Move documents between keys, delete some, add some: the index follows each write.
        for _ in range(20):
            key = f"k{rng.randrange(450)}"
            change = {
                "state": rng.choice(STATES),
                "options.priority": rng.choice([-1, 0, 7]),
                "next_claim_at": T0 + dt.timedelta(seconds=rng.randrange(60)),
            }
            await indexed.update_one({"key": key}, {"$set": change})
            await scanned.update_one({"key": key}, {"$set": change})
        victim = f"k{rng.randrange(450)}"
        await indexed.delete_one({"key": victim})
        await scanned.delete_one({"key": victim})
        fresh = _document(rng, 400 + round_)
        await indexed.insert_one(dict(fresh))
        await scanned.insert_one(dict(fresh))


async def test_a_document_the_index_cannot_order_sends_queries_to_the_scan():
    indexed, _ = await _pair()
    await indexed.insert_one({"_id": ObjectId(), "key": "a", "name": "job", "state": "pending"})
    await indexed.insert_one({"_id": ObjectId(), "key": ["b", "c"], "name": "job"})
    assert await _found(indexed, {"key": "c"}, None, 0) == [["b", "c"]]
    assert await _found(indexed, {"key": "a"}, None, 0) == ["a"]
    both = await _found(indexed, {"key": {"$in": ["a", "c"]}}, None, 0)
    assert both == sorted(["a", ["b", "c"]], key=repr)


@pytest.mark.parametrize(
    ("old", "new"),
    [(1, True), (True, 1), (1, 1.0), (0, False), (None, 0), ("a", "a"), (1, 1), (2, 3)],
)
def test_a_write_leaves_the_index_as_one_built_from_the_new_document(old: Any, new: Any):
    """A write that leaves an index's fields as they were does not touch its entry (the fast
    path); 1, 1.0 and True are equal in Python but not in BSON's order, so a change between
    them moves the entry as a rebuild from the written document would place it."""
    keys = [("state", 1), ("next_claim_at", 1)]
    written, rebuilt = IndexSet(), IndexSet()
    written.declare("claim", keys, [])
    rebuilt.declare("claim", keys, [])
    others = [{"_id": n, "state": "pending", "next_claim_at": v} for n, v in enumerate([0.5, 2])]
    before = {"_id": "moved", "state": "pending", "next_claim_at": old, "other": 1}
    after = {**before, "next_claim_at": new, "other": 2}
    for document in [*others, before]:
        written.changed(None, document)
    written.changed(before, after)
    for document in [*others, after]:
        rebuilt.changed(None, document)
    query = {"state": "pending"}
    assert list(written.candidates(query, keys[1:]) or []) == list(
        rebuilt.candidates(query, keys[1:]) or []
    )


def test_a_write_given_another_before_than_was_indexed_still_leaves_no_stale_entry():
    """An entry is found by the key of the document as it was; one given otherwise (a caller's
    mistake) is still removed, by its _id, so no query is ever answered with a stale id."""
    keys = [("state", 1), ("next_claim_at", 1)]
    index = IndexSet()
    index.declare("claim", keys, [])
    ids = [ObjectId() for _ in range(3)]
    for n, document_id in enumerate(ids):
        index.changed(None, {"_id": document_id, "state": "pending", "next_claim_at": n})
    index.changed({"_id": ids[1], "state": "pending", "next_claim_at": 99}, None)
    written = {"_id": ids[2], "state": "pending", "next_claim_at": 7}
    index.changed({"_id": ids[2], "state": "blocked", "next_claim_at": 2}, written)
    assert list(index.candidates({"state": "pending"}, keys[1:]) or []) == [ids[0], ids[2]]
