"""Every command one process sends to the server while 3 consumers x 16 drain a backlog, with
a waiter (`wait_many`) on all of it: round trips per task, counted by pymongo's command
monitoring (the controls, the polls, the waiter's reads included; the handshake and
heartbeats are not commands of the process's work and are left out). Prints numbers.

python bench/bench_commands.py --uri "mongodb://127.0.0.1:PORT/?directConnection=true"
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time
import uuid

import anyio
from pymongo import AsyncMongoClient, monitoring

import mscheduler as ms

_NOT_WORK = {"hello", "ismaster", "isMaster", "endSessions", "ping", "buildInfo"}


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in _NOT_WORK:
            self.counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None: ...

    def failed(self, event: monitoring.CommandFailedEvent) -> None: ...


async def drain(uri: str, tasks: int, consumers: int, max_running: int) -> None:
    commands = _Commands()
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(uri, event_listeners=[commands])
    collection = client["bench"][f"commands_{uuid.uuid4().hex[:8]}"]
    sched = ms.Scheduler(collection)
    await sched.ensure_indexes()
    keys = [f"t{n}" for n in range(tasks)]
    await sched.publish_many(ms.TaskSpec(key=key, name="bench") for key in keys)

    async def handler(task: ms.Task) -> None:
        return None

    commands.counts.clear()
    started = time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        for n in range(consumers):
            options = ms.WorkerOptions(worker_id=f"w{n}", max_running=max_running)
            await stack.enter_async_context(sched.consumer({"bench": handler}, options=options))
        await sched.wait_many(keys, timeout=600)
    seconds = time.perf_counter() - started
    total = sum(commands.counts.values())
    print(
        f"{consumers} x {max_running} draining {tasks} tasks with a waiter: {total} commands, "
        f"{total / tasks:.2f} round trips per task, {tasks / seconds:.0f} tasks/s; "
        f"by command {dict(commands.counts.most_common())}"
    )
    await collection.drop()
    await client.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--tasks", type=int, nargs="+", default=[300, 1_000])
    args = parser.parse_args()
    for tasks in args.tasks:
        await drain(args.uri, tasks, 3, 16)


if __name__ == "__main__":
    anyio.run(main)
