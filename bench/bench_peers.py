"""Throughput beside other queues, in one run on one machine: mscheduler on ``memory://``,
procrastinate's InMemoryConnector, arq and RQ on fakeredis. Prints numbers.

    pip install -e '.[bench]'
    python bench/bench_peers.py                 # 500, 5,000 and 20,000 tasks, 1 and 3 workers
    python bench/bench_peers.py --markdown      # the table in bench/README.md

Each queue gets the same job (a coroutine, or for RQ a function, that returns at once): all
tasks are enqueued first, then N workers each running one job at a time are timed until the
queue is empty. Every queue runs in process on an in-memory store, so the numbers compare
the queues' own work per job, not a network. A peer that is not installed is left out. First,
``--publish`` tasks are published in bulk: mscheduler's ``publish_many`` beside RQ's
``enqueue_many`` and arq's ``enqueue_job`` (arq has no bulk enqueue), paired likewise.

``--rounds`` runs every queue that many times, in turn, and reports each one's median rate.
On a shared machine one run varies by a third from one minute to the next, so a ratio is
not the quotient of two medians taken minutes apart: each round times mscheduler and then
each peer straight after it, and the ratio printed is the median of those rounds' ratios
(paired runs share the machine's state of that minute). A queue still
running after ``--deadline`` seconds is stopped and its rate is the jobs it finished in that
time (marked ``*``): procrastinate's in-memory connector slows as its queue grows (it scans
every job for each one it fetches), and with 5,000 jobs would take many minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import anyio
from bench_throughput import mscheduler_run
from common import counted_scheduler, dispose, median_run, rq_job

import mscheduler as ms


class Rate(NamedTuple):
    tasks_per_s: float
    complete: bool  # False: stopped at the deadline, the rate of the jobs done by then


class Compared(NamedTuple):
    """A peer over the rounds: its median rate, and the median of mscheduler's rate divided
    by its rate in the same round."""

    rate: Rate
    ratio: float


def procrastinate_run(workers: int, tasks: int, deadline: float) -> Rate | None:
    try:
        from procrastinate import App, testing
    except ImportError:
        return None
    connector = testing.InMemoryConnector()
    app = App(connector=connector)

    @app.task(name="job")
    async def job(n: int) -> None:
        return None

    async def main() -> Rate:
        async with app.open_async():
            for n in range(tasks):
                await job.defer_async(n=n)
            started = time.perf_counter()
            runs = asyncio.gather(
                *(app.run_worker_async(wait=False, concurrency=1) for _ in range(workers))
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(runs, deadline)
            elapsed = time.perf_counter() - started
            done = sum(1 for row in connector.jobs.values() if row["status"] == "succeeded")
            return Rate(done / elapsed, done == tasks)

    return asyncio.run(main())


def arq_run(workers: int, tasks: int, deadline: float) -> Rate | None:
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

    arq.worker.log_redis_info = no_server_info  # type: ignore[assignment,attr-defined]

    async def job(ctx: dict[str, Any], n: int) -> None:
        return None

    async def main() -> Rate:
        server = FakeServer()

        def pool() -> ArqRedis:
            return ArqRedis(
                connection_pool=ConnectionPool(connection_class=FakeConnection, server=server)  # type: ignore[arg-type]
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
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(runner.main() for runner in runners)), deadline)
        elapsed = time.perf_counter() - started
        done = sum(runner.jobs_complete for runner in runners)
        return Rate(done / elapsed, done == tasks)

    return asyncio.run(main())


def rq_run(workers: int, tasks: int, deadline: float) -> Rate | None:
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

    runners: list[ThreadWorker] = []

    def work() -> None:
        connection = FakeStrictRedis(server=server)
        runner = ThreadWorker([Queue("bench", connection=connection)], connection=connection)
        runners.append(runner)
        runner.work(burst=True, logging_level="WARNING")

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + deadline - time.perf_counter()))
    elapsed = time.perf_counter() - started
    for runner in runners:  # past the deadline: each stops after its current job
        runner._stop_requested = True
    for thread in threads:
        thread.join()
    finished = queue.finished_job_registry.count
    return Rate(finished / elapsed, finished == tasks)


async def mscheduler_publish(tasks: int) -> float:
    """Tasks/s of one `publish_many` of ``tasks`` specs, built in the timed part (as the
    peers' jobs are), on a fresh ``memory://`` collection with its indexes."""
    sched, counting, connection = await counted_scheduler("memory://")
    started = time.perf_counter()
    await sched.publish_many(ms.TaskSpec(key=f"job:{n}", name="job") for n in range(tasks))
    elapsed = time.perf_counter() - started
    await dispose(counting, connection)
    return tasks / elapsed


def rq_publish(tasks: int) -> float | None:
    try:
        from fakeredis import FakeServer, FakeStrictRedis
        from rq import Queue
    except ImportError:
        return None
    queue = Queue("bench", connection=FakeStrictRedis(server=FakeServer()))
    started = time.perf_counter()
    queue.enqueue_many([Queue.prepare_data(rq_job, args=(n,)) for n in range(tasks)])
    return tasks / (time.perf_counter() - started)


def arq_publish(tasks: int) -> float | None:
    """arq has no bulk enqueue: one ``enqueue_job`` per job, as its users publish."""
    try:
        from arq.connections import ArqRedis
        from fakeredis import FakeServer
        from fakeredis.aioredis import FakeConnection
        from redis.asyncio import ConnectionPool
    except ImportError:
        return None

    async def main() -> float:
        pool = ConnectionPool(connection_class=FakeConnection, server=FakeServer())  # type: ignore[arg-type]
        producer = ArqRedis(connection_pool=pool)
        started = time.perf_counter()
        for n in range(tasks):
            await producer.enqueue_job("job", n)
        return tasks / (time.perf_counter() - started)

    return asyncio.run(main())


PUBLISHERS: dict[str, Callable[[int], float | None]] = {
    "RQ enqueue_many + fakeredis": rq_publish,
    "arq enqueue_job + fakeredis": arq_publish,
}


async def measure_publish(tasks: int, rounds: int) -> tuple[float, dict[str, Compared]]:
    """mscheduler's median rate, and each peer's median rate and median paired ratio."""
    ours: list[float] = []
    peers: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        ours.append(await mscheduler_publish(tasks))
        for name, run in PUBLISHERS.items():
            rate = await anyio.to_thread.run_sync(run, tasks)
            if rate is not None:
                peers.setdefault(name, []).append((rate, ours[-1] / rate))
    compared = {
        name: Compared(
            Rate(statistics.median(rate for rate, _ in runs), True),
            statistics.median(ratio for _, ratio in runs),
        )
        for name, runs in peers.items()
    }
    return statistics.median(ours), compared


PEERS: dict[str, Callable[[int, int, float], Rate | None]] = {
    "procrastinate InMemory": procrastinate_run,
    "arq + fakeredis": arq_run,
    "RQ + fakeredis": rq_run,
}
OURS = "mscheduler memory://"


async def measure(tasks: int, workers: int, rounds: int, deadline: float) -> dict[str, Any]:
    """Every queue ``rounds`` times, in turn: mscheduler's median rate and calls per task, and
    each peer's `Compared` (left out: not installed)."""
    ours: list[Rate] = []
    calls = []
    peers: dict[str, list[tuple[Rate, float]]] = {}
    for _ in range(rounds):
        measured = await mscheduler_run("memory://", workers, tasks)
        ours.append(Rate(measured["tasks_per_s"], True))
        calls.append(measured["calls_per_task"])
        for name, run in PEERS.items():
            rate = await anyio.to_thread.run_sync(run, workers, tasks, deadline)
            if rate is not None:
                peers.setdefault(name, []).append((rate, ours[-1].tasks_per_s / rate.tasks_per_s))
    medians: dict[str, Any] = {OURS: _median(ours), "calls_per_task": statistics.median(calls)}
    for name, runs in peers.items():
        medians[name] = Compared(
            _median([rate for rate, _ in runs]), statistics.median(ratio for _, ratio in runs)
        )
    return medians


def _median(rates: list[Rate]) -> Rate:
    return median_run(rates, lambda rate: rate.tasks_per_s)


def cell(compared: Compared | None) -> str:
    if compared is None:
        return "-"
    mark = "" if compared.rate.complete else "*"
    return f"{compared.rate.tasks_per_s:.0f}{mark} ({compared.ratio:.2f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="500,5000,20000", help="jobs per run ('' for none)")
    parser.add_argument("--workers", default="1,3")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each queue (median)")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds per peer run")
    parser.add_argument("--publish", type=int, default=20_000, help="tasks published (0: none)")
    parser.add_argument("--markdown", action="store_true", help="print a table for the README")
    args = parser.parse_args()
    if args.publish:
        rate, compared = await measure_publish(args.publish, args.rounds)
        names = list(compared)
        if args.markdown:
            print("| publish | mscheduler publish_many | " + " | ".join(names) + " |")
            print("| ---: | ---: |" + " ---: |" * len(names))
            cells = " | ".join(cell(compared[name]) for name in names)
            print(f"| {args.publish:,} tasks | {rate:.0f} | {cells} |\n")
        else:
            line = f"publish {args.publish:,} tasks: mscheduler publish_many {rate:.0f}/s"
            for name in names:
                line += f"; {name} {cell(compared[name])}"
            print(line, flush=True)
    rows = []
    for tasks in (int(n) for n in args.tasks.split(",") if n):
        for workers in (int(n) for n in args.workers.split(",")):
            measured = await measure(tasks, workers, args.rounds, args.deadline)
            rows.append((tasks, workers, measured))
            if not args.markdown:
                ours = measured[OURS]
                line = f"{tasks:>5} tasks, {workers} worker(s): mscheduler "
                line += f"{ours.tasks_per_s:6.0f}/s ({measured['calls_per_task']:.2f} calls/task)"
                for name in PEERS:
                    if name in measured:
                        line += f"; {name} {cell(measured[name])}"
                print(line, flush=True)
    if args.markdown and rows:
        names = [name for name in PEERS if any(name in row[2] for row in rows)]
        print(
            f"{dt.date.today().isoformat()}, {platform.machine()} with "
            f"{os.cpu_count() or 1} cores, Python {platform.python_version()}; median of "
            f"{args.rounds} rounds; tasks/s (median of the rounds' ratios mscheduler / peer); "
            f"* stopped after "
            f"{args.deadline:.0f} s, the rate of the jobs it had finished\n"
        )
        print("| tasks | workers | mscheduler memory:// | calls/task | " + " | ".join(names) + " |")
        print("| ---: | ---: | ---: | ---: |" + " ---: |" * len(names))
        for tasks, workers, measured in rows:
            ours = measured[OURS]
            cells = [cell(measured.get(name)) for name in names]
            print(
                f"| {tasks:,} | {workers} | {ours.tasks_per_s:.0f} | "
                f"{measured['calls_per_task']:.2f} | " + " | ".join(cells) + " |"
            )


if __name__ == "__main__":
    anyio.run(main)
