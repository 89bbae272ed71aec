"""The memory backend changes mongomock for its own collections only: any other mongomock
user in the process (a test suite of the application, say) keeps mongomock as it is."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Run in a fresh interpreter: what a plain mongomock client answers before mscheduler is
# imported, then again after a `memory://` collection has been opened and used.
_PROBES = textwrap.dedent(
    """
    import asyncio, datetime as dt, json
    import mongomock

    def probe():
        client = mongomock.MongoClient()
        coll = client.db.things
        coll.delete_many({})
        when = dt.datetime(2026, 1, 1, 12, 0, 0, 123456)
        coll.insert_one({"_id": 1, "a": 1, "b": {"c": 2}, "when": when, "tags": ["x"]})
        stored = coll._store[1]
        results = {}
        stages = {
            "unset stage": [{"$unset": "b"}],
            "and stops at false": [{"$project": {"v": {"$and": [False, {"$divide": [1, 0]}]}}}],
            "add date and ms": [{"$project": {"v": {"$add": ["$when", 1000]}}}],
            "array literal": [{"$project": {"v": ["$a", {"$add": [1, 1]}]}}],
            "literal date": [{"$project": {"v": {"$literal": when}}}],
        }
        for name, pipeline in stages.items():
            try:
                results[name] = repr(list(coll.aggregate(pipeline)))
            except Exception as exc:
                results[name] = type(exc).__name__
        read = coll.find_one({"_id": 1})
        results["read shares the stored date"] = read["when"] is stored["when"]
        results["read type"] = type(read).__name__
        try:
            coll.update_one({"_id": 1}, [{"$set": {"d": {"$add": ["$when", 1]}}}])
            results["update pipeline"] = repr(coll.find_one({"_id": 1}, {"d": 1}))
        except Exception as exc:
            results["update pipeline"] = type(exc).__name__
        results["stored type"] = type(coll._store[1]).__name__
        return results

    before = probe()

    async def use_memory():
        from mscheduler.backends.uri import open_collection
        connection = await open_collection("memory://")
        collection = connection.collection
        await collection.insert_one({"_id": 1, "when": dt.datetime.now(dt.timezone.utc)})
        await collection.update_one({"_id": 1}, [{"$set": {"n": {"$add": ["$when", 1]}}}])
        await collection.find_one({"_id": 1})
        await (await collection.aggregate([{"$unset": "n"}])).to_list(None)

    asyncio.run(use_memory())
    print(json.dumps({"before": before, "after": probe()}))
    """
)


def test_a_plain_mongomock_client_is_unchanged_by_the_memory_backend():
    done = subprocess.run(
        [sys.executable, "-c", _PROBES], capture_output=True, text=True, timeout=120, check=True
    )
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["after"] == answers["before"]
