"""Without change streams: how soon a task starts after its publish, and what waiting for it
costs the server, mscheduler beside Celery (kombu's MongoDB transport) on ONE wire-engine
server (mongoeco's: no change streams), both with default settings, alternating. Prints
numbers.

    pip install -e '.[bench-peers-server]'   # Celery (said and skipped when missing)
    python bench/bench_no_streams.py                    # 2 rounds, 20 s flow, 30 s idle
    python bench/bench_no_streams.py --rounds 3 --flow-seconds 20 --idle-seconds 30

Each round, for each system in turn: 2 worker processes start on a fresh database (mscheduler:
one consumer each, default `WorkerOptions`; Celery: a worker each, threads pool of 16, the
transport's default polling), then the parent publishes 5 tasks a second for
``--flow-seconds`` (one publish a task), waits ``--idle-seconds`` with nothing published, and
publishes a burst of 100, back to back, one call a task as Celery sends them (``publish``,
``send_task``: the first task of the burst is the first after the idle time, and waits for
no batch). Each task carries the time its publish was called; its handler records the wait
(same machine, same clock).

Rows, per system (median of the rounds; each round's figure in brackets):

- publish-to-start p50 and p99 of the flow (5 tasks/s);
- the first task after the idle time (the burst's first start), and the burst's p50, p99 and
  its drain (publish to last start): a burst is bounded by the server's rate, not the wake;
- server CPU per task over the whole run (flow, idle, burst), and apart: the flow and the
  burst per task (a drain's cost), and what the idle time adds per task of the run;
- the idle time's server CPU per second per worker process, beside what one read by ``_id``
  (the signal's) and one small indexed read (the poll's read of writes) cost the server,
  measured alone first;
- before the rounds, what one claim of one task costs the server per task beside a claim of 16
  at once (a task that starts at once is claimed alone; a poll that found several, in a batch).

The machine's load average is printed beside each round: the wire engine is one Python
process and the machine is shared; ratios within a round are what to compare.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_server_cost import (  # noqa: E402
    Commands,
    WireServer,
    celery_app,
    cpu_seconds,
    wait_idle,
)

RATE = 5  # tasks a second in the flow
# Where a worker process imports mscheduler from first (``--before``): spawned processes take
# the parent's ``sys.path``, so the folder travels in the environment.
_PACKAGE = "MSCHEDULER_BENCH_PACKAGE"
BURST = 100
PROCESSES = 2


class Child(NamedTuple):
    uri: str
    db: str
    waits: Any  # a queue: seconds from publish to start, one per task
    ready: Any  # a queue: one item per child when set up
    stop: Any  # an event: send the counts, exit
    counts: Any  # a queue: each child's commands by name, from its first published task


def _exit_on_stop(child: Child, commands: Commands) -> None:
    child.stop.wait()
    with commands.lock:
        child.counts.put(dict(commands.by_command))
    child.counts.close()
    child.counts.join_thread()
    os._exit(0)


def _reads_by_collection(commands: Commands) -> None:
    """Counts the reads (``find``) apart by collection too, into ``commands``: the signal's
    beside the tasks' (installed before any client)."""
    from pymongo import monitoring

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            if event.command_name == "find":
                with commands.lock:
                    commands.by_command[f"  find on {event.command.get('find')}"] += 1

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None: ...
        def failed(self, event: monitoring.CommandFailedEvent) -> None: ...

    monitoring.register(Listener())


def child_mscheduler(child: Child) -> None:
    commands = Commands()
    _reads_by_collection(commands)
    if os.environ.get(_PACKAGE):  # an older package's workers (``--before``)
        sys.path.insert(0, os.environ[_PACKAGE])
    import anyio
    from pymongo import AsyncMongoClient

    import mscheduler as ms

    sys.stderr.write(f"worker {os.getpid()}: mscheduler from {ms.__file__}\n")

    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(child.uri)
        sched = ms.Scheduler(client[child.db]["tasks"])

        async def job(task: ms.Task) -> None:
            child.waits.put((task.payload["n"], time.time() - task.payload["t"]))

        threading.Thread(target=_exit_on_stop, args=(child, commands), daemon=True).start()
        async with sched.consumer({"job": job}):
            await anyio.sleep(2.0)  # past the start's reads
            commands.reset()
            child.ready.put(os.getpid())
            await anyio.sleep_forever()

    anyio.run(main)


def child_celery(child: Child) -> None:
    import warnings

    warnings.simplefilter("ignore")  # the worker warns that it runs as root, here
    commands = Commands()
    app = celery_app(child.uri, child.db, polling_interval=None)

    @app.task(name="noop")  # type: ignore[untyped-decorator]
    def noop(t: float, n: int) -> None:
        child.waits.put((n, time.time() - t))

    worker = app.Worker(
        pool="threads",
        concurrency=16,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        loglevel="WARNING",
        quiet=True,
    )
    threading.Thread(target=_exit_on_stop, args=(child, commands), daemon=True).start()

    def ready() -> None:
        time.sleep(2.0)  # past the start's reads
        commands.reset()
        child.ready.put(os.getpid())

    threading.Thread(target=ready, daemon=True).start()
    worker.start()


class Publisher:
    """The parent's side of a system: ``one()`` publishes a task, ``burst(n)`` n at once."""

    one: Callable[[int], None]  # the task's number
    burst: Callable[[int, int], None]  # the first task's number, how many
    close: Callable[[], None]


def mscheduler_publisher(uri: str, db: str) -> Publisher:
    """A `Scheduler` on its own event loop, in a thread of the parent (one client, one
    connection pool), called from the parent's timeline."""
    import anyio.from_thread
    from pymongo import AsyncMongoClient

    import mscheduler as ms

    portal_context = anyio.from_thread.start_blocking_portal()
    portal = portal_context.__enter__()

    async def open_scheduler() -> tuple[Any, ms.Scheduler]:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        sched = ms.Scheduler(client[db]["tasks"])
        await sched.ensure_indexes()
        return client, sched

    client, sched = portal.call(open_scheduler)

    async def publish(n: int) -> None:
        await sched.publish(uuid.uuid4().hex, {"t": time.time(), "n": n}, name="job")

    def burst(first: int, count: int) -> None:
        for n in range(first, first + count):
            portal.call(publish, n)

    def close() -> None:
        portal.call(client.close)
        portal_context.__exit__(None, None, None)

    publisher = Publisher()
    publisher.one = lambda n: portal.call(publish, n)
    publisher.burst = burst
    publisher.close = close
    return publisher


def celery_publisher(uri: str, db: str) -> Publisher:
    app = celery_app(uri, db, polling_interval=None)
    producer_context = app.producer_or_acquire()
    producer = producer_context.__enter__()

    def one(n: int) -> None:
        app.send_task("noop", args=(time.time(), n), producer=producer)

    def burst(first: int, count: int) -> None:
        for n in range(first, first + count):
            one(n)

    publisher = Publisher()
    publisher.one = one
    publisher.burst = burst
    publisher.close = lambda: producer_context.__exit__(None, None, None)
    return publisher


class System(NamedTuple):
    name: str
    modules: tuple[str, ...]
    publisher: Callable[[str, str], Publisher]
    child: Callable[[Child], None]
    pythonpath: str | None = None  # where the worker processes import from first


SYSTEMS = [
    System("mscheduler (default options)", (), mscheduler_publisher, child_mscheduler),
    System(
        "Celery, kombu MongoDB transport (default polling)",
        ("celery", "kombu"),
        celery_publisher,
        child_celery,
    ),
]


class Run(NamedTuple):
    flow: list[float]  # waits, seconds
    first_after_idle: float
    burst: list[float]
    burst_drain: float
    burst_sent: float  # how long the burst's publish call(s) took
    server_ms_per_task: float  # whole run
    busy_ms_per_task: float  # flow and burst
    idle_ms_per_task: float  # the idle time's, spread over the run's tasks
    idle_ms_per_s_per_process: float
    load: float
    by_command: dict[str, float]  # the workers' commands per task, by name
    complete: bool


def _collect(waits: Any, count: int, limit: float) -> dict[int, float]:
    """Each task's wait, by its number, until ``count`` came or ``limit`` seconds passed."""
    got: dict[int, float] = {}
    ends = time.perf_counter() + limit
    while len(got) < count and time.perf_counter() < ends:
        try:
            n, wait = waits.get(timeout=max(0.01, ends - time.perf_counter()))
            got[n] = wait
        except Exception:
            break
    return got


def run_once(system: System, server: WireServer, flow_s: float, idle_s: float) -> Run:
    from pymongo import MongoClient

    db = f"nostreams_{uuid.uuid4().hex[:8]}"
    wait_idle(server.process.pid)
    context = mp.get_context("spawn")
    waits, ready, stop, counts = context.Queue(), context.Queue(), context.Event(), context.Queue()
    child = Child(server.uri, db, waits, ready, stop, counts)
    publisher = system.publisher(server.uri, db)
    workers = [context.Process(target=system.child, args=(child,)) for _ in range(PROCESSES)]
    if system.pythonpath is not None:
        os.environ[_PACKAGE] = system.pythonpath
    try:
        for worker in workers:
            worker.start()
    finally:
        os.environ.pop(_PACKAGE, None)
    for _ in workers:
        ready.get(timeout=120)
    wait_idle(server.process.pid)
    pid = server.process.pid
    cpu_start = cpu_seconds(pid)
    # The flow: RATE tasks a second, on a fixed beat.
    flow_tasks = int(flow_s * RATE)
    began = time.perf_counter()
    for n in range(flow_tasks):
        delay = began + n / RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        publisher.one(n)
    flow = list(_collect(waits, flow_tasks, 30.0).values())
    # The idle time: measured from when the flow's last task started.
    cpu_idle_start = cpu_seconds(pid)
    idle_began = time.perf_counter()
    time.sleep(idle_s)
    idle_cpu = cpu_seconds(pid) - cpu_idle_start
    idle_elapsed = time.perf_counter() - idle_began
    burst_began = time.perf_counter()
    publisher.burst(flow_tasks, BURST)
    sent = time.perf_counter() - burst_began
    burst_waits = _collect(waits, BURST, 60.0)
    burst = list(burst_waits.values())
    drain = time.perf_counter() - burst_began
    load = os.getloadavg()[0]
    time.sleep(0.5)
    total_cpu = cpu_seconds(pid) - cpu_start
    stop.set()
    by_command: dict[str, float] = {}
    for _ in workers:
        for name, count in counts.get(timeout=30).items():
            if not name.endswith(" bytes"):
                by_command[name] = by_command.get(name, 0) + count
    for worker in workers:
        worker.join(10)
        if worker.is_alive():
            worker.kill()
            worker.join()
    publisher.close()
    with MongoClient(server.uri) as client:
        client.drop_database(db)
    tasks = max(len(flow) + len(burst), 1)
    return Run(
        flow=flow,
        first_after_idle=burst_waits.get(flow_tasks, float("nan")),
        burst=burst,
        burst_drain=drain,
        burst_sent=sent,
        server_ms_per_task=total_cpu * 1000 / tasks,
        busy_ms_per_task=(total_cpu - idle_cpu) * 1000 / tasks,
        idle_ms_per_task=idle_cpu * 1000 / tasks,
        idle_ms_per_s_per_process=idle_cpu * 1000 / idle_elapsed / PROCESSES,
        load=load,
        by_command={name: count / tasks for name, count in sorted(by_command.items())},
        complete=len(flow) == flow_tasks and len(burst) == BURST,
    )


def read_costs(server: WireServer, reads: int = 2_000) -> tuple[float, float]:
    """Server CPU ms of one read by ``_id`` of the signal, and of one poll's read of writes
    (the ``changes`` index, one name, nothing written since), each alone, one client."""
    from pymongo import MongoClient

    import mscheduler as ms
    from mscheduler.queries import signal as sq
    from mscheduler.queries import tasks as q

    db = f"reads_{uuid.uuid4().hex[:8]}"
    sync = ms.SyncScheduler.connect(server.uri, database=db, collection="tasks")
    sync.ensure_indexes()
    sync.publish_many(ms.TaskSpec(key=f"k{n}", name="job") for n in range(200))
    sync.close()
    costs = []
    with MongoClient(server.uri, tz_aware=True) as client:
        signal = client[db]["tasks.signal"]
        signal.update_one(*sq.bump(controls=False), upsert=True)
        tasks = client[db]["tasks"]
        since = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
        for read in (
            lambda: signal.find_one(sq.SIGNAL, sq.SIGNAL_FIELDS),
            lambda: list(tasks.find(q.changed_since(since, ["job"]))),
        ):
            wait_idle(server.process.pid)
            before = cpu_seconds(server.process.pid)
            for _ in range(reads):
                read()
            wait_idle(server.process.pid)
            costs.append((cpu_seconds(server.process.pid) - before) * 1000 / reads)
        client.drop_database(db)
    return costs[0], costs[1]


def claim_costs(
    server: WireServer, claims: int = 160, batch: int = 16, pending: int = 200
) -> tuple[float, float]:
    """Server CPU ms per task of a claim alone (what a task that starts at once costs: the
    consumer claims each as it comes), and per task of a claim of ``batch`` at once (what a
    poll that found several costs), on one collection of ``pending`` tasks beyond those
    claimed, one client: the part of the gap to a slow poll that is the claim's."""
    import anyio
    from pymongo import AsyncMongoClient

    import mscheduler as ms

    async def measure() -> tuple[float, float]:
        costs = []
        for limit in (1, batch):
            db = f"claims_{uuid.uuid4().hex[:8]}"
            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
            sched = ms.Scheduler(client[db]["tasks"])
            await sched.ensure_indexes()
            await sched.publish_many(
                ms.TaskSpec(key=f"k{n}", name="job") for n in range(pending + claims)
            )
            wait_idle(server.process.pid)
            before = cpu_seconds(server.process.pid)
            for _ in range(claims // limit):
                await sched.store.tasks.claim_many("bench-claims", names=["job"], limit=limit)
            wait_idle(server.process.pid)
            costs.append((cpu_seconds(server.process.pid) - before) * 1000 / claims)
            await client.drop_database(db)
            await client.close()
        return costs[0], costs[1]

    return anyio.run(measure)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flow-seconds", type=float, default=20.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument(
        "--by-command", action="store_true", help="also the workers' commands per task"
    )
    parser.add_argument("--only", default="", help="comma-separated name prefixes to run")
    parser.add_argument(
        "--before",
        default=None,
        help="a folder holding an older mscheduler package: its workers run as one more "
        "system (published to by this one: e.g. `git archive REV mscheduler | tar -x -C DIR`)",
    )
    parser.add_argument(
        "--profile", default=None, help="run the server under cProfile, its statistics to this file"
    )
    args = parser.parse_args()
    import importlib

    runnable = []
    systems = list(SYSTEMS)
    if args.before:
        before = System("mscheduler before", (), mscheduler_publisher, child_mscheduler)
        systems.insert(1, before._replace(pythonpath=args.before))
    for system in systems:
        if args.only and not any(system.name.startswith(p) for p in args.only.split(",")):
            continue
        try:
            for module in system.modules:
                importlib.import_module(module)
        except ImportError as error:
            print(f"{system.name}: skipped: {error} (pip install -e '.[bench-peers-server]')")
            continue
        runnable.append(system)
    server = WireServer(args.profile)
    print(
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} with "
        f"{os.cpu_count() or 1} cores, Python {platform.python_version()}, wire engine "
        f"(mongoeco, no change streams) on port {server.port}; {PROCESSES} worker processes, "
        f"{RATE} tasks/s for {args.flow_seconds:.0f} s, {args.idle_seconds:.0f} s idle, a burst "
        f"of {BURST}; {args.rounds} rounds, systems alternating; median (each round)\n",
        flush=True,
    )
    try:
        by_id, indexed = read_costs(server)
        print(
            f"one read by _id (the signal): {by_id:.3f} server CPU ms; one small indexed read "
            f"(the poll's read of writes): {indexed:.3f} ms; load {os.getloadavg()[0]:.1f}\n",
            flush=True,
        )
        alone, batched = claim_costs(server)
        print(
            f"one claim of one task: {alone:.3f} server CPU ms per task; a claim of 16 at once: "
            f"{batched:.3f} ms per task; load {os.getloadavg()[0]:.1f}\n",
            flush=True,
        )
        runs: dict[str, list[Run]] = {system.name: [] for system in runnable}
        for round_ in range(args.rounds):
            for system in runnable:
                run = run_once(system, server, args.flow_seconds, args.idle_seconds)
                runs[system.name].append(run)
                print(
                    f"round {round_ + 1}, {system.name}: flow p50 {_ms(_pct(run.flow, 0.5))} ms, "
                    f"p99 {_ms(_pct(run.flow, 0.99))} ms, first after idle "
                    f"{_ms(run.first_after_idle)} ms, server {run.server_ms_per_task:.2f} "
                    f"ms/task, load {run.load:.1f}{'' if run.complete else ' (incomplete)'}",
                    flush=True,
                )
                if args.by_command:
                    shown = {k: round(v, 2) for k, v in run.by_command.items()}
                    print(f"  the workers' commands per task: {shown}", flush=True)
    finally:
        server.stop()
    print()
    rows: list[tuple[str, Callable[[Run], float], str]] = [
        ("flow: publish-to-start p50 (ms)", lambda r: _pct(r.flow, 0.5) * 1000, "{:,.0f}"),
        ("flow: p99 (ms)", lambda r: _pct(r.flow, 0.99) * 1000, "{:,.0f}"),
        ("first task after the idle time (ms)", lambda r: r.first_after_idle * 1000, "{:,.0f}"),
        ("burst of 100: p50 (ms)", lambda r: _pct(r.burst, 0.5) * 1000, "{:,.0f}"),
        ("burst of 100: p99 (ms)", lambda r: _pct(r.burst, 0.99) * 1000, "{:,.0f}"),
        ("burst of 100: the publish call(s) took (ms)", lambda r: r.burst_sent * 1000, "{:,.0f}"),
        ("burst of 100: publish to last start (ms)", lambda r: r.burst_drain * 1000, "{:,.0f}"),
        ("server CPU ms per task, the whole run", lambda r: r.server_ms_per_task, "{:.2f}"),
        ("... of which the flow and the burst", lambda r: r.busy_ms_per_task, "{:.2f}"),
        ("... of which the idle time (what waiting adds)", lambda r: r.idle_ms_per_task, "{:.2f}"),
        (
            "idle: server CPU ms per second per process",
            lambda r: r.idle_ms_per_s_per_process,
            "{:.2f}",
        ),
        ("load (1 min)", lambda r: r.load, "{:.1f}"),
    ]
    names = list(runs)
    print("| | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for label, value, fmt in rows:
        cells = []
        for name in names:
            values = [value(run) for run in runs[name]]
            each = "/".join(fmt.format(v) for v in values)
            cells.append(f"{fmt.format(statistics.median(values))} ({each})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if len(names) == 2:
        ratios = [
            a.server_ms_per_task / b.server_ms_per_task
            for a, b in zip(runs[names[0]], runs[names[1]], strict=False)
        ]
        print(
            f"\nserver CPU per task, {names[0]} / {names[1]}, each round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
        )


if __name__ == "__main__":
    main()
