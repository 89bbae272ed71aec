"""What every benchmark needs: a fresh, counted collection, and cleaning it up afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.backends.uri import Connection, open_collection


async def counted_scheduler(uri: str) -> tuple[ms.Scheduler, CountingCollection, Connection]:
    """A scheduler on a fresh collection (``bench_<random>``) whose calls are counted."""
    connection = await open_collection(uri, collection=f"bench_{uuid.uuid4().hex[:8]}")
    counting = CountingCollection(connection.collection)
    sched = ms.Scheduler(counting)
    await sched.ensure_indexes()
    return sched, counting, connection


async def dispose(counting: CountingCollection, connection: Any) -> None:
    """Drop the benchmark's collection on a server, then close the connection."""
    if connection.kind == "mongodb":
        await counting.wrapped.drop()
    await connection.close()


T = TypeVar("T")


def median_run(runs: Sequence[T], rate: Callable[[T], float]) -> T:
    """The run of median ``rate`` (the upper one of an even count): a run itself, so that
    its other figures come from the same minute."""
    return sorted(runs, key=rate)[len(runs) // 2]


def rq_job(n: int) -> None:
    """RQ's job in bench_peers.py: RQ runs only functions it can import by module name."""
    return None
