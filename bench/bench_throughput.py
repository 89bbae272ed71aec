"""Throughput, round trips at saturation, pings under load, and CPU overhead. Prints numbers.

    python bench/bench_throughput.py                     # memory backend
    python bench/bench_throughput.py --uri "mongodb://localhost:27017/?directConnection=true"

The comparison with other queues is `bench_peers.py`.

What a server cannot show is said and skipped, never printed as a figure: the split of CPU
between the scheduler and its database calls is measured in process only (on a server, a
call's CPU counts whatever other coroutines ran while it awaited the reply), and events per
task need change streams.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Awaitable, Callable

import anyio
from common import counted_scheduler, dispose, median_run
from pymongo.errors import PyMongoError

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection


async def mscheduler_run(
    uri: str,
    consumers: int,
    tasks: int,
    max_running: int = 1,
    prepare: Callable[[ms.Scheduler, CountingCollection], Awaitable[None]] | None = None,
) -> dict[str, float]:
    """``tasks`` short tasks published first, then ``consumers`` (``max_running`` at a time
    each: one, as the peers are compared). ``prepare`` fills the collection beforehand."""
    sched, counting, connection = await counted_scheduler(uri)
    if prepare is not None:
        await prepare(sched, counting)
    keys = [f"job:{n}" for n in range(tasks)]
    await sched.publish_many(ms.TaskSpec(key=key, name="job") for key in keys)

    async def job(task: ms.Task) -> None:
        return None

    counting.reset()
    cpu_started, started = time.process_time(), time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for n in range(consumers):
            options = ms.WorkerOptions(worker_id=f"w{n}", max_running=max_running)
            consumer = sched.consumer({"job": job}, options=options)
            running.append(await stack.enter_async_context(consumer))
        # Done when the consumers have recorded every success (the peers are timed until
        # their queues are empty): no waiter following the change stream in the same process.
        while sum(consumer.stats.succeeded for consumer in running) < tasks:  # noqa: ASYNC110
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    done = await sched.wait_many(keys, timeout=60)
    assert all(task.state is ms.TaskState.SUCCESS for task in done.values())
    result = {
        "tasks_per_s": tasks / elapsed,
        "calls_per_task": counting.calls / tasks,
        "overhead_ms_per_task": (cpu - counting.cpu_seconds) / tasks * 1000,
        "db_cpu_ms_per_task": counting.cpu_seconds / tasks * 1000,
    }
    await dispose(counting, connection)
    return result


async def pings_under_load(uri: str, running: int, seconds: float) -> None:
    """``running`` long tasks on one consumer: database writes per ping interval."""
    sched, counting, connection = await counted_scheduler(uri)
    options = ms.TaskOptions(ping_interval_ms=200, worker_timeout_ms=2_000)
    keys = [f"long:{n}" for n in range(running)]
    await sched.publish_many(ms.TaskSpec(key=k, name="long", options=options) for k in keys)
    release, all_started = anyio.Event(), anyio.Event()
    started = 0

    async def long(task: ms.Task) -> None:
        nonlocal started
        started += 1
        if started == running:
            all_started.set()
        await release.wait()

    worker = ms.WorkerOptions(worker_id="w", max_running=running)
    async with sched.consumer({"long": long}, options=worker) as consumer:
        with anyio.move_on_after(60):
            await all_started.wait()
        if all_started.is_set():
            counting.reset()
            await anyio.sleep(seconds)
            pings = counting.counts["bulk_write"]
            other = counting.calls - pings
        release.set()
    await dispose(counting, connection)
    if not all_started.is_set():  # they did not all start in time: no figure
        print(
            f"pings with {running} running tasks on one consumer: not measured: {started} "
            "handler starts in 60 s"
        )
        return
    intervals = seconds / 0.2
    print(
        f"pings with {running} running tasks on one consumer: {pings / intervals:.2f} bulk "
        f"writes per ping interval ({pings} in {seconds:.0f} s), {other} other calls; "
        f"lease losses {consumer.stats.lease_lost}"
    )


async def has_change_streams(uri: str) -> bool:
    _, counting, connection = await counted_scheduler(uri)
    try:
        stream = await counting.wrapped.watch()
        await stream.close()
        return True
    except PyMongoError:
        return False
    finally:
        await dispose(counting, connection)


async def events_per_task(uri: str, consumers: int, tasks: int) -> None:
    """Change events each consumer receives per task, for tasks published while it runs and
    pinged while they run (it was about 3 per task per consumer, pings included)."""
    if not await has_change_streams(uri):
        print(
            "events delivered per task per consumer: not measured: this server has no change "
            "streams (its consumers poll, and no event reaches them)"
        )
        return
    sched, counting, connection = await counted_scheduler(uri)
    options = ms.TaskOptions(ping_interval_ms=20, worker_timeout_ms=1_000)

    async def job(task: ms.Task) -> None:
        await anyio.sleep(0.06)  # long enough for two or three pings

    worker = ms.WorkerOptions(worker_id="w", max_running=16)
    async with sched.consumers({"job": job}, count=consumers, options=worker) as running:
        keys = [f"ev:{n}" for n in range(tasks)]
        await sched.publish_many(ms.TaskSpec(key=k, name="job", options=options) for k in keys)
        await sched.wait_many(keys, timeout=120)
    events = [consumer.stats.events for consumer in running]
    pings = sum(consumer.stats.pings for consumer in running)
    print(
        f"events delivered per task per consumer: {max(events) / tasks:.2f} at most "
        f"({consumers} consumers, {tasks} tasks, {pings} pings written)"
    )
    await dispose(counting, connection)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--markdown", action="store_true", help="print a table for the README")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each row; the one of median rate is shown"
    )
    args = parser.parse_args()
    backend = args.uri.split("://")[0] + "://"
    in_process = backend == "memory://"  # the CPU split means something only there
    shapes = ((1, 1, args.tasks), (3, 1, args.tasks), (3, 16, 1_000))
    runs: dict[tuple[int, int, int], list[dict[str, float]]] = {shape: [] for shape in shapes}
    for _ in range(args.rounds):  # the rows in turn, so that each sees every minute alike
        for consumers, max_running, tasks in shapes:
            measured = await mscheduler_run(args.uri, consumers, tasks, max_running)
            runs[consumers, max_running, tasks].append(measured)
    rows = []
    for (consumers, max_running, tasks), measured_runs in runs.items():
        ours = median_run(measured_runs, lambda run: run["tasks_per_s"])
        rows.append((consumers, max_running, tasks, ours))
        if not args.markdown:
            cpu = (
                f", {ours['overhead_ms_per_task']:.2f} ms CPU/task outside the database "
                f"(database {ours['db_cpu_ms_per_task']:.2f} ms)"
                if in_process
                else ""
            )
            print(
                f"{backend} {consumers} consumer(s) x max_running={max_running}, {tasks} tasks: "
                f"{ours['tasks_per_s']:7.1f} tasks/s, {ours['calls_per_task']:.2f} round trips "
                f"per task{cpu}",
                flush=True,
            )
    if args.markdown:
        print(
            f"| {backend} consumers x max_running | tasks | tasks/s | round trips/task | "
            "CPU ms/task outside the database | in database calls |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for consumers, max_running, tasks, ours in rows:
            outside, inside = "-", "-"
            if in_process:
                outside = f"{ours['overhead_ms_per_task']:.2f}"
                inside = f"{ours['db_cpu_ms_per_task']:.2f}"
            print(
                f"| {consumers} x {max_running} | {tasks:,} | {ours['tasks_per_s']:.0f} | "
                f"{ours['calls_per_task']:.2f} | {outside} | {inside} |"
            )
        if not in_process:
            print(
                "\nCPU: not measured on a server (a call's CPU would count whatever other "
                "coroutines ran while it awaited the reply)."
            )
    else:
        if not in_process:
            print("CPU per task: not measured on a server (see --markdown)")
        await pings_under_load(args.uri, 100, 3.0)
        await events_per_task(args.uri, 3, 300)


if __name__ == "__main__":
    anyio.run(main)
