"""What a task costs the server: mscheduler beside a hand-written find-and-modify loop, Celery
(kombu's MongoDB transport), Dramatiq (dramatiq-mongodb) and taskiq (taskiq-mongodb), all on
ONE wire-engine server (mongoeco's, as the tests run it), alternating. Prints numbers.

    pip install -e '.[bench-peers-server]'   # the peers (one not installed is said, skipped)
    python bench/bench_server_cost.py            # 1,000 tasks, 1 x 16 and 3 x 16, 3 rounds
    python bench/bench_server_cost.py --tasks 1000,5000 --rounds 3 --deadline 90

Every system drains the same backlog of no-op tasks, published first (not timed), with k worker
processes running 16 tasks at a time each: mscheduler one consumer with ``max_running=16`` per
process; the loop 16 coroutines per process, each a ``find_one_and_update`` (claim) then an
``update_one`` (finish); Celery a worker with the threads pool, concurrency 16; Dramatiq a
worker with 16 threads; taskiq a receiver with 16 async tasks. Timed from the moment the ready
processes are told to start until every task has run (or ``--deadline``: the rate of those
done, marked ``*``).

Figures per task: commands the workers sent (pymongo's command monitoring, every client of the
process), the bytes of those commands (BSON, as sent; the tasks' payloads travel in the
replies, not in them), the server process's CPU (``/proc/PID/stat``, user + system, from
the start until the server is idle after the workers stop: what they left queued is theirs;
each run also starts on an idle server), and the worker processes' CPU (the same, less the
time spent encoding commands to count their bytes). The machine's load average is printed
beside each row: the wire engine is one Python process and the machine is shared, so the
rates move with it; the counts do not.

Below each table, mscheduler's candidate reads that won nothing (every candidate taken by another
process between the read and its write), of all its candidate reads, per round.

The last line is memory://'s documents examined per claimed task (its index plan counters),
for a batched claim of 16 over a backlog of 3,000.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import logging
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
WIRE_PYTHON = os.environ.get("MSCHEDULER_WIRE_PYTHON", str(ROOT / ".venv-wire" / "bin" / "python"))
_NOT_WORK = {"hello", "ismaster", "isMaster", "endSessions", "ping", "buildInfo", "buildinfo"}
_TICKS = os.sysconf("SC_CLK_TCK")


def _codec() -> Any:
    from bson.binary import UuidRepresentation
    from bson.codec_options import CodecOptions

    return CodecOptions(uuid_representation=UuidRepresentation.STANDARD)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


class WireServer:
    """mongoeco's wire server in its own interpreter (tests/wire/serve.py)."""

    def __init__(self, profile: str | None = None) -> None:
        # ``profile``: a file the server's cProfile statistics are written to when it stops.
        profiling = ["-m", "cProfile", "-o", profile] if profile else []
        self.process = subprocess.Popen(
            [WIRE_PYTHON, *profiling, str(ROOT / "tests" / "wire" / "serve.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"the wire server did not start (it printed {line!r})")
        self.port = int(line)
        self.uri = f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- in the worker processes -------------------------------------------------------------


class Commands:
    """Counts the commands a process sends and their BSON bytes (installed before any client)."""

    def __init__(self) -> None:
        import bson
        from pymongo import monitoring

        outer = self
        _CODEC = _codec()

        class Listener(monitoring.CommandListener):
            def started(self, event: monitoring.CommandStartedEvent) -> None:
                if event.command_name in _NOT_WORK:
                    return
                began = time.thread_time()
                size = len(bson.encode(event.command, codec_options=_CODEC))
                with outer.lock:
                    outer.count += 1
                    outer.bytes += size
                    outer.by_command[event.command_name] += 1
                    outer.by_command[event.command_name + " bytes"] += size
                    outer.encoding += time.thread_time() - began

            def succeeded(self, event: monitoring.CommandSucceededEvent) -> None: ...
            def failed(self, event: monitoring.CommandFailedEvent) -> None: ...

        self.lock = threading.Lock()
        self.count = 0
        self.bytes = 0
        self.encoding = 0.0
        self.by_command: collections.Counter[str] = collections.Counter()
        # The system's own counts, read when the process reports (mscheduler's claim reads).
        self.extra: Callable[[], dict[str, int]] = dict
        monitoring.register(Listener())

    def reset(self) -> None:
        with self.lock:
            self.count, self.bytes, self.encoding = 0, 0, 0.0
            self.by_command.clear()


class Child(NamedTuple):
    uri: str
    db: str
    tasks: int
    done: Any  # a shared counter of tasks run
    ready: Any  # a queue: each child puts one item when set up
    go: Any  # an event: start consuming
    stop: Any  # an event: report and exit
    results: Any  # a queue: (commands, bytes, encoding seconds)


def _count(child: Child, n: int = 1) -> None:
    with child.done.get_lock():
        child.done.value += n


def _report_on_stop(child: Child, commands: Commands) -> None:
    """Waits for go (then resets the counts), then for stop: sends the counts and exits."""
    child.go.wait()
    commands.reset()
    child.stop.wait()
    with commands.lock:
        child.results.put(
            (
                commands.count,
                commands.bytes,
                commands.encoding,
                dict(commands.by_command),
                commands.extra(),
            )
        )
    child.results.close()
    child.results.join_thread()  # flushed before the exit below skips every cleanup
    os._exit(0)


def _serve(child: Child, commands: Commands, start: Callable[[], None]) -> None:
    """Signals ready, waits for go, then runs ``start`` (which may block) until stop."""
    threading.Thread(target=_report_on_stop, args=(child, commands), daemon=True).start()
    child.ready.put(os.getpid())
    child.go.wait()
    start()
    threading.Event().wait()  # until _report_on_stop exits the process


def child_mscheduler(child: Child) -> None:
    commands = Commands()
    import anyio
    from pymongo import AsyncMongoClient

    import mscheduler as ms

    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(child.uri)
        sched = ms.Scheduler(client[child.db]["tasks"])
        window = sched.services.claim_turns.window
        counted_from = (0, 0)

        def claim_reads() -> dict[str, int]:
            return {
                "claim reads": window.reads - counted_from[0],
                "lost reads": window.lost_reads - counted_from[1],
            }

        commands.extra = claim_reads

        async def job(task: ms.Task) -> None:
            return None

        threading.Thread(target=_report_on_stop, args=(child, commands), daemon=True).start()
        child.ready.put(os.getpid())
        await anyio.to_thread.run_sync(child.go.wait)
        counted_from = (window.reads, window.lost_reads)
        options = ms.WorkerOptions(max_running=16)
        async with sched.consumer({"job": job}, options=options) as consumer:
            counted = 0
            while True:
                succeeded = consumer.stats.succeeded
                if succeeded > counted:
                    _count(child, succeeded - counted)
                    counted = succeeded
                await anyio.sleep(0.005)

    anyio.run(main)


def child_loop(child: Child) -> None:
    commands = Commands()
    from pymongo import AsyncMongoClient, ReturnDocument

    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(child.uri)
        collection = client[child.db]["jobs"]
        threading.Thread(target=_report_on_stop, args=(child, commands), daemon=True).start()
        child.ready.put(os.getpid())
        await asyncio.to_thread(child.go.wait)

        async def worker() -> None:
            while True:
                now = dt.datetime.now(dt.timezone.utc)
                document = await collection.find_one_and_update(
                    {"state": "pending"},
                    {"$set": {"state": "running", "claimed_at": now}},
                    sort=[("_id", 1)],
                    return_document=ReturnDocument.AFTER,
                )
                if document is None:
                    await asyncio.sleep(0.05)
                    continue
                await collection.update_one(
                    {"_id": document["_id"], "state": "running"}, {"$set": {"state": "done"}}
                )
                _count(child)

        await asyncio.gather(*(worker() for _ in range(16)))

    asyncio.run(main())


def celery_app(child_or_uri: Child | str, db: str, *, polling_interval: float | None = 0.05) -> Any:
    """Celery on kombu's MongoDB transport, polling every ``polling_interval`` seconds (None:
    kombu's default). kombu reads the server's version with pymongo's
    ``server_info``, which sends ``buildinfo`` (lower case): the wire engine answers only
    ``buildInfo``, so that one call is sent as ``buildInfo`` (the same command). kombu also
    creates a capped collection for broadcasts (remote control, disabled here), which the wire
    engine refuses: it is created uncapped beforehand, and kombu leaves an existing one."""
    from celery import Celery
    from pymongo import MongoClient

    def server_info(client: Any, session: Any = None) -> Any:
        return client.admin.command("buildInfo", session=session)

    MongoClient.server_info = server_info  # type: ignore[method-assign]
    uri = child_or_uri if isinstance(child_or_uri, str) else child_or_uri.uri
    with MongoClient(uri) as client:
        if "messages.broadcast" not in client[db].list_collection_names():
            client[db].create_collection("messages.broadcast")

    host = uri.split("://", 1)[1].split("/", 1)[0]
    app = Celery("bench", broker=f"mongodb://{host}/{db}?directConnection=true")
    app.conf.update(
        task_ignore_result=True,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    if polling_interval is not None:
        app.conf.broker_transport_options = {"polling_interval": polling_interval}
    return app


def child_celery(child: Child) -> None:
    import warnings

    warnings.simplefilter("ignore")  # the worker warns that it runs as root, here
    commands = Commands()
    app = celery_app(child, child.db)

    @app.task(name="noop")  # type: ignore[untyped-decorator]
    def noop() -> None:
        _count(child)

    worker = app.Worker(
        pool="threads",
        concurrency=16,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        loglevel="WARNING",
        quiet=True,
    )
    _serve(child, commands, worker.start)


def _dramatiq_broker(uri: str, db: str) -> Any:
    from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, Retries, TimeLimit
    from dramatiq_mongodb import MongoDBBroker
    from pymongo import MongoClient

    middleware = [AgeLimit(), TimeLimit(), Callbacks(), Pipelines(), Retries()]
    broker = MongoDBBroker(database=MongoClient(uri)[db], middleware=middleware)
    broker.declare_queue("default")
    return broker


def child_dramatiq(child: Child) -> None:
    commands = Commands()
    import dramatiq

    broker = _dramatiq_broker(child.uri, child.db)
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name="noop", broker=broker)
    def noop() -> None:
        _count(child)

    def start() -> None:
        dramatiq.Worker(broker, worker_threads=16).start()

    _serve(child, commands, start)


def _taskiq_broker(uri: str, db: str) -> Any:
    from taskiq_mongodb import MongoBroker

    return MongoBroker(uri, db, queues={"name": "taskiq", "poll_interval": 0.05})


def child_taskiq(child: Child) -> None:
    commands = Commands()
    from taskiq.receiver import Receiver

    broker = _taskiq_broker(child.uri, child.db)

    @broker.task(task_name="noop")
    async def noop() -> None:
        _count(child)

    async def main() -> None:
        broker.is_worker_process = True
        threading.Thread(target=_report_on_stop, args=(child, commands), daemon=True).start()
        child.ready.put(os.getpid())
        await asyncio.to_thread(child.go.wait)
        await broker.startup()
        receiver = Receiver(broker, max_async_tasks=16, run_startup=False)
        await receiver.listen(asyncio.Event())

    asyncio.run(main())


# --- in the parent: publishing ------------------------------------------------------------


def publish_mscheduler(uri: str, db: str, tasks: int) -> None:
    import anyio
    from pymongo import AsyncMongoClient

    import mscheduler as ms

    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
        sched = ms.Scheduler(client[db]["tasks"])
        await sched.ensure_indexes()
        await sched.publish_many(ms.TaskSpec(key=f"job:{n}", name="job") for n in range(tasks))
        await client.close()

    anyio.run(main)


def insert_in_batches(collection: Any, documents: Iterable[dict[str, Any]]) -> None:
    """``insert_many`` 200 at a time: the wire engine drops the connection of one insert of
    5,000, and on a loaded machine one of 1,000 outlasts the client's heartbeat, whose
    timeout cancels it."""
    batch: list[dict[str, Any]] = []
    for document in documents:
        batch.append(document)
        if len(batch) == 200:
            collection.insert_many(batch)
            batch = []
    if batch:
        collection.insert_many(batch)


def publish_loop(uri: str, db: str, tasks: int) -> None:
    from pymongo import MongoClient

    with MongoClient(uri) as client:
        collection = client[db]["jobs"]
        collection.create_index([("state", 1), ("_id", 1)])
        insert_in_batches(collection, ({"state": "pending", "n": n} for n in range(tasks)))


def publish_celery(uri: str, db: str, tasks: int) -> None:
    app = celery_app(uri, db)
    with app.producer_or_acquire() as producer:
        for _ in range(tasks):
            app.send_task("noop", producer=producer)


def publish_dramatiq(uri: str, db: str, tasks: int) -> None:
    from dramatiq import Message

    broker = _dramatiq_broker(uri, db)
    for _ in range(tasks):
        broker.enqueue(
            Message(queue_name="default", actor_name="noop", args=(), kwargs={}, options={})
        )
    broker.close()


def publish_taskiq(uri: str, db: str, tasks: int) -> None:
    broker = _taskiq_broker(uri, db)

    @broker.task(task_name="noop")
    async def noop() -> None:
        return None

    async def main() -> None:
        await broker.startup()
        for _ in range(tasks):
            await noop.kiq()
        await broker.shutdown()

    asyncio.run(main())


class System(NamedTuple):
    name: str
    modules: tuple[str, ...]  # what it needs installed
    publish: Callable[[str, str, int], None]
    child: Callable[[Child], None]


SYSTEMS = [
    System("mscheduler", (), publish_mscheduler, child_mscheduler),
    System("find_one_and_update loop", (), publish_loop, child_loop),
    System("Celery, kombu MongoDB transport", ("celery", "kombu"), publish_celery, child_celery),
    System(
        "Dramatiq, dramatiq-mongodb",
        ("dramatiq", "dramatiq_mongodb"),
        publish_dramatiq,
        child_dramatiq,
    ),
    System("taskiq, taskiq-mongodb", ("taskiq", "taskiq_mongodb"), publish_taskiq, child_taskiq),
]


class Run(NamedTuple):
    tasks_per_s: float
    complete: bool
    commands: float  # per task, and so on
    command_bytes: float
    server_ms: float
    worker_ms: float
    load: float
    by_command: dict[str, float]  # commands of each name, and their bytes, per task
    extra: dict[str, int]  # the system's own counts, summed over its processes


def wait_idle(pid: int, limit: float = 180.0) -> None:
    """Until the server has stopped working (under 5 % of a core over half a second): what a
    run left queued, or the drop after it, is not counted to the next run, and a server still
    busy with it does not time the next run's connections out."""
    ends = time.perf_counter() + limit
    while time.perf_counter() < ends:
        before = cpu_seconds(pid)
        time.sleep(0.5)
        if cpu_seconds(pid) - before < 0.025:
            return


def run_once(
    system: System, server: WireServer, tasks: int, processes: int, deadline: float
) -> Run:
    from pymongo import MongoClient

    db = f"cost_{uuid.uuid4().hex[:8]}"
    wait_idle(server.process.pid)
    system.publish(server.uri, db, tasks)
    context = mp.get_context("spawn")
    done = context.Value("q", 0)
    ready, results = context.Queue(), context.Queue()
    go, stop = context.Event(), context.Event()
    child = Child(server.uri, db, tasks, done, ready, go, stop, results)
    workers = [context.Process(target=system.child, args=(child,)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    pids = [ready.get(timeout=120) for _ in workers]
    wait_idle(server.process.pid)
    server_cpu = cpu_seconds(server.process.pid)
    worker_cpu = sum(cpu_seconds(pid) for pid in pids)
    started = time.perf_counter()
    go.set()
    while done.value < tasks and time.perf_counter() - started < deadline:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    worker_cpu = sum(cpu_seconds(pid) for pid in pids) - worker_cpu
    finished = done.value
    load = os.getloadavg()[0]
    stop.set()
    counts = [results.get(timeout=30) for _ in workers]
    for worker in workers:
        worker.join(10)
        if worker.is_alive():
            worker.kill()
            worker.join()
    # Until the server is idle again: work the workers left queued (a system that floods the
    # server past the deadline) is still theirs.
    wait_idle(server.process.pid)
    server_cpu = cpu_seconds(server.process.pid) - server_cpu
    with MongoClient(server.uri) as client:
        client.drop_database(db)
    per = max(finished, 1)
    encoding = sum(c[2] for c in counts)
    return Run(
        tasks_per_s=finished / elapsed,
        complete=finished >= tasks,
        commands=sum(c[0] for c in counts) / per,
        command_bytes=sum(c[1] for c in counts) / per,
        server_ms=server_cpu * 1000 / per,
        worker_ms=(worker_cpu - encoding) * 1000 / per,
        load=load,
        by_command={
            name: sum(c[3].get(name, 0) for c in counts) / per
            for name in sorted({name for c in counts for name in c[3]})
        },
        extra={name: sum(c[4].get(name, 0) for c in counts) for c in counts for name in c[4]},
    )


def installed(system: System) -> str | None:
    """Why a system cannot run here, or None."""
    import importlib

    for module in system.modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[bench-peers-server]')"
    return None


def docs_examined_per_claim() -> float:
    """memory://: documents examined per task by batched claims of 16 over 3,000 pending."""
    import anyio

    import mscheduler as ms
    from mscheduler.backends.memory import memory_server

    async def main() -> float:
        collection = memory_server("").collection("db", uuid.uuid4().hex, notablescan=True)
        sched = ms.Scheduler(collection)
        await sched.publish_many(ms.TaskSpec(key=f"job:{n}", name="job") for n in range(3_000))
        before, claimed = collection.docs_examined, 0
        for _ in range(10):
            claimed += len(await sched.store.tasks.claim_many("w1", names=["job"], limit=16))
        return (collection.docs_examined - before) / claimed

    return anyio.run(main)


def row(name: str, runs: list[Run]) -> str:
    median = sorted(runs, key=lambda run: run.tasks_per_s)[len(runs) // 2]
    mark = "" if all(run.complete for run in runs) else "*"
    rates = "/".join(f"{run.tasks_per_s:.0f}" for run in runs)
    return (
        f"| {name} | {median.tasks_per_s:.0f}{mark} ({rates}) | {median.commands:.2f} | "
        f"{median.command_bytes:,.0f} | {median.server_ms:.1f} | {median.worker_ms:.2f} | "
        f"{statistics.median(run.load for run in runs):.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="1000", help="backlogs drained, comma-separated")
    parser.add_argument("--processes", default="1,3", help="worker processes (x 16 each)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each system (median)")
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds per run at most")
    parser.add_argument(
        "--by-command", action="store_true", help="also each system's commands by name"
    )
    parser.add_argument("--only", default="", help="comma-separated name prefixes to run")
    parser.add_argument(
        "--profile", default=None, help="run the server under cProfile, its statistics to this file"
    )
    args = parser.parse_args()
    chosen = [
        s
        for s in SYSTEMS
        if not args.only or any(s.name.startswith(p) for p in args.only.split(","))
    ]
    runnable = []
    for system in chosen:
        why = installed(system)
        if why is None:
            runnable.append(system)
        else:
            print(f"{system.name}: skipped: {why}", flush=True)
    server = WireServer(args.profile)
    print(
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} with "
        f"{os.cpu_count() or 1} cores, Python {platform.python_version()}, wire engine "
        f"(mongoeco) on port {server.port}; {args.rounds} rounds, systems alternating; rate: "
        f"median (each round); * stopped at the {args.deadline:.0f} s deadline\n",
        flush=True,
    )
    try:
        for tasks in (int(n) for n in args.tasks.split(",")):
            for processes in (int(n) for n in args.processes.split(",")):
                runs: dict[str, list[Run]] = {system.name: [] for system in runnable}
                failed: dict[str, str] = {}
                for _ in range(args.rounds):
                    for system in runnable:
                        if system.name in failed:
                            continue
                        try:
                            runs[system.name].append(
                                run_once(system, server, tasks, processes, args.deadline)
                            )
                        except Exception as error:  # a peer that cannot run here: said, and skipped
                            logging.exception("%s did not run", system.name)
                            failed[system.name] = f"{type(error).__name__}: {error}"
                print(
                    f"| {processes} process(es) x 16, {tasks:,} tasks | tasks/s | commands/task | "
                    "command bytes/task | server CPU ms/task | worker CPU ms/task | load (1 min) |"
                )
                print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
                for name, measured in runs.items():
                    if name in failed and not measured:
                        print(f"| {name} | did not run: {failed[name][:120]} | | | | | |")
                    elif measured:
                        print(row(name, measured))
                lost = [
                    f"{run.extra['lost reads']} of {run.extra['claim reads']}"
                    for run in runs.get(SYSTEMS[0].name, [])
                    if "claim reads" in run.extra
                ]
                if lost:
                    print(f"\nmscheduler's candidate reads that won nothing: {', '.join(lost)}")
                if args.by_command:
                    for name, measured in runs.items():
                        if measured:
                            median = sorted(measured, key=lambda run: run.tasks_per_s)[
                                len(measured) // 2
                            ]
                            shown = {k: round(v, 3) for k, v in median.by_command.items()}
                            print(f"{name}, per task: {shown}")
                print(flush=True)
    finally:
        server.stop()
    with contextlib.suppress(Exception):
        print(
            f"memory:// documents examined per claimed task (batches of 16, 3,000 pending): "
            f"{docs_examined_per_claim():.2f}"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
