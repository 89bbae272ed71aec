"""Throughput beside other queues, in one run on one machine: mscheduler on ``memory://``,
procrastinate's InMemoryConnector, arq and RQ on fakeredis. Prints numbers.

    pip install -e '.[bench]'
    python bench/bench_peers.py                 # 500 and 5,000 tasks, 1 and 3 workers
    python bench/bench_peers.py --markdown      # the table in bench/README.md

Each queue gets the same job (a coroutine, or for RQ a function, that returns at once): all
tasks are enqueued first, then N workers each running one job at a time are timed until the
queue is empty. Every queue runs in process on an in-memory store, so the numbers compare
the queues' own work per job, not a network. A peer that is not installed is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
from bench_throughput import mscheduler_run, procrastinate_run
from common import rq_job


def arq_run(workers: int, tasks: int) -> float | None:
    try:
        from arq.connections import ArqRedis
        from arq.worker import Worker
        from fakeredis import FakeServer
        from fakeredis.aioredis import FakeConnection
        from redis.asyncio import ConnectionPool
    except ImportError:
        return None

    import arq.worker

    async def no_server_info(*_: Any) -> None:
        return None  # fakeredis has no INFO command, which arq logs at start

    arq.worker.log_redis_info = no_server_info  # type: ignore[assignment]

    async def job(ctx: dict[str, Any], n: int) -> None:
        return None

    async def main() -> float:
        server = FakeServer()

        def pool() -> ArqRedis:
            return ArqRedis(
                connection_pool=ConnectionPool(connection_class=FakeConnection, server=server)
            )

        producer = pool()
        for n in range(tasks):
            await producer.enqueue_job("job", n)
        runners = [
            Worker(
                functions=[arq.worker.func(job, name="job")],
                redis_pool=pool(),
                burst=True,
                max_jobs=1,
                poll_delay=0.01,
                handle_signals=False,
            )
            for _ in range(workers)
        ]
        started = time.perf_counter()
        await asyncio.gather(*(runner.main() for runner in runners))
        elapsed = time.perf_counter() - started
        done = sum(runner.jobs_complete for runner in runners)
        assert done == tasks, f"arq ran {done} of {tasks}"
        return tasks / elapsed

    return asyncio.run(main())


def rq_run(workers: int, tasks: int) -> float | None:
    try:
        from fakeredis import FakeServer, FakeStrictRedis
        from rq import Queue, SimpleWorker
    except ImportError:
        return None
    from rq.timeouts import TimerDeathPenalty

    class ThreadWorker(SimpleWorker):
        """Signals reach only the main thread, and these workers run in threads: no signal
        handlers, and job timeouts by timer rather than SIGALRM."""

        death_penalty_class = TimerDeathPenalty

        def _install_signal_handlers(self) -> None:
            pass

    server = FakeServer()
    queue = Queue("bench", connection=FakeStrictRedis(server=server))
    for n in range(tasks):
        queue.enqueue(rq_job, n)

    def work() -> None:
        connection = FakeStrictRedis(server=server)
        ThreadWorker([Queue("bench", connection=connection)], connection=connection).work(
            burst=True, logging_level="WARNING"
        )

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    finished = queue.finished_job_registry.count
    assert queue.count == 0 and finished == tasks, f"RQ finished {finished} of {tasks}"
    return tasks / elapsed


PEERS: dict[str, Callable[[int, int], float | None]] = {
    "procrastinate InMemory": procrastinate_run,
    "arq + fakeredis": arq_run,
    "RQ + fakeredis": rq_run,
}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="500,5000")
    parser.add_argument("--workers", default="1,3")
    parser.add_argument("--markdown", action="store_true", help="print a table for the README")
    args = parser.parse_args()
    rows = []
    for tasks in (int(n) for n in args.tasks.split(",")):
        for workers in (int(n) for n in args.workers.split(",")):
            ours = await mscheduler_run("memory://", workers, tasks)
            theirs = {
                name: await anyio.to_thread.run_sync(run, workers, tasks)
                for name, run in PEERS.items()
            }
            rows.append((tasks, workers, ours, theirs))
            if not args.markdown:
                line = f"{tasks:>5} tasks, {workers} worker(s): mscheduler "
                line += f"{ours['tasks_per_s']:6.0f}/s ({ours['calls_per_task']:.2f} calls/task)"
                for name, rate in theirs.items():
                    if rate is not None:
                        line += f"; {name} {rate:6.0f}/s (ratio {ours['tasks_per_s'] / rate:.2f})"
                print(line, flush=True)
    if args.markdown:
        names = [name for name in PEERS if any(row[3][name] is not None for row in rows)]
        print(
            f"{dt.date.today().isoformat()}, {platform.machine()} with "
            f"{os.cpu_count() or 1} cores, Python {platform.python_version()}; "
            "tasks/s (ratio mscheduler / peer)\n"
        )
        print("| tasks | workers | mscheduler memory:// | calls/task | " + " | ".join(names) + " |")
        print("| ---: | ---: | ---: | ---: |" + " ---: |" * len(names))
        for tasks, workers, ours, theirs in rows:
            cells = []
            for name in names:
                rate = theirs[name]
                cells.append(
                    "-" if rate is None else f"{rate:.0f} ({ours['tasks_per_s'] / rate:.2f})"
                )
            print(
                f"| {tasks:,} | {workers} | {ours['tasks_per_s']:.0f} | "
                f"{ours['calls_per_task']:.2f} | " + " | ".join(cells) + " |"
            )


if __name__ == "__main__":
    anyio.run(main)
