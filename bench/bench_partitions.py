"""Partitions (``TaskOptions(partition=...)``): what their fairness costs, beside the same run
without partitions, on memory://, the variants alternating within one run.

Two cases: (a) 200 tasks of partition A published first, then 3 of B (BullMQ Pro's groups
test), drained by one consumer of ``max_running=1``; (b) 1,000 partitions x 10 tasks
(published partition by partition, one ``publish_many`` each), drained by one consumer of
``max_running=16``. Printed per case and variant: the round trips per task of the publish
and of the drain (the tasks' collection and the partitions' beside it), the documents
examined per single claim (200 claims on a fresh copy of the backlog, the memory backend's
count, as ``explain``'s ``totalDocsExamined``), the tasks/s of the drain, and for (a) where
B's last task started.

    .venv/bin/python bench/bench_partitions.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.backends.memory import memory_server
from mscheduler.store.partitions import Partitions


def _specs(case: str, partitioned: bool) -> Iterator[list[ms.TaskSpec]]:
    """The case's publishes, each a batch."""

    def spec(key: str, partition: str) -> ms.TaskSpec:
        options = ms.TaskOptions(partition=partition if partitioned else None)
        return ms.TaskSpec(key=key, name="job", options=options)

    if case == "a":
        yield [spec(f"a{n}", "A") for n in range(200)]
        for n in range(3):
            yield [spec(f"b{n}", "B")]
    else:
        for p in range(1_000):
            yield [spec(f"t{p}:{n}", f"t{p}") for n in range(10)]


class _Counted:
    """The tasks' collection and the partitions' beside it, counted in one tally."""

    def __init__(self) -> None:
        self.collection = memory_server("").collection("db", uuid.uuid4().hex, notablescan=True)
        self.tasks = CountingCollection(self.collection)
        self.sched = ms.Scheduler(self.tasks)
        beside = CountingCollection(self.sched.store.partitions.collection)
        beside.counts = self.tasks.counts
        self.beside = beside


async def _publish(counted: _Counted, case: str, partitioned: bool) -> int:
    published = 0
    for batch in _specs(case, partitioned):
        if len(batch) == 1:
            await counted.sched.publish(batch[0].key, None, name="job", options=batch[0].options)
        else:
            await counted.sched.publish_many(batch)
        published += len(batch)
    return published


async def _run(case: str, partitioned: bool) -> dict[str, Any]:
    counted = _Counted()
    await counted.sched.ensure_indexes()
    counted.tasks.reset()
    tasks = await _publish(counted, case, partitioned)
    publish_calls = counted.tasks.calls
    counted.tasks.reset()
    started: list[str] = []

    async def handler(task: ms.Task) -> None:
        started.append(task.key)

    slots = 1 if case == "a" else 16
    options = ms.WorkerOptions(worker_id="w1", max_running=slots, burst=True)
    consumer = counted.sched.consumer({"job": handler}, options=options)
    begun = time.perf_counter()
    await consumer.run()
    seconds = time.perf_counter() - begun
    drain_calls = counted.tasks.calls
    await counted.sched.close()

    # Documents examined per single claim, on a fresh copy of the backlog.
    fresh = _Counted()
    await _publish(fresh, case, partitioned)
    before, claims = fresh.collection.docs_examined, min(200, tasks)
    for _ in range(claims):
        assert await fresh.sched.store.tasks.claim("w1", names=["job"]) is not None
    examined = (fresh.collection.docs_examined - before) / claims
    await fresh.sched.close()
    last_b = max((i for i, key in enumerate(started) if key.startswith("b")), default=-1) + 1
    return {
        "publish": publish_calls / tasks,
        "drain": drain_calls / tasks,
        "examined": examined,
        "rate": tasks / seconds,
        "last_b": last_b,
        "done": len(started) == tasks,
    }


def _patch_partitions_collection(runs: dict[int, _Counted]) -> None:
    """The partitions' collection each run counts (`_Counted.beside`), by store."""
    original = Partitions.collection

    def collection(self: Partitions) -> Any:
        for counted in runs.values():
            if counted.sched.store.partitions is self:
                return counted.beside
        return original.fget(self)  # type: ignore[attr-defined]

    Partitions.collection = property(collection)  # type: ignore[assignment,method-assign]


async def main(rounds: int) -> None:
    live: dict[int, _Counted] = {}
    original_init = _Counted.__init__

    def registering_init(self: _Counted) -> None:
        original_init(self)
        live[id(self)] = self

    _Counted.__init__ = registering_init  # type: ignore[method-assign]
    _patch_partitions_collection(live)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(
        "| case | variant | round trips/task: publish | drain | docs examined/claim "
        "| tasks/s (runs) | B's last start |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in ("a", "b"):
        results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for _ in range(rounds):
            for partitioned in (False, True):  # alternating, in one run
                results[partitioned].append(await _run(case, partitioned))
                live.clear()
        for partitioned in (False, True):
            runs = results[partitioned]
            median = sorted(runs, key=lambda run: run["rate"])[len(runs) // 2]
            rates = "/".join(f"{run['rate']:.0f}" for run in runs)
            title = "200 A then 3 B, 1 x 1" if case == "a" else "1,000 partitions x 10, 1 x 16"
            variant = "partitions" if partitioned else "no partitions"
            last_b = f"{median['last_b']} of 203" if case == "a" else "-"
            mark = "" if median["done"] else " (not all ran)"
            print(
                f"| {title} | {variant} | {median['publish']:.3f} | {median['drain']:.3f} | "
                f"{median['examined']:.2f} | {median['rate']:.0f} ({rates}){mark} | {last_b} |"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    anyio.run(main, parser.parse_args().rounds)
