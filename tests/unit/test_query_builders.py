"""Every query builder, walked: its operators stay in the declared vocabulary, and both engines
evaluate it alike.

`built_queries` calls every public function of the four builder modules with sample arguments
chosen by parameter name; a new builder with a parameter that has no sample fails here, so no
builder escapes. The differential test seeds memory and the wire engine with the same task
documents (made by the real store), sends each builder's filter or update to both, and
compares the outcome field by field.
"""

from __future__ import annotations

import datetime as dt
import inspect
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from bson import ObjectId

import mscheduler as ms
from mscheduler import constants as c
from mscheduler.backends.memory import memory_server
from mscheduler.models import ErrorInfo, Progress, TaskState
from mscheduler.queries import browse, derived, limits, retry_delay, schedules, stages, timing
from mscheduler.queries import flows as flow_queries
from mscheduler.queries import lease as lease_queries
from mscheduler.queries import partitions as partition_queries
from mscheduler.queries import tasks as queries
from mscheduler.testing import ManualClock
from tests.engines import WIRE_DATABASE, WireServer

pytestmark = pytest.mark.anyio
BUILDER_MODULES: tuple[ModuleType, ...] = (
    queries,
    lease_queries,
    flow_queries,
    stages,
    derived,
    limits,
    schedules,
    timing,
    browse,
    retry_delay,
    partition_queries,
)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NOW = T0 + dt.timedelta(seconds=90)  # after the seed: some leases live, some expired

# A sample argument per parameter name (the seed below has tasks with these keys and workers).
SAMPLES: dict[str, Any] = {
    "key": "running-1",
    "keys": ["pending", "running-1", "dep"],
    "names": ["job"],
    "name": "job",
    "state": "pending",
    "states": ["success", "fail"],
    "worker_id": "w1",
    "worker_ids": ["w1", "w2"],
    "run_id": "run-of-w1",
    "now": NOW,
    "delay_s": 5.0,
    "spread": 0.5,
    "finished_before": NOW,
    "retry_at": NOW + dt.timedelta(seconds=30),
    "version": 2,
    "payload": {"new": True},
    "result": {"ok": 1},
    "reason": "a reason",
    "error": ErrorInfo.from_message("RuntimeError", "broken"),
    "options": ms.TaskOptions(priority=3, concurrent_worker_cnt=2),
    "outcome": TaskState.FAIL,
    "before": "dep",
    "still_pending": True,
    "count": 3,
    "listed": 20,
    "kinds": ["success"],
    "field": "result",
    "cond": {"$eq": ["$$ws.state", "running"]},
    "when": {"$eq": ["$$ws.state", "running"]},
    "then": "$$ws",
    "running": 1,
    "value": "$not.a.path",
    "next_claim_at": "$retry_at",
    "progress": Progress(fraction=0.5, message="half way"),
    "token": "token-1",
    "tokens": ["token-1"],
    "untils": {"token-1": NOW + dt.timedelta(seconds=60)},
    "leases": {"token-1": NOW + dt.timedelta(seconds=30)},
    "until": NOW + dt.timedelta(seconds=60),
    "rate": 10,
    "per_ms": 60_000,
    "hold_ms": 10_000,
    "max_running": 2,
    "limit": "rate",
    "schedule_id": "nightly",
    "handled": NOW,
    "next_at": NOW + dt.timedelta(seconds=60),
    "last_key": "nightly@20260101T000000Z",
    "not_before": NOW + dt.timedelta(seconds=5),
    "task_id": ObjectId("65a000000000000000000001"),
    "task_ids": [ObjectId("65a000000000000000000001")],
    "run_ids": ["run-of-w1", "run-of-nobody"],
    "claim": queries.claim_filter("w1", NOW, names=["job"]),
    "prefix": "running-",
    "after_key": "running-1",
    "after_position": (0, T0, ObjectId("000000000000000000000000")),
    "after_id": ObjectId("ffffffffffffffffffffffff"),
    "after_name": "job",
    "since": T0,
    "partition": "tenant-7",
    "priority": 0,
    "head": T0,
    "turn": T0,
    "partitions": {"token-1": "tenant-7"},
    "partition_max_running": 1,
}
_NEW = queries.new_task_document(
    key="pending",
    name="job",
    payload={"n": 1},
    options=ms.TaskOptions(),
    now=T0,
    task_id=ObjectId("65a0000000000000000000fe"),
)
SAMPLES["document"] = _NEW
SAMPLES["lease_task"] = ms.Task.model_validate(_NEW)
# Builders whose arguments are a whole document rather than samples by name.
SPECIAL: dict[str, Any] = {
    "tasks.new_task_document": lambda: queries.new_task_document(
        key="new", name="job", payload={"n": 1}, options=ms.TaskOptions(), now=NOW, task_id=None
    ),
    "tasks.publish_upsert": lambda: queries.publish_upsert(
        queries.new_task_document(
            key="new",
            name="job",
            payload={"n": 1},
            options=ms.TaskOptions(),
            now=NOW,
            task_id=ObjectId("65a0000000000000000000ff"),
        )
    ),
    "stages.rebuilt_state": lambda: stages.rebuilt_state(state="released"),
    # Not queries: the turns read back, and a new document placed at its turn (a copy).
    "partitions.first_of": lambda: partition_queries.first_of({"next_turn": NOW}, 3),
    "partitions.placed": lambda: partition_queries.placed(dict(_NEW), NOW),
    # On the seed's running task of one state (the fence is `lease_filter`'s, and more).
    "lease.quick_success": lambda: (
        {"key": "running-1"},
        lease_queries.quick_success({"ok": 1}, NOW),
    ),
    # Its update, on the seed's task of the same key (its filter is by the _id read).
    "tasks.quick_claim": lambda: (
        {"key": "pending"},
        queries.quick_claim(_NEW, "w1", "run-of-w1", NOW)[1],
    ),
}


def built_queries() -> Iterator[tuple[str, Any]]:
    for module in BUILDER_MODULES:
        short = module.__name__.rsplit(".", 1)[-1]
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or function.__module__ != module.__name__:
                continue
            qualified = f"{short}.{name}"
            if qualified in SPECIAL:
                yield qualified, SPECIAL[qualified]()
                continue
            args: list[Any] = []
            kwargs: dict[str, Any] = {}
            for parameter in inspect.signature(function).parameters.values():
                if parameter.kind is parameter.VAR_POSITIONAL:
                    args.extend(["success", "fail"])
                    continue
                if parameter.kind is parameter.VAR_KEYWORD:
                    continue
                if parameter.name not in SAMPLES:
                    if parameter.default is not parameter.empty:
                        continue
                    raise AssertionError(f"{qualified}: add a sample for {parameter.name!r}")
                if parameter.kind is parameter.KEYWORD_ONLY:
                    kwargs[parameter.name] = SAMPLES[parameter.name]
                else:
                    args.append(SAMPLES[parameter.name])
            yield qualified, function(*args, **kwargs)


BUILT = dict(built_queries())


def operators_in(value: Any) -> set[str]:
    """Every ``$name`` used as a key (an operator or stage); ``$literal`` data is not walked."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if isinstance(key, str) and key.startswith("$"):
                found.add(key)
                if key == "$literal":
                    continue
            found |= operators_in(inner)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            found |= operators_in(inner)
    return found


def test_every_builder_is_walked():
    assert len(BUILT) >= 40, sorted(BUILT)
    assert "derived.recompute" in BUILT and "lease.lease_filter" in BUILT


@pytest.mark.parametrize("builder", sorted(BUILT))
def test_builder_uses_only_the_declared_vocabulary(builder: str):
    outside = operators_in(BUILT[builder]) - c.OPERATORS
    assert not outside, f"{builder} uses {sorted(outside)}, outside constants.OPERATORS"


def test_the_vocabulary_lists_nothing_unused():
    used = set().union(*(operators_in(value) for value in BUILT.values()))
    assert c.OPERATORS - used == set(), "listed in constants.OPERATORS but used by no builder"


# ---------------------------------------------------------------- the same on both engines


async def seed_documents() -> list[dict[str, Any]]:
    """Task documents in every state the store makes, written by the real store."""
    clock = ManualClock(T0)
    sched = ms.Scheduler(memory_server("").collection("seed", uuid.uuid4().hex), clock=clock)
    fast = ms.TaskOptions(ping_interval_ms=10_000, worker_timeout_ms=60_000)
    await sched.publish("pending", {"n": 1}, name="job")
    await sched.publish("later", None, name="job", options=ms.TaskOptions(not_before=NOW))
    await sched.publish("other-name", None, name="sms")
    await sched.publish(
        "pinned", None, name="job", options=ms.TaskOptions(specific_worker_ids=["w9"])
    )
    await sched.publish("dep", None, name="job")
    await sched.publish("blocked", None, name="job", depends_on=["dep"])
    two = fast.model_copy(update={"concurrent_worker_cnt": 2})
    await sched.publish("running-2", None, name="job", options=two)
    for key, options in [
        ("running-1", fast),
        ("expired", fast),
        ("succeeded", fast),
        ("failed", fast.model_copy(update={"max_unexpected_retries": 0})),
    ]:
        await sched.publish(key, {"k": key}, name="job", options=options)
    leases = {
        key: await sched.store.tasks.claim("w1", key=key)
        for key in ("expired", "succeeded", "failed")
    }
    clock.advance(40)
    leases["running-1"] = await sched.store.tasks.claim("w1", key="running-1")
    leases["running-2a"] = await sched.store.tasks.claim("w1", key="running-2")
    clock.advance(5)
    leases["running-2b"] = await sched.store.tasks.claim("w2", key="running-2")
    for key, lease in leases.items():
        assert lease is not None, key
    await sched.store.tasks.succeed(leases["succeeded"], {"done": True})
    await sched.store.tasks.fail(leases["failed"], RuntimeError("broken"))
    await sched.cancel("dep")  # "blocked" is cancelled with it
    await sched.publish("dep2", None, name="job")
    await sched.publish("blocked2", None, name="job", depends_on=["dep2"])
    # The run id the samples fence on is the real one of w1 on running-1.
    SAMPLES["run_id"] = leases["running-1"].run_id  # type: ignore[union-attr]
    documents = [document async for document in sched.collection.find({})]
    documents.append(_long_history(documents, "long-history"))
    return documents


def _long_history(documents: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """A task written before the history was bounded: 30 ended states (every third a failure),
    no ``dropped_*`` fields. Any write trims it (`stages.trim_history`), on every engine."""
    template = next(doc for doc in documents if doc["key"] == "pending")
    ended = []
    for n in range(30):
        state = "fail" if n % 3 == 0 else "released"
        ended.append(
            {
                "worker_id": f"w{n % 4}",
                "run_id": f"run-{n:02d}",
                "state": state,
                "started_at": T0 + dt.timedelta(seconds=n),
                "ping_expire_at": None,
                "finished_at": T0 + dt.timedelta(seconds=n, milliseconds=500),
                "error": {"type": "E", "message": f"attempt {n}", "traceback": ""},
                "result": None,
            }
        )
    document = {k: v for k, v in template.items() if not k.startswith("dropped_")}
    document.update({"_id": ObjectId(), "key": key, "worker_states": ended})
    return document


def normalized(value: Any) -> Any:
    """Dates as aware UTC to the millisecond (BSON's precision); everything else as is."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return aware.replace(microsecond=aware.microsecond // 1000 * 1000)
    if isinstance(value, dict):
        return {key: normalized(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [normalized(inner) for inner in value]
    return value


def differences(path: str, left: Any, right: Any) -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        for key in sorted(set(left) | set(right)):
            found += differences(
                f"{path}.{key}", left.get(key, "<missing>"), right.get(key, "<missing>")
            )
        return found
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [
            d
            for n, (a, b) in enumerate(zip(left, right, strict=True))
            for d in differences(f"{path}[{n}]", a, b)
        ]
    return [] if left == right else [f"{path}: memory {left!r} != wire {right!r}"]


def as_probe(builder: str, built: Any) -> tuple[str, Any]:
    """What to send for a builder's output: ("find", filter), ("update", (filter, update)),
    ("aggregate", pipeline)."""
    if builder in ("tasks.stats_pipeline", "tasks.held_by_worker_pipeline"):
        return "aggregate", built
    # Expressions whose top level ($or) is a filter's too.
    if builder in ("derived.wakes_consumers", "stages.tries_left"):
        return "update", ({}, [{"$set": {"probe": built}}])
    if isinstance(built, tuple):
        return "update", built
    if isinstance(built, list):
        return "update", ({}, built)
    # An expression is operators alone; a filter may use some of them (``$and``) beside fields.
    if isinstance(built, dict) and set(built) < {
        "$set",
        "$filter",
        "$size",
        "$cond",
        "$let",
        "$and",
        "$in",
        "$add",
        "$eq",
        "$literal",
        "$map",
        "$arrayElemAt",
        "$ifNull",
        "$max",
        "$gt",
        "$lte",
    }:
        if "$set" in built:  # a stage
            return "update", ({}, [built])
        expression = built
        if "$$ws" in repr(built):
            expression = stages.count_states(built) if "$$ws." in repr(built) else built
        return "update", ({}, [{"$set": {"probe": expression}}])
    if (  # a whole new document (a filter by _id and key has operators at its top level)
        isinstance(built, dict)
        and "_id" in built
        and "key" in built
        and not any(field.startswith("$") for field in built)
    ):
        return "insert", built
    if isinstance(built, dict):
        return "find", built
    return "skip", built


async def outcome(collection: Any, probe: tuple[str, Any], seed: list[dict[str, Any]]) -> Any:
    for document in seed:
        await collection.insert_one(dict(document))
    kind, sent = probe
    if kind == "find":
        return sorted([document["key"] async for document in collection.find(sent)])
    if kind == "aggregate":
        cursor = await collection.aggregate(sent)
        rows = [row async for row in cursor]
        return sorted(rows, key=lambda row: repr(row["_id"]))
    if kind == "insert":
        await collection.insert_one(dict(sent))
    else:
        query, update = sent
        await collection.update_many(query, update, upsert=False)
    return {document["key"]: document async for document in collection.find({}, {"_id": 0})}


@pytest.mark.parametrize("builder", sorted(BUILT))
async def test_both_engines_agree(builder: str, wire_server: WireServer):
    from pymongo import AsyncMongoClient

    seed = await seed_documents()
    probe = as_probe(builder, BUILT[builder])
    if probe[0] == "skip":
        pytest.skip(f"{builder} builds no filter, update or pipeline: {probe[1]!r}")
    memory = memory_server("").collection("differential", uuid.uuid4().hex)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(wire_server.uri, tz_aware=True)
    wire = client[WIRE_DATABASE][f"diff_{uuid.uuid4().hex[:16]}"]
    try:
        on_memory = normalized(await outcome(memory, probe, seed))
        on_wire = normalized(await outcome(wire, probe, seed))
    finally:
        await wire.drop()
        await client.close()
    assert not differences(builder, on_memory, on_wire), differences(builder, on_memory, on_wire)


@pytest.mark.parametrize("builder", sorted(BUILT))
async def test_fast_evaluation_agrees_with_mongomock_general_path(
    builder: str, monkeypatch: pytest.MonkeyPatch
):
    """The memory engine dispatches operators and reads ``$$`` variables its own way
    (`fast_paths`): on every builder's real filter, update or pipeline, over the seed, the
    outcome is the one its copy of mongomock's own evaluator gives."""
    from mscheduler.backends.memory import engine

    seed = await seed_documents()
    probe = as_probe(builder, BUILT[builder])
    if probe[0] == "skip":
        pytest.skip(f"{builder} builds no filter, update or pipeline: {probe[1]!r}")
    fast = normalized(
        await outcome(memory_server("").collection("fast", uuid.uuid4().hex), probe, seed)
    )
    general = engine.aggregate._Parser.parse.__wrapped__  # mongomock's, before `fast_paths`
    monkeypatch.setattr(engine.aggregate._Parser, "parse", general)
    slow = normalized(
        await outcome(memory_server("").collection("general", uuid.uuid4().hex), probe, seed)
    )
    assert not differences(builder, fast, slow), differences(builder, fast, slow)
