"""CPU per task as the collection grows: does a claim cost what it walks, or the collection?

    python bench/bench_scale.py                  # memory backend: 0, 1,000 and 10,000 finished
    python bench/bench_scale.py --markdown       # a table for bench/README.md

The same 300 short tasks run through one consumer over a collection that already holds N
finished tasks (written directly, as a long-lived deployment keeps them until ``purge``).
Prints process CPU per task, and how much of it was spent inside database calls.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
from bench_throughput import mscheduler_run
from bson import ObjectId
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
    async def seed(sched: ms.Scheduler, counting: Any) -> None:
        await _seed_finished(sched, counting, finished)

    result = await mscheduler_run(uri, 1, tasks, 1, prepare=seed)
    return {
        "cpu_ms": result["overhead_ms_per_task"] + result["db_cpu_ms_per_task"],
        "db_cpu_ms": result["db_cpu_ms_per_task"],
        "tasks_per_s": result["tasks_per_s"],
        "calls": result["calls_per_task"],
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
