"""Does a claim cost what it walks, or the backlog? Drain rate and CPU as the collection grows.

    python bench/bench_scale.py                  # memory backend, pending backlogs and finished
    python bench/bench_scale.py --markdown       # the tables for bench/README.md

Pending backlogs: 3 consumers x 16 slots (batched claims) drain the first ``--drain`` tasks
of a backlog of 500, 20,000 or 100,000 pending tasks, published beforehand (not timed).
The resident memory the backlog added (the process's RSS, Linux), per pending task, on
``memory://``: the tasks' documents, indexes and change feed. The time Python's full
garbage collections took during the drain, per task: each walks every live object, and a
pending task is about seventeen (its documents, lists, ``_id`` and index entries).
Finished tasks: one consumer runs 300 short tasks over a collection that already holds N
finished tasks (written directly, as a long-lived deployment keeps them until ``purge``).

Each row is run ``--rounds`` times, the rows in turn, and the run of median rate is shown:
the machine is shared, and one run varies by a third from one minute to the next.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from bench_throughput import mscheduler_run
from bson import ObjectId
from common import counted_scheduler, dispose, median_run
from pymongo import InsertOne

import mscheduler as ms


async def _seed_finished(sched: ms.Scheduler, counting: Any, finished: int) -> None:
    """``finished`` succeeded tasks, copies of one that really ran, inserted in bulk."""
    await sched.publish("template", {"n": 0}, name="job")
    lease = await sched.store.tasks.claim("seed", key="template")
    assert lease is not None
    await sched.store.tasks.succeed(lease, {"ok": True})
    template = await counting.wrapped.find_one({"key": "template"})
    for start in range(0, finished, 1_000):
        requests = [
            InsertOne({**template, "_id": ObjectId(), "key": f"done:{n}"})
            for n in range(start, min(start + 1_000, finished))
        ]
        await counting.wrapped.bulk_write(requests)


async def finished_run(uri: str, finished: int, tasks: int) -> dict[str, float]:
    async def seed(sched: ms.Scheduler, counting: Any) -> None:
        await _seed_finished(sched, counting, finished)

    result = await mscheduler_run(uri, 1, tasks, 1, prepare=seed)
    return {
        "cpu_ms": result["overhead_ms_per_task"] + result["db_cpu_ms_per_task"],
        "db_cpu_ms": result["db_cpu_ms_per_task"],
        "tasks_per_s": result["tasks_per_s"],
        "calls": result["calls_per_task"],
    }


async def backlog_run(
    uri: str, pending: int, drain: int, consumers: int = 3, max_running: int = 16
) -> dict[str, float]:
    """``pending`` tasks published first; ``consumers`` x ``max_running`` timed until they
    have finished ``drain`` of them (the best first: priority, then age)."""
    sched, counting, connection = await counted_scheduler(uri)
    await sched.publish("warm-up", None, name="warm-up")
    gc.collect()
    resident = _resident_bytes()
    for start in range(0, pending, 10_000):
        keys = range(start, min(start + 10_000, pending))
        await sched.publish_many(ms.TaskSpec(key=f"job:{n}", name="job") for n in keys)

    async def job(task: ms.Task) -> None:
        return None

    gc.collect()
    resident_per_task = (_resident_bytes() - resident) / pending
    counting.reset()
    full_collections = _FullCollections()
    gc.callbacks.append(full_collections)
    cpu_started, started = time.process_time(), time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for n in range(consumers):
            options = ms.WorkerOptions(worker_id=f"w{n}", max_running=max_running)
            consumer = sched.consumer({"job": job}, options=options)
            running.append(await stack.enter_async_context(consumer))
        while sum(consumer.stats.succeeded for consumer in running) < drain:  # noqa: ASYNC110
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        done = sum(consumer.stats.succeeded for consumer in running)
    gc.callbacks.remove(full_collections)
    result = {
        "tasks_per_s": done / elapsed,
        "calls": counting.calls / done,
        "cpu_ms": cpu / done * 1000,
        "db_cpu_ms": counting.cpu_seconds / done * 1000,
        "kib_per_pending": resident_per_task / 1024,
        "gc_ms": full_collections.seconds / done * 1000,
    }
    await dispose(counting, connection)
    return result


class _FullCollections:
    """A `gc.callbacks` hook: the time spent in collections of the oldest generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def _resident_bytes() -> int:
    """The process's resident memory (Linux; elsewhere 0, and the column reads 0)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


Row = Callable[[], Awaitable[dict[str, float]]]


async def rounds(rows: dict[int, Row], count: int) -> dict[int, dict[str, float]]:
    """Each row ``count`` times, the rows in turn: the run of median rate of each."""
    runs: dict[int, list[dict[str, float]]] = {size: [] for size in rows}
    for _ in range(count):
        for size, row in rows.items():
            runs[size].append(await row())
    return {size: median_run(found, lambda run: run["tasks_per_s"]) for size, found in runs.items()}


def _print(title: str, unit: str, results: dict[int, dict[str, float]], markdown: bool) -> None:
    first = next(iter(results))
    base = results[first]["tasks_per_s"]
    if markdown:
        memory = (
            " of it in full GC | resident KiB per pending task |"
            if "kib_per_pending" in results[first]
            else ""
        )
        print(
            f"| {title} | tasks/s | ratio to {first:,} | CPU ms/task | of it in DB calls | "
            f"round trips/task |{memory}"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if memory else ""))
    for size, result in results.items():
        ratio = result["tasks_per_s"] / base
        if markdown:
            memory = (
                f" {result['gc_ms']:.2f} | {result['kib_per_pending']:.2f} |"
                if "kib_per_pending" in result
                else ""
            )
            print(
                f"| {size:,} | {result['tasks_per_s']:.0f} | {ratio:.2f}x | "
                f"{result['cpu_ms']:.2f} | {result['db_cpu_ms']:.2f} | {result['calls']:.2f} |"
                + memory
            )
        else:
            print(
                f"{size:>7,} {unit}: {result['tasks_per_s']:6.0f} tasks/s ({ratio:.2f}x the "
                f"first), {result['cpu_ms']:.2f} ms CPU/task ({result['db_cpu_ms']:.2f} in "
                f"database calls), {result['calls']:.2f} round trips/task"
                + (
                    f", {result['gc_ms']:.2f} ms/task in full GC, "
                    f"{result['kib_per_pending']:.2f} KiB resident per pending task"
                    if "kib_per_pending" in result
                    else ""
                ),
                flush=True,
            )
    if markdown:
        print()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    parser.add_argument("--pending", default="500,20000,100000", help="backlogs ('' for none)")
    parser.add_argument("--drain", type=int, default=2_000, help="tasks timed per backlog")
    parser.add_argument("--finished", default="0,10000", help="finished tasks ('' for none)")
    parser.add_argument("--tasks", type=int, default=300, help="tasks run over finished ones")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each row (median)")
    parser.add_argument("--markdown", action="store_true", help="print tables for the README")
    args = parser.parse_args()
    uri = args.uri
    if args.pending:
        backlog: dict[int, Row] = {
            size: (lambda size=size: backlog_run(uri, size, min(args.drain, size)))
            for size in (int(n) for n in args.pending.split(","))
        }
        _print(
            "pending tasks (3 x 16 drain the first 2,000)" if args.markdown else "",
            "pending",
            await rounds(backlog, args.rounds),
            args.markdown,
        )
    if args.finished:
        finished: dict[int, Row] = {
            size: (lambda size=size: finished_run(uri, size, args.tasks))
            for size in (int(n) for n in args.finished.split(","))
        }
        _print(
            f"finished tasks in the collection (1 x 1 runs {args.tasks})",
            "finished",
            await rounds(finished, args.rounds),
            args.markdown,
        )


if __name__ == "__main__":
    anyio.run(main)
