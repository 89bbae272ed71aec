"""CPU per task as the collection grows: does a claim cost what it walks, or the collection?

    python bench/bench_scale.py                  # memory backend: 0, 1,000 and 10,000 finished
    python bench/bench_scale.py --markdown       # a table for bench/README.md

The same 300 short tasks run through one consumer over a collection that already holds N
finished tasks (written directly, as a long-lived deployment keeps them until ``purge``).
Prints process CPU per task, and how much of it was spent inside database calls.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
from bson import ObjectId
from common import counted_scheduler, dispose
from pymongo import InsertOne

import mscheduler as ms


async def _seed_finished(sched: ms.Scheduler, counting: Any, finished: int) -> None:
    """``finished`` succeeded tasks, copies of one that really ran, inserted in bulk."""
    await sched.publish("template", {"n": 0}, name="job")
    lease = await sched.store.claim("seed", key="template")
    assert lease is not None
    await sched.store.succeed(lease, {"ok": True})
    template = await counting.wrapped.find_one({"key": "template"})
    for start in range(0, finished, 1_000):
        requests = [
            InsertOne({**template, "_id": ObjectId(), "key": f"done:{n}"})
            for n in range(start, min(start + 1_000, finished))
        ]
        await counting.wrapped.bulk_write(requests)


async def run(uri: str, finished: int, tasks: int) -> dict[str, float]:
    sched, counting, connection = await counted_scheduler(uri)
    await _seed_finished(sched, counting, finished)
    keys = [f"job:{n}" for n in range(tasks)]
    await sched.publish_many(ms.TaskSpec(key=key, name="job") for key in keys)

    async def job(task: ms.Task) -> None:
        return None

    counting.reset()
    cpu_started, started = time.process_time(), time.perf_counter()
    options = ms.WorkerOptions(worker_id="w0", max_running=1)
    async with sched.consumer({"job": job}, options=options):
        await sched.wait_many(keys, timeout=3_600)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    await dispose(counting, connection)
    return {
        "cpu_ms": cpu / tasks * 1000,
        "db_cpu_ms": counting.cpu_seconds / tasks * 1000,
        "tasks_per_s": tasks / elapsed,
        "calls": counting.calls / tasks,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--finished", default="0,1000,10000")
    parser.add_argument("--markdown", action="store_true", help="print a table for the README")
    args = parser.parse_args()
    sizes = [int(size) for size in args.finished.split(",")]
    results = {size: await run(args.uri, size, args.tasks) for size in sizes}
    empty = results[sizes[0]]["cpu_ms"]
    if args.markdown:
        print(
            "| finished tasks in the collection | CPU ms/task | of it in DB calls | ratio to "
            f"{sizes[0]} | tasks/s |"
        )
        print("| ---: | ---: | ---: | ---: | ---: |")
    for size, result in results.items():
        ratio = result["cpu_ms"] / empty
        if args.markdown:
            print(
                f"| {size:,} | {result['cpu_ms']:.2f} | {result['db_cpu_ms']:.2f} | "
                f"{ratio:.2f}x | {result['tasks_per_s']:.0f} |"
            )
        else:
            print(
                f"{size:>6} finished: {result['cpu_ms']:.2f} ms CPU/task "
                f"({result['db_cpu_ms']:.2f} in database calls), {ratio:.2f}x the first, "
                f"{result['tasks_per_s']:.0f} tasks/s, {result['calls']:.2f} calls/task"
            )


if __name__ == "__main__":
    anyio.run(main)
