"""`SyncScheduler`: the publishing side for blocking code (Django, Flask, scripts), on every
engine. Its calls block, so these tests are plain functions; the one that runs a consumer
calls it from a worker thread, as an async web framework would."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import anyio
import pymongo
import pytest

import mscheduler as ms
from mscheduler.backends.memory import forget_memory_server
from mscheduler.errors import (
    ConfigurationError,
    DependencyError,
    LeaseLost,
    PayloadError,
    TaskNotFound,
)
from mscheduler.sync_scheduler import _Blocking
from mscheduler.testing import Clock, ManualClock
from tests.engines import MEMORY_ONE_THREAD


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a test's schedulers connect: synchronous and async ones share the collection."""

    uri: str
    database: str | None
    collection: str

    def sync(self, clock: Clock | None = None) -> ms.SyncScheduler:
        return ms.SyncScheduler.connect(
            self.uri, database=self.database, collection=self.collection, clock=clock
        )

    async def open_async(self) -> ms.Scheduler:
        return await ms.Scheduler.connect(
            self.uri, database=self.database, collection=self.collection
        )


@pytest.fixture
def target(
    engine: str,
    engine_uri: str,
    server_database: str,
    prepare_collection: Callable[[str, str], None],
) -> Iterator[Target]:
    if engine == "memory":
        name = engine_uri.removeprefix("memory://")
        yield Target(f"{engine_uri}?notablescan=1", None, "tasks")  # every query indexed
        forget_memory_server(name)
        return
    found = Target(engine_uri, server_database, f"t_{uuid.uuid4().hex[:16]}")
    prepare_collection(found.database or "", found.collection)
    yield found
    with pymongo.MongoClient(engine_uri) as client:
        client[server_database].drop_collection(found.collection)


def test_publish_is_idempotent_and_writes_the_async_schedulers_document(target: Target) -> None:
    with target.sync() as sync:
        first = sync.publish("email:1", {"to": "a@b.c"}, name="email", delay=30)
        again = sync.publish("email:1", {"to": "other"}, name="email")
        assert (first.created, again.created) == (True, False)
        assert again.task.payload == {"to": "a@b.c"}  # nothing changed
        read = sync.get("email:1")

    async def read_async() -> ms.Task | None:
        async with await target.open_async() as sched:
            return await sched.get("email:1")

    assert read is not None and read.state is ms.TaskState.PENDING
    assert read.not_before is not None
    assert read == anyio.run(read_async)  # one document, whichever client reads it


def test_bad_input_names_the_field_and_writes_nothing(target: Target) -> None:
    with target.sync() as sync:
        with pytest.raises(ConfigurationError, match="name"):
            sync.publish("job:1", name="")
        with pytest.raises(PayloadError, match=r"payload\.items\[0\]"):
            sync.publish("job:1", {"items": ["\ud800"]}, name="job")  # not UTF-8
        assert sync.get("job:1") is None


def test_publish_many_writes_a_flow_or_nothing(target: Target) -> None:
    with target.sync() as sync:
        with pytest.raises(DependencyError, match="missing:0"):
            sync.publish_many([ms.TaskSpec(key="x", name="step", depends_on=["missing:0"])])
        assert sync.get("x") is None
        results = sync.publish_many(
            ms.chain(ms.TaskSpec(key="a", name="step"), ms.TaskSpec(key="b", name="step"))
        )
        assert [(r.task.key, r.task.state) for r in results] == [
            ("a", ms.TaskState.PENDING),
            ("b", ms.TaskState.BLOCKED),
        ]


def test_cancel_reaches_the_dependents_and_is_done_once(target: Target) -> None:
    with target.sync() as sync:
        sync.publish("extract", name="etl")
        sync.publish("load", name="etl", depends_on=["extract"])
        assert sync.cancel("extract", "no longer needed") is True
        assert sync.cancel("extract") is False
        load = sync.get("load")
        assert load is not None and load.state is ms.TaskState.CANCELLED


def test_wait_times_out_on_the_clock_and_refuses_a_missing_key(target: Target) -> None:
    clock = ManualClock()
    with target.sync(clock) as sync:
        sync.publish("slow", name="job")
        with pytest.raises(TimeoutError, match="slow"):
            sync.wait("slow", timeout=0)
        with pytest.raises(TaskNotFound, match="nothing"):
            sync.wait("nothing", timeout=0)
        with pytest.raises(ConfigurationError, match="discovery"):
            sync.wait("slow", discovery="sometimes")  # type: ignore[arg-type]


def test_wait_returns_once_another_thread_ends_the_task(engine: str, target: Target) -> None:
    if engine == "memory":
        pytest.skip(MEMORY_ONE_THREAD)
    with target.sync() as waiter, target.sync() as other:
        waiter.publish("report", name="report")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waited = pool.submit(waiter.wait, "report", 30, poll_interval_ms=10)
            assert other.cancel("report", "done elsewhere")
            task = waited.result(timeout=30)
    assert task.state is ms.TaskState.CANCELLED
    assert task.error is not None and "done elsewhere" in task.error.message


def test_threads_waiting_at_once_through_one_scheduler_each_see_their_task_end(
    engine: str, target: Target
) -> None:
    """A web server's threads wait on one `SyncScheduler` at once: each wait runs the
    discovery hub of its own thread's scheduler, in its own call's loop."""
    if engine == "memory":
        pytest.skip(MEMORY_ONE_THREAD)
    keys = [f"report:{n}" for n in range(3)]
    with target.sync() as sync:
        for key in keys:
            sync.publish(key, name="report")
        with concurrent.futures.ThreadPoolExecutor(len(keys)) as pool:
            waits = [pool.submit(sync.wait, key, 30, poll_interval_ms=10) for key in keys]
            for key in keys:
                assert sync.cancel(key, "done")
            ended = [waited.result(timeout=30) for waited in waits]
    assert [task.key for task in ended] == keys
    assert all(task.state is ms.TaskState.CANCELLED for task in ended)


def test_wraps_a_pymongo_collection_and_leaves_its_client_open(engine: str, target: Target) -> None:
    if engine == "memory":
        pytest.skip("memory:// has no pymongo Collection to wrap (SyncScheduler.connect opens it)")
    with pymongo.MongoClient(target.uri, tz_aware=True) as client:
        collection = client[target.database or ""][target.collection]
        with ms.SyncScheduler(collection) as sync:
            assert sync.publish("wrapped:1", {"n": 1}, name="job").created
        # Closing the scheduler left the caller's client usable.
        assert collection.find_one({"key": "wrapped:1"}, {"payload": 1})["payload"] == {"n": 1}


def test_threads_publishing_at_once_through_one_wrapped_collection_all_finish(
    engine: str, target: Target
) -> None:
    """A web server's first requests: several threads call one `SyncScheduler` at once, each
    in its own event loop, before the indexes are known to be there."""
    if engine == "memory":
        pytest.skip(MEMORY_ONE_THREAD)
    threads = 8
    with pymongo.MongoClient(target.uri, tz_aware=True) as client:
        sync = ms.SyncScheduler(client[target.database or ""][target.collection])
        start = threading.Barrier(threads)
        published: list[str] = []

        def publish(n: int) -> None:
            start.wait(timeout=30)
            published.append(sync.publish(f"request:{n}", name="job").task.key)

        running = [threading.Thread(target=publish, args=(n,), daemon=True) for n in range(threads)]
        for thread in running:
            thread.start()
        deadline = time.monotonic() + 30  # a bound on a hang, not a timing
        for thread in running:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        assert [thread for thread in running if thread.is_alive()] == []
        assert sorted(published) == sorted(f"request:{n}" for n in range(threads))
        assert sync.get("request:0") is not None


def test_called_from_async_code_says_what_to_use(target: Target) -> None:
    async def publish_in_a_loop(sync: ms.SyncScheduler) -> None:
        sync.publish("k", name="n")

    with target.sync() as sync:
        with pytest.raises(ConfigurationError, match=r"use ms\.Scheduler"):
            anyio.run(publish_in_a_loop, sync)
        assert sync.get("k") is None


@pytest.mark.anyio
async def test_a_consumer_runs_what_was_published_synchronously(target: Target) -> None:
    async def double(task: ms.Task) -> int:
        return int(task.payload["n"]) * 2

    sync = await anyio.to_thread.run_sync(target.sync)
    try:
        await anyio.to_thread.run_sync(lambda: sync.publish("double:21", {"n": 21}, name="double"))
        async with await target.open_async() as sched:
            options = ms.WorkerOptions(worker_id="w", poll_interval_ms=10)
            async with sched.consumers({"double": double}, options=options):
                await sched.wait("double:21", timeout=30, poll_interval_ms=10)
        task = await anyio.to_thread.run_sync(lambda: sync.wait("double:21", timeout=0))
    finally:
        await anyio.to_thread.run_sync(sync.close)
    assert (task.state, task.result) == (ms.TaskState.SUCCESS, 42)


def test_refused_credentials_are_said_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `Scheduler.connect`: a wrong password is a refusal, not "cannot reach MongoDB"."""
    import mscheduler.backends.sync as sync_module

    class RefusingClient:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.admin = self

        def command(self, *args: object) -> None:
            reply = {"ok": 0, "errmsg": "Authentication failed.", "code": 18}
            raise pymongo.errors.OperationFailure("Authentication failed.", 18, reply)

        def close(self) -> None: ...

    monkeypatch.setattr(sync_module, "MongoClient", RefusingClient)
    with pytest.raises(ConfigurationError) as refused:
        ms.SyncScheduler.connect("mongodb://ops:secret@db.example:27017/")
    assert str(refused.value) == (
        "uri: MongoDB at 'mongodb://ops:***@db.example:27017/' refused the credentials: "
        "Authentication failed."
    )


def test_own_extend_and_return_block_like_the_async_ones(target: Target) -> None:
    clock = ManualClock()
    with target.sync(clock) as sync:
        sync.publish("a", name="job")
        sync.publish("b", name="job")
        first, second = sync.own(["job"], worker_id="w", max_tasks=2, lease=10)
        first = sync.extend(first, 20)
        assert sync.succeed(first, {"ok": 1}).state is ms.TaskState.SUCCESS
        assert sync.release(second).state is ms.TaskState.PENDING
        [again] = sync.own(["job"], worker_id="w")
        found = sync.find_lease(again.key, worker_id="w", run_id=again.run_id)
        sync.fail(found, "broken")
        clock.advance(60)
        with pytest.raises(LeaseLost):
            sync.succeed(found)


def test_own_waits_again_after_a_wait_and_a_claim(target: Target) -> None:
    """A script owns in a loop, waiting each time: every call runs in an event loop of its
    own, one after another on the thread. The waits are short and real: a call that blocks
    its thread has no one to advance a manual clock."""
    with target.sync() as sync:
        assert sync.own(["job"], worker_id="w", wait=0.05) == []
        sync.publish("a", name="job")
        [lease] = sync.own(["job"], worker_id="w", wait=30)
        assert lease.key == "a"
        assert sync.own(["job"], worker_id="w", wait=0.05) == []
        sync.succeed(lease)
        sync.publish("b", name="job")
        assert [found.key for found in sync.own(["job"], worker_id="w", wait=30)] == ["b"]


def test_threads_owning_at_once_through_one_scheduler_each_get_a_task(
    engine: str, target: Target
) -> None:
    """A web server's threads own with a wait on one `SyncScheduler` at once: each wait runs
    the discovery hub of its own thread's scheduler, in its own call's loop, and wakes for
    the tasks published meanwhile."""
    if engine == "memory":
        pytest.skip(MEMORY_ONE_THREAD)
    workers = [f"w{n}" for n in range(3)]
    with target.sync() as sync, concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
        owns = [pool.submit(sync.own, ["job"], worker_id=w, wait=30) for w in workers]
        for n in range(len(workers)):
            sync.publish(f"job:{n}", name="job")
        owned = [found.result(timeout=60) for found in owns]
    assert all(len(leases) == 1 for leases in owned)
    assert sorted(leases[0].key for leases in owned) == [f"job:{n}" for n in range(3)]
    assert [leases[0].worker_id for leases in owned] == workers


# What outlives one blocking call (a consumer, the iterators of changes, a block that follows
# the controls) or returns an async object (`Browse`): `Scheduler`'s alone.
ASYNC_ONLY = {"browse", "consumer", "consumers", "events", "following_controls", "watch"}


def test_every_operation_of_the_scheduler_blocks_here_or_is_async_only() -> None:
    """A method added to `Scheduler` is offered blocking, as the very async method
    (`_Blocking`), or named here as one that cannot block."""
    public = {name for name in vars(ms.Scheduler) if not name.startswith("_")}
    offered = {name for name in vars(ms.SyncScheduler) if not name.startswith("_")}
    assert public - ASYNC_ONLY - offered == set()
    assert public >= ASYNC_ONLY and not ASYNC_ONLY & offered
    for name, member in vars(ms.SyncScheduler).items():
        if isinstance(member, _Blocking):
            assert member._method is vars(ms.Scheduler)[name], name
