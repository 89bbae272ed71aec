"""Every public entry point, given bad input: a clear error naming the problem, nothing written.

One table; each row runs against a collection holding one task and checks that the documents
are exactly as before."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import ValidationError
from pymongo import MongoClient

import mscheduler as ms
from mscheduler.errors import (
    ConfigurationError,
    DependencyError,
    PayloadError,
    PreconditionFailed,
    TaskNotFound,
    TaskRunning,
)

pytestmark = pytest.mark.anyio

Call = Callable[[ms.Scheduler], Awaitable[Any]]


async def _sync(fn: Callable[[], Any]) -> Any:
    return fn()


def _spec(key: str, **fields: Any) -> ms.TaskSpec:
    return ms.TaskSpec(key=key, name="job", **fields)


async def _stale_commit(sched: ms.Scheduler) -> Any:
    lease = await sched.store.tasks.claim("w", key="existing")
    assert lease is not None
    return await sched.commit(complete=[lease], require={"existing": 0})


async def _unstorable_result(sched: ms.Scheduler) -> Any:
    lease = await sched.store.tasks.claim("w", key="existing")
    assert lease is not None
    return await sched.commit(complete=[(lease, {1, 2})])


def _nested(levels: int) -> list[Any]:
    """A payload of ``levels`` nested non-empty arrays (with the task document: one more)."""
    value: list[Any] = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


def _self_containing() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["me"] = value
    return value


async def _async_handler(task: ms.Task) -> None:
    return None


CATALOGUE: list[tuple[str, Call, type[Exception], str]] = [
    # publish
    (
        "empty key",
        lambda s: s.publish("", None, name="job"),
        ConfigurationError,
        "key: must be a non-empty",
    ),
    (
        "huge key",
        lambda s: s.publish("k" * 600, None, name="job"),
        ConfigurationError,
        "key: 600 characters",
    ),
    ("empty name", lambda s: s.publish("k", None, name=""), ConfigurationError, "name: must be"),
    (
        "set payload",
        lambda s: s.publish("k", {1}, name="job"),
        PayloadError,
        "payload: cannot be stored",
    ),
    (
        "$ field",
        lambda s: s.publish("k", {"$x": 1}, name="job"),
        PayloadError,
        r"field name '\$x'",
    ),
    (
        "oversize payload",
        lambda s: s.publish("k", "x" * 15_000_000, name="job"),
        PayloadError,
        "the limit is",
    ),
    (
        "lone surrogate in payload",
        lambda s: s.publish("k", {"text": "a\ud800"}, name="job"),
        PayloadError,
        r"payload\.text: not valid UTF-8",
    ),
    (
        "lone surrogate in a field name",
        lambda s: s.publish("k", {"a\udfff": 1}, name="job"),
        PayloadError,
        "field name .* not valid UTF-8",
    ),
    (
        "lone surrogate in key",
        lambda s: s.publish("k\ud800", None, name="job"),
        ConfigurationError,
        "key: not valid UTF-8",
    ),
    (
        "lone surrogate in name",
        lambda s: s.publish("k", None, name="job\ud800"),
        ConfigurationError,
        "name: not valid UTF-8",
    ),
    (
        "payload nested 5,000 deep",
        lambda s: s.publish("k", _nested(5_000), name="job"),
        PayloadError,
        "nested too deep",
    ),
    (
        "payload nested past MongoDB's 100 levels",
        lambda s: s.publish("k", _nested(100), name="job"),
        PayloadError,
        "at most 100 levels",
    ),
    (
        "payload that contains itself",
        lambda s: s.publish("k", _self_containing(), name="job"),
        PayloadError,
        r"payload\.me: contains itself",
    ),
    (
        "options as dict",
        lambda s: s.publish("k", None, name="job", options={"priority": 1}),
        ConfigurationError,
        "options: expected TaskOptions",
    ),  # type: ignore[arg-type]
    (
        "self dependency",
        lambda s: s.publish("k", None, name="job", depends_on=["k"]),
        DependencyError,
        "cannot depend on itself",
    ),
    (
        "missing dependency",
        lambda s: s.publish("k", None, name="job", depends_on=["nope"]),
        DependencyError,
        "no task has the key",
    ),
    (
        "other name, same key",
        lambda s: s.publish("existing", None, name="other"),
        ConfigurationError,
        "already names a task",
    ),
    # batches
    (
        "publish_many cycle",
        lambda s: s.publish_many([_spec("a", depends_on=("b",)), _spec("b", depends_on=("a",))]),
        DependencyError,
        "cycle",
    ),
    (
        "publish_many bad payload",
        lambda s: s.publish_many([_spec("a"), _spec("b", payload={1})]),
        PayloadError,
        "cannot be stored",
    ),
    ("commit stale requirement", _stale_commit, PreconditionFailed, "existing"),
    ("commit unstorable result", _unstorable_result, PayloadError, "result: cannot be stored"),
    (
        "replace a running task",
        lambda s: _claim_then(s, lambda: s.replace("existing", 1, name="job")),
        TaskRunning,
        "running",
    ),
    (
        "late edge cycle",
        lambda s: s.add_dependencies([("existing", "existing")]),
        DependencyError,
        "itself",
    ),
    # options and consumers
    (
        "set_options as dict",
        lambda s: s.set_options("existing", {"priority": 1}),
        ConfigurationError,
        "options: expected TaskOptions",
    ),  # type: ignore[arg-type]
    (
        "handlers empty",
        lambda s: _sync(lambda: s.consumer({})),
        ConfigurationError,
        "non-empty mapping",
    ),
    (
        "handler not callable",
        lambda s: _sync(lambda: s.consumer({"job": 3})),
        ConfigurationError,
        r"handlers\['job'\]",
    ),  # type: ignore[dict-item]
    (
        "retry_on not exceptions",
        lambda s: _sync(lambda: ms.Handlers().task("job", retry_on=(3,))(_async_handler)),
        ConfigurationError,
        r"handlers\['job'\]: retry_on must be exception classes",
    ),  # type: ignore[arg-type]
    (
        "consumers count",
        lambda s: s.consumers({"job": _async_handler}, count=0).__aenter__(),
        ConfigurationError,
        "count: expected an integer from 1 to 1000",
    ),
    (
        "negative delay",
        lambda s: s.publish("k", None, name="job", delay=-5),
        ConfigurationError,
        "delay: -5 seconds is not between 0 and 100 years",
    ),
    (
        "naive not_before",
        lambda s: s.publish(
            "k", None, name="job", options=ms.TaskOptions(not_before=dt.datetime(2031, 1, 1))
        ),
        ValidationError,
        "not_before",
    ),
    (
        "schedule cron",
        lambda s: s.schedule("s", name="job", cron="every day"),
        ConfigurationError,
        "cron: 'every day' is not a cron expression",
    ),
    (
        "schedule timezone",
        lambda s: s.schedule("s", name="job", cron="0 3 * * *", timezone="Paris"),
        ConfigurationError,
        "timezone: 'Paris' is not an IANA timezone",
    ),
    (
        "schedule payload",
        lambda s: s.schedule("s", name="job", every=dt.timedelta(minutes=1), payload={1, 2}),
        PayloadError,
        "payload",
    ),
    (
        "limit rate",
        lambda s: s.set_limit("job", rate=-1, per=dt.timedelta(minutes=1)),
        ConfigurationError,
        "rate: expected an integer from 1",
    ),
    (
        "pause name",
        lambda s: s.pause(""),
        ConfigurationError,
        "name: must be a non-empty string",
    ),
    (
        "debounce type",
        lambda s: s.publish("k", None, name="job", debounce="5s"),
        ConfigurationError,
        "debounce: expected a timedelta or a number of seconds, got str",
    ),
    (
        "naive expires_at",
        lambda s: s.publish(
            "k", None, name="job", options=ms.TaskOptions(expires_at=dt.datetime(2031, 1, 1))
        ),
        ValidationError,
        "expires_at",
    ),
    (
        "timeout_ms zero",
        lambda s: s.publish("k", None, name="job", options=ms.TaskOptions(timeout_ms=0)),
        ValidationError,
        "timeout_ms",
    ),
    (
        "worker options as dict",
        lambda s: _sync(lambda: s.consumer({"job": _async_handler}, options={"max_running": 2})),
        ConfigurationError,
        "options: expected WorkerOptions",
    ),  # type: ignore[arg-type]
    (
        "claim without names",
        lambda s: s.store.tasks.claim("w"),
        ConfigurationError,
        "give a key or at least one task name",
    ),
    (
        "claim with empty worker id",
        lambda s: s.store.tasks.claim("", names=["job"]),
        ConfigurationError,
        "worker_id",
    ),
    # reads and operations
    ("wait for an unknown key", lambda s: s.wait("nope", timeout=1), TaskNotFound, "nope"),
    (
        "list an unknown state",
        lambda s: s.list_tasks(state="done"),
        ConfigurationError,
        "'done' is not one of",
    ),
    (
        "retry a pending task",
        lambda s: s.retry("existing"),
        ConfigurationError,
        "only failed or cancelled",
    ),
    (
        "purge unfinished tasks",
        lambda s: s.purge(states=["running"], older_than=__import__("datetime").timedelta(0)),
        ConfigurationError,
        "only finished tasks",
    ),
    # connecting
    (
        "malformed uri",
        lambda s: ms.Scheduler.connect("mongodb://h:port"),
        ConfigurationError,
        "is not a valid MongoDB URI",
    ),
    (
        "unknown scheme",
        lambda s: ms.Scheduler.connect("postgres://h"),
        ConfigurationError,
        "unsupported scheme",
    ),
    (
        "misspelt uri option",
        lambda s: ms.Scheduler.connect("mongodb://h/?replicaSett=rs0"),
        ConfigurationError,
        "'replicaSett' is not a MongoDB URI option",
    ),
    (
        "sync collection",
        lambda s: _sync(lambda: ms.Scheduler(MongoClient(connect=False)["d"]["t"])),
        ConfigurationError,
        "synchronous pymongo Collection",
    ),
    (
        "not a collection",
        lambda s: _sync(lambda: ms.Scheduler([])),
        ConfigurationError,
        "expected an async MongoDB collection",
    ),
]


async def _claim_then(sched: ms.Scheduler, then: Callable[[], Awaitable[Any]]) -> Any:
    assert await sched.store.tasks.claim("w", key="existing") is not None
    return await then()


async def _first(connecting: Awaitable[ms.Scheduler]) -> Any:
    sched = await connecting
    async for task in sched.watch():
        return task
    return None


async def _documents(sched: ms.Scheduler) -> list[dict[str, Any]]:
    return [doc async for doc in sched.collection.find({}, sort=[("_id", 1)])]


@pytest.mark.parametrize(
    ("case", "call", "error", "message"), CATALOGUE, ids=[row[0] for row in CATALOGUE]
)
async def test_bad_input(
    scheduler: ms.Scheduler, case: str, call: Call, error: type[Exception], message: str
):
    await scheduler.publish("existing", {"n": 1}, name="job")
    if case.startswith(("commit", "replace")):
        before = None  # these claim first (a write) to set up the case; compare after that
    else:
        before = await _documents(scheduler)
    with pytest.raises(error, match=message):
        await call(scheduler)
    if before is not None:
        assert await _documents(scheduler) == before, f"{case}: bad input wrote something"


async def test_commit_cases_write_nothing_beyond_their_claim(scheduler: ms.Scheduler):
    await scheduler.publish("existing", {"n": 1}, name="job")
    lease = await scheduler.store.tasks.claim("w", key="existing")
    assert lease is not None
    before = await _documents(scheduler)
    for bad in ({"existing": 0}, {"nope": 1}):
        with pytest.raises(PreconditionFailed):
            await scheduler.commit(complete=[lease], publish=[_spec("x")], require=bad)
    assert await _documents(scheduler) == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"concurrent_worker_cnt": 0}, "concurrent_worker_cnt"),
        ({"worker_timeout_ms": 1_000, "ping_interval_ms": 1_000}, "worker_timeout_ms"),
        ({"max_tries": 0}, "max_tries"),
        ({"max_tries": 2**64}, "max_tries"),
        ({"unexpected_retry_delay_ms": 2**63}, "unexpected_retry_delay_ms"),
        ({"priority": 2**63}, "priority"),
        ({"concurrent_worker_cnt": 2, "max_tries": 1}, "max_tries .1. must be at least"),
        ({"specific_worker_ids": ["w\ud800"]}, r"specific_worker_ids\[0\]: not valid UTF-8"),
        ({"on_dependency_failure": "ignore"}, "on_dependency_failure"),
    ],
)
def test_invalid_task_options(fields: dict[str, Any], message: str):
    with pytest.raises(ValidationError, match=message):
        ms.TaskOptions(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_running": 0}, "max_running"),
        ({"worker_id": ""}, "worker_id"),
        ({"heap_size": 0}, "heap_size"),
        ({"heap_size": 2**63}, "heap_size"),
        ({"fetch_batch_size": 2**31}, "fetch_batch_size"),
    ],
)
def test_invalid_worker_options(fields: dict[str, Any], message: str):
    with pytest.raises(ValidationError, match=message):
        ms.WorkerOptions(**fields)
