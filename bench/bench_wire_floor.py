"""The least a task can cost the wire engine, by the shape of its statements. Prints numbers.

    python bench/bench_wire_floor.py                 # 1,000 tasks, 3 rounds
    python bench/bench_wire_floor.py --tasks 5000 --rounds 1

`bench_server_cost.py` compares whole systems; this script isolates what their statements
cost the server, whatever the worker does around them. One client, one statement at a time
(no concurrency, so no lost race and no queueing), drains a backlog of N tasks from a fresh
wire-engine server (mongoeco's, as the tests run it) for each shape below, the shapes
alternating in each round; the server process's CPU (user + system, ``/proc/PID/stat``)
from the first read to the last write, divided by N. Publishing is not counted.

- ``Celery``: kombu's MongoDB transport as it claims (``Channel._get``): one
  ``find_one_and_delete`` by queue, sorted by priority, on its index
  ``(queue, priority, _id)``; a message of its size. Delivery is at most once: a message is
  deleted when it is fetched, so a worker that dies loses it.
- ``least lease, deleted``: the least a queue that keeps a task until it is done can send:
  a sorted read of 16 candidates on a claim index ``(name, state, priority, created_at,
  _id)``, one bulk of 16 compare-and-set claims by ``_id`` (state, lease: worker, run id,
  expiry), then the finish, one bulk of 16 deletes fenced by ``_id`` and run id. Seven
  fields, one index besides ``_id``: no key, no result kept.
- ``least lease, kept``: the same with the finish an update (state, result, finish time,
  the lease cleared), and a unique key (publishing twice makes one task): what a queue
  whose tasks can be looked up after they ran must send at least.
- ``mscheduler``: our statements as the consumer sends them in the common case: the batched
  claim's candidate read (`queries.tasks.candidate_filter`, `CLAIM_SORT`), its quick claims
  (`quick_claim`) and the quick successes (`queries.lease.quick_success_filter`), on
  documents and indexes as `Scheduler.publish_many` and `ensure_indexes` make them.

With ``--what-if``, two more shapes measure what a plain task pays for features it does not
use (the same statements, drained the same way; publishing is not counted):

- ``mscheduler, a plain task's indexes``: every index dropped but ``key_unique`` and
  ``claim_order_v2`` (what the common case's statements use), so each write maintains two
  indexes besides ``_id`` instead of eight;
- ``mscheduler, a plain task's fields``: every field no statement of the common case reads
  or needs (``not_before``, ``retry_at``, the flows', the finish's, ``progress``,
  ``trace_context``, ``wakes``, the options left at null) removed after publishing, as if
  absent until used.

The last line is the ceiling it implies: at what server CPU per task a drain runs at 1.5 x
Celery's rate on the same server, when the server is what bounds both.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_server_cost import WireServer, cpu_seconds, insert_in_batches, wait_idle  # noqa: E402
from pymongo import DeleteOne, MongoClient, UpdateOne  # noqa: E402
from pymongo.collection import Collection  # noqa: E402

from mscheduler.models import new_run_id  # noqa: E402

BATCH = 16
WORKER = "bench-floor-worker"
_CELERY_BODY = "x" * 1_000  # kombu stores the message as one JSON string: about this long


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Meter:
    """The server's CPU spent in each phase of a drain: the read of candidates, the claims,
    the finishes (Celery's one command is its claim)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.spent = {"read": 0.0, "claim": 0.0, "finish": 0.0}
        self._at = cpu_seconds(pid)

    def lap(self, phase: str) -> None:
        now = cpu_seconds(self.pid)
        self.spent[phase] += now - self._at
        self._at = now


class Shape(NamedTuple):
    name: str
    publish: Callable[[Collection[Any], int], None]
    drain: Callable[[Collection[Any], Meter], int]  # the commands it sent


# --- Celery: one find_one_and_delete a task -----------------------------------------------


def publish_celery(tasks: Collection[Any], n: int) -> None:
    tasks.create_index([("queue", 1), ("priority", 1), ("_id", 1)])
    message = {"payload": _CELERY_BODY, "queue": "celery", "priority": 9}
    insert_in_batches(tasks, (dict(message) for _ in range(n)))


def drain_celery(tasks: Collection[Any], meter: Meter) -> int:
    commands = 0
    while True:
        commands += 1
        message = tasks.find_one_and_delete({"queue": "celery"}, sort=[("priority", 1)])
        meter.lap("claim")
        if message is None:
            return commands


# --- the least lease: a batched read, compare-and-set claims, a fenced finish --------------


def _least_publish(kept: bool) -> Callable[[Collection[Any], int], None]:
    def publish(tasks: Collection[Any], n: int) -> None:
        order = [("name", 1), ("state", 1), ("priority", -1), ("created_at", 1), ("_id", 1)]
        tasks.create_index(order)
        if kept:
            tasks.create_index([("key", 1)], unique=True)
        now = _now()
        documents = (
            {
                **({"key": f"job:{i}"} if kept else {}),
                "name": "job",
                "state": "pending",
                "priority": 0,
                "created_at": now,
                "next_at": now,
                "payload": None,
                "lease": None,
            }
            for i in range(n)
        )
        insert_in_batches(tasks, documents)

    return publish


def _least_drain(kept: bool) -> Callable[[Collection[Any], Meter], int]:
    def drain(tasks: Collection[Any], meter: Meter) -> int:
        commands = 0
        while True:
            now = _now()
            commands += 1
            candidates = list(
                tasks.find(
                    {"name": "job", "state": "pending", "next_at": {"$lte": now}},
                    sort=[("priority", -1), ("created_at", 1), ("_id", 1)],
                    limit=BATCH,
                )
            )
            meter.lap("read")
            if not candidates:
                return commands
            runs = [new_run_id() for _ in candidates]
            expires = now + dt.timedelta(minutes=1)
            claims = [
                UpdateOne(
                    {"_id": task["_id"], "state": "pending", "lease": None},
                    {
                        "$set": {
                            "state": "running",
                            "lease": {"worker": WORKER, "run_id": run, "expires_at": expires},
                            "next_at": expires,
                        }
                    },
                )
                for task, run in zip(candidates, runs, strict=True)
            ]
            tasks.bulk_write(claims, ordered=False)
            meter.lap("claim")
            finishes: list[Any]
            if kept:
                finishes = [
                    UpdateOne(
                        {"key": task["key"], "lease.run_id": run},
                        {
                            "$set": {
                                "state": "success",
                                "result": None,
                                "finished_at": now,
                                "lease": None,
                                "next_at": None,
                            }
                        },
                    )
                    for task, run in zip(candidates, runs, strict=True)
                ]
            else:
                finishes = [
                    DeleteOne({"_id": task["_id"], "lease.run_id": run})
                    for task, run in zip(candidates, runs, strict=True)
                ]
            tasks.bulk_write(finishes, ordered=False)
            meter.lap("finish")
            commands += 2

    return drain


# --- mscheduler: the consumer's statements in the common case ------------------------------


def publish_mscheduler(tasks: Collection[Any], n: int) -> None:
    import mscheduler as ms

    with ms.SyncScheduler(tasks) as scheduler:
        for start in range(0, n, 200):  # a loaded wire engine cancels one transaction of 1,000
            scheduler.publish_many(
                ms.TaskSpec(key=f"job:{i}", name="job") for i in range(start, min(start + 200, n))
            )


def drain_mscheduler(tasks: Collection[Any], meter: Meter) -> int:
    from mscheduler.queries import lease as lq
    from mscheduler.queries import tasks as q

    commands = 0
    while True:
        now = _now()
        commands += 1
        wanted = q.candidate_filter(WORKER, now, names=["job"])
        candidates = list(tasks.find(wanted, sort=q.CLAIM_SORT, limit=BATCH))
        meter.lap("read")
        if not candidates:
            return commands
        runs = [new_run_id() for _ in candidates]
        claims = []
        for task, run in zip(candidates, runs, strict=True):
            assert q.quick_claimable(task), "the bench's tasks are the common case"
            query, update, _after = q.quick_claim(task, WORKER, run, now)
            claims.append(UpdateOne(query, update))
        tasks.bulk_write(claims, ordered=False)
        meter.lap("claim")
        finished = _now()
        successes = [
            UpdateOne(
                lq.quick_success_filter(task["key"], WORKER, run, finished),
                lq.quick_success(None, finished),
            )
            for task, run in zip(candidates, runs, strict=True)
        ]
        tasks.bulk_write(successes, ordered=False)
        meter.lap("finish")
        commands += 2


# What a plain task's statements never read: fields a feature writes, null or empty until it
# is used (what-if shapes only).
_UNUSED_FIELDS = (
    "not_before",
    "retry_at",
    "depends_on",
    "deps_failed",
    "dependents_notified",
    "finished_at",
    "settled_at",
    "wakes",
    "progress",
    "trace_context",
    "result",
    "error",
    "options.timeout_ms",
    "options.max_tries",
    "options.expires_at",
)
_PLAIN_INDEXES = ("_id_", "key_unique", "claim_order_v2")


def publish_plain_indexes(tasks: Collection[Any], n: int) -> None:
    publish_mscheduler(tasks, n)
    for name in tasks.index_information():
        if name not in _PLAIN_INDEXES:
            tasks.drop_index(name)


def publish_plain_fields(tasks: Collection[Any], n: int) -> None:
    publish_mscheduler(tasks, n)
    tasks.update_many({}, {"$unset": dict.fromkeys(_UNUSED_FIELDS, "")})


SHAPES = (
    Shape("Celery (kombu), at most once", publish_celery, drain_celery),
    Shape("least lease, deleted", _least_publish(kept=False), _least_drain(kept=False)),
    Shape("least lease, kept", _least_publish(kept=True), _least_drain(kept=True)),
    Shape("mscheduler", publish_mscheduler, drain_mscheduler),
)
WHAT_IF = (
    Shape("mscheduler, a plain task's indexes", publish_plain_indexes, drain_mscheduler),
    Shape("mscheduler, a plain task's fields", publish_plain_fields, drain_mscheduler),
)


class Run(NamedTuple):
    server_ms: float  # per task
    commands: float  # per task
    phases: dict[str, float]  # server ms per task in each phase


def run_once(shape: Shape, server: WireServer, n: int) -> Run:
    # A loaded machine slows the one-process server past the monitor's default timeout, which
    # would cancel the operation in flight.
    client: MongoClient[dict[str, Any]] = MongoClient(server.uri, connectTimeoutMS=120_000)
    try:
        db = client[f"floor_{uuid.uuid4().hex[:8]}"]
        tasks = db["tasks"]
        shape.publish(tasks, n)
        wait_idle(server.process.pid)
        before = cpu_seconds(server.process.pid)
        meter = Meter(server.process.pid)
        commands = shape.drain(tasks, meter)
        spent = cpu_seconds(server.process.pid) - before
        left = tasks.count_documents({"state": {"$in": ["pending", "running"]}})
        if left:
            raise RuntimeError(f"{shape.name} left {left} tasks undrained")
        client.drop_database(db.name)
        phases = {phase: 1000 * seconds / n for phase, seconds in meter.spent.items()}
        return Run(1000 * spent / n, commands / n, phases)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=1_000, help="backlog drained")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each shape (median)")
    parser.add_argument(
        "--what-if", action="store_true", help="also mscheduler with a plain task's indexes, fields"
    )
    args = parser.parse_args()
    shapes = SHAPES + WHAT_IF if args.what_if else SHAPES
    server = WireServer()
    runs: dict[str, list[Run]] = {shape.name: [] for shape in shapes}
    try:
        for _ in range(args.rounds):
            for shape in shapes:
                runs[shape.name].append(run_once(shape, server, args.tasks))
    finally:
        server.stop()
    load = os.getloadavg()[0]
    print(
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()} with "
        f"{os.cpu_count()} cores, wire engine (mongoeco); {args.tasks:,} tasks, one client, "
        f"{args.rounds} rounds, shapes alternating; load (1 min) {load:.1f}\n"
    )
    print(
        "| statements | commands/task | server CPU ms/task (median) | each round | x Celery's "
        "| x the kept lease's | read | claim | finish |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    celery = statistics.median(run.server_ms for run in runs[SHAPES[0].name])
    kept = statistics.median(run.server_ms for run in runs[SHAPES[2].name])
    for shape in shapes:
        shape_runs = runs[shape.name]
        median = statistics.median(run.server_ms for run in shape_runs)
        each = ", ".join(f"{run.server_ms:.2f}" for run in shape_runs)
        commands = statistics.median(run.commands for run in shape_runs)
        phases = " | ".join(
            f"{statistics.median(run.phases[phase] for run in shape_runs):.2f}"
            for phase in ("read", "claim", "finish")
        )
        print(
            f"| {shape.name} | {commands:.2f} | {median:.2f} | {each} | {median / celery:.2f} "
            f"| {median / kept:.2f} | {phases} |"
        )
    print(
        f"\n1.5 x Celery's rate on a server that bounds both: at most {celery / 1.5:.2f} "
        "server CPU ms per task."
    )


if __name__ == "__main__":
    main()
