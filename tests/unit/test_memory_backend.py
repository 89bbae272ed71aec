"""The memory backend behaves as MongoDB where the library relies on it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest
from pymongo import IndexModel, ReturnDocument
from pymongo.errors import AutoReconnect, OperationFailure

import mscheduler as ms
from mscheduler.backends.memory.server import MemoryCollection, forget_memory_server
from mscheduler.backends.uri import open_collection

pytestmark = pytest.mark.anyio
UTC = dt.timezone.utc


@pytest.fixture
async def collection() -> MemoryCollection:
    connection = await open_collection("memory://")
    assert isinstance(connection.collection, MemoryCollection)
    return connection.collection


async def test_every_write_publishes_a_change(collection: MemoryCollection):
    stream = await collection.watch(full_document="updateLookup")
    await collection.insert_one({"_id": 1, "key": "a", "n": 0})
    await collection.update_one({"_id": 1}, {"$set": {"n": 1}})
    await collection.find_one_and_update({"_id": 1}, [{"$set": {"n": {"$add": ["$n", 1]}}}])
    await collection.find_one_and_replace({"_id": 1}, {"key": "a", "n": 10})
    await collection.delete_one({"_id": 1})
    events = [await stream.next() for _ in range(5)]
    assert [e["operationType"] for e in events] == [
        "insert",
        "update",
        "update",
        "replace",
        "delete",
    ]
    assert [e.get("fullDocument", {}).get("n") for e in events] == [0, 1, 2, 10, None]
    assert all(e["documentKey"] == {"_id": 1} for e in events)
    assert len({str(e["_id"]) for e in events}) == 5, "each event has its own resume token"


async def test_a_write_that_changes_nothing_publishes_nothing(collection: MemoryCollection):
    await collection.insert_one({"_id": 1, "key": "a"})
    stream = await collection.watch()
    await collection.find_one_and_update(
        {"key": "a"}, {"$setOnInsert": {"x": 1}}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert await stream.try_next() is None


async def test_match_pipeline_filters_events(collection: MemoryCollection):
    stream = await collection.watch(
        [{"$match": {"fullDocument.name": {"$in": ["email"]}}}], full_document="updateLookup"
    )
    await collection.insert_one({"name": "sms"})
    await collection.insert_one({"name": "email"})
    event = await stream.next()
    assert event["fullDocument"]["name"] == "email"
    assert await stream.try_next() is None


async def test_each_stream_gets_the_events_its_own_match_and_shape_select(
    collection: MemoryCollection,
):
    """Streams with one pipeline share the test of each event; none gets another's events."""

    def names(*values: str) -> list[dict[str, Any]]:
        return [{"$match": {"fullDocument.name": {"$in": list(values)}}}]

    emails = [await collection.watch(names("email"), full_document="updateLookup") for _ in "ab"]
    sms = await collection.watch(names("sms"), full_document="updateLookup")
    # Without updateLookup an update has no fullDocument: the same $match drops it.
    bare = await collection.watch(names("email"))
    await collection.insert_one({"_id": 1, "name": "sms"})
    await collection.insert_one({"_id": 2, "name": "email"})
    await collection.update_one({"_id": 2}, {"$set": {"n": 1}})

    async def seen(stream: Any) -> list[tuple[str, Any]]:
        events = []
        while (event := await stream.try_next()) is not None:
            events.append((event["operationType"], event["documentKey"]["_id"]))
        return events

    for stream in emails:
        assert await seen(stream) == [("insert", 2), ("update", 2)]
    assert await seen(sms) == [("insert", 1)]
    assert await seen(bare) == [("insert", 2)]


async def test_resume_after_a_token_misses_nothing(collection: MemoryCollection):
    stream = await collection.watch()
    await collection.insert_one({"n": 1})
    first = await stream.next()
    await stream.close()
    await collection.insert_one({"n": 2})
    await collection.insert_one({"n": 3})
    resumed = await collection.watch(resume_after=first["_id"])
    assert [(await resumed.next())["fullDocument"]["n"] for _ in range(2)] == [2, 3]


async def test_resume_token_counts_only_events_handed_out(collection: MemoryCollection):
    stream = await collection.watch()
    for n in range(3):
        await collection.insert_one({"n": n})
    await stream.next()
    token = stream.resume_token
    resumed = await collection.watch(resume_after=token)
    assert [(await resumed.next())["fullDocument"]["n"] for _ in range(2)] == [1, 2]


async def test_lost_history_cannot_be_resumed(collection: MemoryCollection):
    stream = await collection.watch()
    await collection.insert_one({"n": 1})
    token = (await stream.next())["_id"]
    await collection.insert_one({"n": 2})
    collection.changes.forget_history()
    with pytest.raises(OperationFailure) as info:
        await collection.watch(resume_after=token)
    assert info.value.code == 286


async def test_injected_error_reaches_open_streams_once(collection: MemoryCollection):
    stream = await collection.watch()
    collection.changes.inject_error(AutoReconnect("network is down"))
    with pytest.raises(AutoReconnect):
        await stream.try_next()
    fresh = await collection.watch(resume_after=stream.resume_token)
    await collection.insert_one({"n": 1})
    assert (await fresh.next())["fullDocument"] == {
        "_id": (await collection.find_one())["_id"],
        "n": 1,
    }


async def test_a_waiting_stream_wakes_on_a_write(collection: MemoryCollection):
    stream = await collection.watch()
    received: list[int] = []

    async def listen() -> None:
        received.append((await stream.next())["fullDocument"]["n"])

    async with anyio.create_task_group() as tg:
        tg.start_soon(listen)
        await anyio.wait_all_tasks_blocked()
        assert received == []
        await collection.insert_one({"n": 7})
    assert received == [7]


async def test_notablescan_refuses_an_unindexed_query():
    connection = await open_collection("memory://?notablescan=1")
    collection = connection.collection
    await ms.Scheduler(collection).ensure_indexes()
    assert await collection.find_one({"key": "x"}) is None  # served by key_unique
    with pytest.raises(OperationFailure, match="no index serves") as info:
        await collection.find_one({"payload.to": "x"})
    assert info.value.code == 291
    with pytest.raises(OperationFailure, match="no index serves"):
        await collection.find_one({"name": "a"}, sort=[("options.ping_interval_ms", 1)])


async def test_notablescan_counts_a_partial_index_only_for_queries_that_imply_its_filter():
    """As a server's planner: a query that does not imply the partial filter would scan, so
    the embedded engine refuses it where a real server would read the whole collection."""
    connection = await open_collection("memory://?notablescan=1")
    collection = connection.collection
    await collection.create_indexes(
        [IndexModel([("due", 1)], partialFilterExpression={"due": {"$type": "date"}})]
    )
    now = dt.datetime(2030, 1, 1, tzinfo=UTC)
    assert await collection.find_one({"due": {"$type": "date", "$lte": now}}) is None
    with pytest.raises(OperationFailure, match="no index serves") as info:
        await collection.find_one({"due": {"$lte": now}})
    assert info.value.code == 291


async def test_add_of_a_date_and_milliseconds_gives_a_date(collection: MemoryCollection):
    start = dt.datetime(2030, 1, 1, tzinfo=UTC)
    await collection.insert_one({"_id": 1, "at": start, "ms": 1500, "none": None})
    found = await collection.find_one_and_update(
        {"_id": 1},
        [{"$set": {"later": {"$add": ["$at", "$ms", 500]}, "null": {"$add": ["$at", "$none"]}}}],
        return_document=ReturnDocument.AFTER,
    )
    assert found is not None
    assert found["later"].replace(tzinfo=UTC) == start + dt.timedelta(seconds=2)
    assert found["null"] is None


async def test_array_literal_elements_are_expressions(collection: MemoryCollection):
    await collection.insert_one({"_id": 1, "a": 1, "xs": []})
    found = await collection.find_one_and_update(
        {"_id": 1},
        [{"$set": {"xs": {"$concatArrays": ["$xs", [{"v": "$a", "w": {"$literal": "$a"}}]]}}}],
        return_document=ReturnDocument.AFTER,
    )
    assert found is not None and found["xs"] == [{"v": 1, "w": "$a"}]


async def test_dates_in_an_update_pipeline_are_stored_as_mongodb_stores_them(
    collection: MemoryCollection,
):
    # The pipeline is not walked before it runs (that walk costs every write): each date is
    # converted where the pipeline evaluates it, a literal's and an array's included.
    paris = dt.timezone(dt.timedelta(hours=1))
    at = dt.datetime(2030, 1, 1, 13, 0, 0, 123_456, tzinfo=paris)
    stored = dt.datetime(2030, 1, 1, 12, 0, 0, 123_000)
    await collection.insert_one({"_id": 1})
    found = await collection.find_one_and_update(
        {"_id": 1},
        [
            {
                "$set": {
                    "plain": at,
                    "literal": {"$literal": {"at": at}},
                    "array": [at],
                    "let": {"$let": {"vars": {"v": {"at": at}}, "in": "$$v.at"}},
                    "cond": {"$cond": [True, at, None]},
                }
            }
        ],
        return_document=ReturnDocument.AFTER,
    )
    assert found is not None
    assert found["plain"] == stored and found["literal"] == {"at": stored}
    assert found["array"] == [stored] and found["let"] == stored and found["cond"] == stored


async def test_variables_are_read_by_path(collection: MemoryCollection):
    await collection.insert_one({"_id": 1, "xs": [{"a": {"b": 1}}, {"a": {"b": 2}}]})
    found = await collection.find_one_and_update(
        {"_id": 1},
        [
            {
                "$set": {
                    "bs": {"$map": {"input": "$xs", "as": "x", "in": "$$x.a.b"}},
                    "root": {"$size": "$$ROOT.xs"},
                }
            }
        ],
        return_document=ReturnDocument.AFTER,
    )
    assert found is not None and found["bs"] == [1, 2] and found["root"] == 2


async def test_documents_written_read_or_returned_are_copies(collection: MemoryCollection):
    # Copies share only immutable values with the stored document (cheaper than a deepcopy),
    # so a caller that changes what it got changes nothing stored.
    inserted = {"_id": 1, "key": "a", "xs": [{"n": 1}], "d": {"e": [1]}}
    await collection.insert_one(inserted)
    read = await collection.find_one({"_id": 1})
    returned = await collection.find_one_and_update(
        {"key": "a"}, {"$set": {"m": 1}}, return_document=ReturnDocument.AFTER
    )
    assert read is not None and returned is not None
    for got in (inserted, read, returned):
        got["xs"][0]["n"] = 99
        got["xs"].append({"n": 2})
        got["d"]["e"].append(2)
    stored = await collection.find_one({"_id": 1})
    assert stored == {"_id": 1, "key": "a", "xs": [{"n": 1}], "d": {"e": [1]}, "m": 1}


async def test_same_memory_name_shares_one_database():
    try:
        one = await ms.Scheduler.connect("memory://shared-test")
        two = await ms.Scheduler.connect("memory://shared-test")
        other = await ms.Scheduler.connect("memory://")
        await one.publish("k", None, name="job")
        assert await two.get("k") is not None
        assert await other.get("k") is None
    finally:
        forget_memory_server("shared-test")


async def test_after_a_drop_resume_after_is_refused_and_start_after_goes_on(
    collection: MemoryCollection,
):
    stream = await collection.watch()
    await collection.insert_one({"n": 1})
    await collection.drop()
    events = [await stream.next() for _ in range(3)]
    assert [e["operationType"] for e in events] == ["insert", "drop", "invalidate"]
    with pytest.raises(StopAsyncIteration):
        await stream.next()  # the server closed the cursor after the invalidate
    invalidate = events[-1]["_id"]
    with pytest.raises(OperationFailure) as info:
        await collection.watch(resume_after=invalidate)
    assert info.value.code == 260
    resumed = await collection.watch(start_after=invalidate)
    await collection.insert_one({"n": 2})
    assert (await resumed.next())["fullDocument"]["n"] == 2


async def test_an_event_over_the_size_limit_fails_every_read_from_before_it(
    collection: MemoryCollection,
):
    """As the server's BSONObjectTooLarge (10334): the token stays before the event; a
    projection after the $match that leaves it small enough lets it through."""
    await collection.insert_one({"_id": 1, "blob": ""})
    stream = await collection.watch(full_document="updateLookup")
    big = "x" * (9 * 1024 * 1024)
    await collection.update_one({"_id": 1}, {"$set": {"blob": big}})  # document + what changed
    with pytest.raises(OperationFailure) as info:
        await stream.try_next()
    assert info.value.code == 10334
    again = await collection.watch(resume_after=stream.resume_token, full_document="updateLookup")
    with pytest.raises(OperationFailure):
        await again.try_next()
    projected = await collection.watch(
        [{"$project": {"updateDescription": 0}}],
        resume_after=stream.resume_token,
        full_document="updateLookup",
    )
    event = await projected.next()
    assert "updateDescription" not in event and len(event["fullDocument"]["blob"]) == len(big)


async def test_a_waiting_read_returns_empty_with_the_token_past_unmatched_writes(
    collection: MemoryCollection,
):
    """A getMore with awaitData: other writes end the wait; the batch is empty and its
    post-batch resume token is past them."""
    stream = await collection.watch(
        [{"$match": {"fullDocument.name": "mine"}}], max_await_time_ms=1_000
    )
    start = stream.resume_token

    async def write_later() -> None:
        await collection.insert_one({"name": "other"})

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(write_later)
        assert await stream.try_next() is None
    assert stream.resume_token != start
    assert stream.resume_token == collection.changes.last_token


async def test_lookups_count_updates_the_oplog_part_of_a_match_lets_through(
    collection: MemoryCollection,
):
    await collection.insert_one({"_id": 1, "name": "a", "n": 0})
    on_document = await collection.watch(
        [{"$match": {"fullDocument.name": "b"}}], full_document="updateLookup"
    )
    on_event = await collection.watch(
        [{"$match": {"documentKey._id": 2, "fullDocument.name": "b"}}],
        full_document="updateLookup",
    )
    before = collection.changes.lookups
    await collection.update_one({"_id": 1}, {"$set": {"n": 1}})
    assert await on_document.try_next() is None
    assert collection.changes.lookups == before + 1, "no part of its $match is on the event"
    assert await on_event.try_next() is None
    assert collection.changes.lookups == before + 1, "dropped before the lookup"


async def test_a_database_stream_reads_every_collection_and_a_collection_stream_its_own(
    collection: MemoryCollection,
):
    """As ``db.watch()`` and ``collection.watch()``: one log, in the order written, each event
    naming its collection; a dropped collection invalidates its own streams only."""
    beside = collection.database.get_collection(collection.name + ".controls")
    everything = await collection.database.watch()
    tasks_only = await collection.watch()
    await collection.insert_one({"_id": 1})
    await beside.insert_one({"_id": "version"})
    await collection.update_one({"_id": 1}, {"$set": {"n": 1}})
    await beside.drop()
    await collection.insert_one({"_id": 2})
    seen = [await everything.next() for _ in range(5)]
    assert [(e["operationType"], e["ns"]["coll"]) for e in seen] == [
        ("insert", collection.name),
        ("insert", beside.name),
        ("update", collection.name),
        ("drop", beside.name),
        ("insert", collection.name),
    ]
    assert everything.alive, "a database stream outlives a collection's drop"
    own = [await tasks_only.next() for _ in range(3)]
    assert [e["documentKey"]["_id"] for e in own] == [1, 1, 2]


async def test_a_database_stream_can_be_refused_where_a_collection_stream_is_not(
    collection: MemoryCollection,
):
    """A user granted ``changeStream`` on the collection alone (Unauthorized, 13)."""
    collection.changes.refuse_database_streams(OperationFailure("not authorized", code=13))
    with pytest.raises(OperationFailure) as info:
        await collection.database.watch()
    assert info.value.code == 13
    stream = await collection.watch()
    await collection.insert_one({"_id": 1})
    assert (await stream.next())["documentKey"] == {"_id": 1}


async def test_another_collections_drop_leaves_every_stream_resumable(
    collection: MemoryCollection,
):
    """Only the streams on the dropped collection are invalidated: one on another collection,
    or on the database (which reads the drop), resumes after it with ``resumeAfter``."""
    other = collection.database.get_collection("audit_log")
    on_tasks = await collection.watch()
    on_database = await collection.database.watch()
    await other.insert_one({"_id": 1})
    await other.drop()
    assert await on_tasks.try_next() is None
    assert [(await on_database.next())["operationType"] for _ in range(2)] == ["insert", "drop"]
    for watched, stream in ((collection, on_tasks), (collection.database, on_database)):
        resumed = await watched.watch(resume_after=stream.resume_token)
        await collection.insert_one({"n": 1})
        assert (await resumed.next())["fullDocument"]["n"] == 1
        await collection.delete_many({})
