"""Consumer benchmarks: wake latency, database calls per task, idle load. Prints numbers.

python bench/bench_consumer.py                       # embedded backend
python bench/bench_consumer.py --uri "mongodb://localhost:27017/?directConnection=true"
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import anyio
from common import counted_scheduler, dispose

import mscheduler as ms


async def wake_latency(uri: str, samples: int, *, purge: bool) -> None:
    """Publish one task at a time to an idle consumer; time publish → handler start.

    With ``purge`` each finished task is deleted, so the collection holds one task: on the
    memory backend every query is a Python full scan, and a growing collection measures
    mongomock rather than the consumer (a real server uses the indexes)."""
    sched, counting, connection = await counted_scheduler(uri)
    started: dict[str, float] = {}
    arrived = anyio.Event()

    async def handler(task: ms.Task) -> None:
        nonlocal arrived
        started[task.key] = time.perf_counter()
        arrived.set()

    latencies: list[float] = []
    async with sched.consumer({"bench": handler}, options=ms.WorkerOptions(worker_id="w1")):
        for n in range(samples):
            arrived = anyio.Event()
            await anyio.sleep(0.001)  # let the consumer go idle again
            sent = time.perf_counter()
            await sched.publish(f"latency:{n}", None, name="bench")
            with anyio.fail_after(10):
                await arrived.wait()
            latencies.append((started[f"latency:{n}"] - sent) * 1000)
            if purge:
                running = {"key": f"latency:{n}", "state": "running"}
                while await counting.count_documents(running):  # noqa: ASYNC110 - outside the timing
                    await anyio.sleep(0.0005)
                await counting.delete_many({"key": f"latency:{n}"})
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    where = "1 task in the collection" if purge else f"collection growing to {samples} tasks"
    print(
        f"wake latency publish -> handler start ({samples} samples, {where}): "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {latencies[-1]:.2f} ms"
    )
    await dispose(counting, connection)


async def calls_per_task(uri: str, tasks: int) -> None:
    """Database calls per task lifecycle for short tasks (no ping needed), by method."""
    sched, counting, connection = await counted_scheduler(uri)
    done = anyio.Event()
    finished = 0

    async def handler(task: ms.Task) -> None:
        nonlocal finished
        finished += 1
        if finished == tasks:
            done.set()

    consumer = sched.consumer({"bench": handler}, options=ms.WorkerOptions(worker_id="w1"))
    async with consumer:
        await anyio.sleep(0.01)
        counting.reset()
        for n in range(tasks):
            await sched.publish(f"calls:{n}", None, name="bench")
        publish_calls = counting.calls
        with anyio.fail_after(60):
            await done.wait()
            while consumer.stats.succeeded < tasks:  # noqa: ASYNC110 - the last finish write
                await anyio.sleep(0.001)
        consumer_calls = counting.calls - publish_calls
    print(
        f"database calls per task ({tasks} short tasks): publish {publish_calls / tasks:.2f}, "
        f"consumer (claim + ping + finish) {consumer_calls / tasks:.2f}; "
        f"by method {dict(counting.counts)}"
    )
    await dispose(counting, connection)


async def idle_load(uri: str, consumers: int, seconds: float) -> None:
    """What idle consumers of one process cost: change streams opened (the process's one, on
    the database, shared by its consumers and its controls through `TaskHub`; one more on
    the control version only where the server refuses a stream on the database) and reads
    per idle minute (without change streams: the process's poll)."""
    sched, counting, connection = await counted_scheduler(uri)
    controls, tasks = sched.services.control_hub, sched.services.task_hub

    async def handler(task: ms.Task) -> None:
        return None

    async with contextlib.AsyncExitStack() as stack:
        counting.reset()
        for n in range(consumers):
            options = ms.WorkerOptions(worker_id=f"idle-{n}")
            await stack.enter_async_context(sched.consumer({"bench": handler}, options=options))
        asked = counting.counts["watch"]
        counting.reset()
        control_reads = controls.reads
        await anyio.sleep(seconds)
        calls = counting.calls + controls.reads - control_reads
    per_minute = calls * 60 / seconds
    print(
        f"idle load: {consumers} idle consumers in one process: change streams opened "
        f"{tasks.streams_opened + controls.streams_opened} ({tasks.streams_opened} on the "
        f"{'database' if tasks.whole_database else 'tasks'}, asked {asked}; "
        f"{controls.streams_opened} on the controls alone; polling: {tasks.polling}), "
        f"{per_minute:.1f} reads per idle minute beyond the streams"
    )
    await dispose(counting, connection)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--idle-only", action="store_true", help="only the idle load")
    args = parser.parse_args()
    print(f"backend: {args.uri.split('://')[0]}://")
    if not args.idle_only:
        await wake_latency(args.uri, args.samples, purge=True)
        await wake_latency(args.uri, args.samples, purge=False)
        await calls_per_task(args.uri, args.tasks)
    for consumers in (1, 10):
        await idle_load(args.uri, consumers, args.idle_seconds)


if __name__ == "__main__":
    anyio.run(main)
