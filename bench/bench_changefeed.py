"""The embedded backend's change feed: CPU per delivered event as its history grows.

Each round publishes one event and lets every open stream read it; a stream's read should
cost the new events, not the history (not a scan of all of it, up to 10,000 events, each
copied before its ``$match``).

    .venv/bin/python bench/bench_changefeed.py
"""

from __future__ import annotations

import time

import anyio

from mscheduler.backends.memory.changefeed import ChangeFeed

STREAMS = 5
ROUNDS = 2_000


async def per_event_us(history: int) -> float:
    feed = ChangeFeed("db", history=10_000)
    document = {"_id": 0, "name": "job", "state": "pending", "payload": {"n": list(range(20))}}
    for n in range(history):
        feed.publish("update", n, {**document, "_id": n}, collection="tasks")
    match = [{"$match": {"fullDocument.name": {"$in": ["job"]}}}]
    streams = [feed.open(match, "updateLookup", None, collection="tasks") for _ in range(STREAMS)]
    started = time.process_time()
    for n in range(ROUNDS):
        feed.publish("update", n, {**document, "_id": n}, collection="tasks")
        for stream in streams:
            assert await stream.try_next() is not None
    return (time.process_time() - started) / (ROUNDS * STREAMS) * 1e6


async def main() -> None:
    print(f"change feed, {STREAMS} streams, CPU per delivered event:")
    for history in (0, 1_000, 10_000):
        print(f"  history {history:>6,} events: {await per_event_us(history):8.1f} us")


if __name__ == "__main__":
    anyio.run(main)
