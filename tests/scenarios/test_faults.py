"""Fault injection in the consumer: network errors, stream errors, stubborn and blocking
handlers, duplicate events. No task is lost, none runs twice unless a lease expired, and
the consumers keep going."""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import random
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pymongo.errors import AutoReconnect

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.backends.memory import memory_server
from mscheduler.errors import BackendUnavailable
from mscheduler.handlers import Consumer
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, needs_change_streams, until_idle
from tests.faults import BrokenCursor, FaultyCollection, HeldWrites
from tests.scenarios.test_consumer import Recorder, consumers

pytestmark = pytest.mark.anyio
K = WorkerStateKind
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]
PATIENT = ms.TaskOptions(
    max_unexpected_retries=20,
    unexpected_retry_delay_ms=0,
    ping_interval_ms=1_000,
    worker_timeout_ms=5_000,
)


async def drive(clock: ManualClock, done: Any, *, step: float = 0.5, limit: int = 600) -> None:
    for _ in range(limit):
        await until_idle()
        if await done():
            return
        clock.advance(step)
    raise AssertionError("the work did not finish")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_network_and_stream_faults_lose_no_task(clock: ManualClock, seed: int):
    memory = memory_server("").collection("db", "tasks", notablescan=True)
    producer = ms.Scheduler(memory, clock=clock)  # publishes without faults
    faulty = FaultyCollection(memory, rate=0.15, seed=seed)
    sched = ms.Scheduler(faulty, clock=clock)
    # Enough tasks, and few enough slots (batched claims and finishes make fewer calls per
    # task), that every seed injects faults of both kinds.
    keys = [f"t{n}" for n in range(60)]
    for key in keys:
        await producer.publish(key, None, name="job", options=PATIENT)
    runs: collections.Counter[str] = collections.Counter()
    chaos = random.Random(seed)

    async def handler(task: ms.Task) -> str:
        runs[task.key] += 1
        if chaos.random() < 0.3:
            await anyio.lowlevel.checkpoint()  # give the stream faults a chance mid-work
        return "ok"

    async def all_done() -> bool:
        if chaos.random() < 0.2:
            memory.changes.inject_error(AutoReconnect("stream reset"))
        tasks = await producer.store.get_many(keys)
        return all(task.state.is_terminal for task in tasks)

    async def late_done() -> bool:
        # Idle too: a finish whose reply was lost may still be retrying (the clock is manual,
        # so a shutdown's grace period would never pass while it does).
        idle = not any(consumer.running for consumer in started)
        return idle and await _terminal(producer, ["late-1", "late-2"])

    started: list[Consumer] = []
    async with contextlib.AsyncExitStack() as stack:
        for n in range(3):
            options = ms.WorkerOptions(worker_id=f"w{n}", reconnect_backoff_ms=200, max_running=4)
            consumer = sched.consumer({"job": handler}, options=options)
            started.append(await stack.enter_async_context(consumer))
        await drive(clock, all_done)
        for late in ("late-1", "late-2"):  # the consumers keep going after all that
            await producer.publish(late, None, name="job", options=PATIENT)
        await drive(clock, late_done)

    assert faulty.injected["before"] > 0 and faulty.injected["after"] > 0
    for task in await producer.store.get_many([*keys, "late-1", "late-2"]):
        assert task.state is S.SUCCESS, (task.key, task.state, task.error)
        if runs[task.key] > 1:
            expired = [ws for ws in task.worker_states if ws.state in (K.TIMEOUT, K.RELEASED)]
            assert expired, f"{task.key} ran {runs[task.key]} times without a lease expiring"


async def _terminal(sched: ms.Scheduler, keys: list[str]) -> bool:
    return all(task.state.is_terminal for task in await sched.store.get_many(keys))


async def test_a_handler_that_ignores_cancellation(
    scheduler: ms.Scheduler, clock, engine: str, discover: Discover
):
    """Cancelled remotely, it finishes anyway: the consumer does not write its late outcome,
    and meanwhile goes on with other work."""
    await scheduler.publish("stubborn", None, name="job")
    finishing = anyio.Event()

    async def stubborn(task: ms.Task) -> str:
        if task.key == "stubborn":
            with anyio.CancelScope(shield=True):
                await finishing.wait()
        return "done"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    consumer = scheduler.consumer({"job": stubborn}, options=options)
    async with consumer:
        await until_idle()
        await scheduler.cancel("stubborn")
        await scheduler.publish("next", None, name="job")
        await discover()
        if engine == "wire":  # polling: the next ping finds the cancelled lease lost
            clock.advance(ms.TaskOptions().ping_interval_ms / 1000)
            await until_idle()
        assert (await scheduler.get("next")).state is S.SUCCESS  # type: ignore[union-attr]
        finishing.set()
        await until_idle()
    assert (await scheduler.get("stubborn")).state is S.CANCELLED  # type: ignore[union-attr]
    assert consumer.stats.cancelled == 1 and consumer.stats.succeeded == 1


async def test_a_handler_that_blocks_the_loop(scheduler: ms.Scheduler, clock):
    """Blocking the event loop (time passes, nothing else runs) for less than the worker timeout
    costs nothing; for longer, the lease is gone and another worker runs the task."""
    await scheduler.publish("short-block", None, name="job", options=PATIENT)
    await scheduler.publish("long-block", None, name="job", options=PATIENT)
    runs: collections.Counter[str] = collections.Counter()

    async def blocking(task: ms.Task) -> str:
        runs[task.key] += 1
        if runs[task.key] == 1:
            clock.advance(3 if task.key == "short-block" else 6)  # a synchronous stall
        await anyio.lowlevel.checkpoint()
        return "done"

    async def done() -> bool:
        return await _terminal(scheduler, ["short-block", "long-block"])

    options = ms.WorkerOptions(worker_id="w0", max_running=1)
    async with scheduler.consumer({"job": blocking}, options=options) as consumer:
        await drive(clock, done)
    assert runs == {"short-block": 1, "long-block": 2}
    long_block = await scheduler.get("long-block")
    assert long_block is not None and long_block.state is S.SUCCESS
    assert [ws.state for ws in long_block.worker_states] == [K.TIMEOUT, K.SUCCESS]
    assert consumer.stats.timeouts == 1, "the expired lease is noticed before any write"


async def test_duplicate_and_out_of_order_events_change_nothing(
    scheduler: ms.Scheduler, engine: str
):
    needs_change_streams(engine)
    await scheduler.publish("k", None, name="job")
    first = await scheduler.get("k")
    assert first is not None
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    async with consumers(scheduler, recorder) as (consumer,):
        await until_idle()
        claimed = consumer.stats.claimed
        for stale in (first, first, first.model_copy(update={"version": first.version - 1})):
            consumer._intake.changed(stale)  # delivered again, and out of order
        await until_idle()
        assert consumer.stats.claimed == claimed and consumer.running == ["k"]
        gate.set()
        await until_idle()
    assert recorder.runs == [("k", "w0")]


async def test_a_worker_never_runs_a_key_it_is_still_running(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """Its lease expired under a stalled handler that then ignores the stop: the task is
    claimable again, but not by this worker while that handler still runs (two attempts of
    one key in one process, which the executor's bookkeeping keeps apart)."""
    await scheduler.publish("k", None, name="job", options=PATIENT)
    release = anyio.Event()
    started: list[str] = []

    async def stalls(task: ms.Task) -> str:
        started.append(task.key)
        if len(started) == 1:
            clock.advance(6)  # a synchronous stall past the 5 s lease
            with anyio.CancelScope(shield=True):
                await release.wait()
        return "done"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": stalls}, options=options):
        for _ in range(5):
            await discover()
        assert started == ["k"], "the worker started the key again while it still ran it"
        release.set()
        await discover()


async def test_a_retry_seen_due_while_its_failure_is_unacknowledged_runs_when_the_run_ends(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """A failure retried at once whose write landed but whose reply is slow: the change
    stream or the poll shows the task due again while its worker still runs it, so a claim
    leaves it out. It is claimed as soon as that run ends, with no write to bring it back
    and well before a read by state or a fetch would find it."""
    held = HeldWrites(scheduler.collection, replies=True)
    held.holding = False
    slow = ms.Scheduler(held, clock=clock)
    runs: list[str] = []

    async def fails(task: ms.Task) -> None:
        runs.append(task.key)
        held.holding = len(runs) == 1  # the first failure lands at once; its reply waits
        raise RuntimeError("no")

    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    worker = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with slow.consumer({"job": fails}, options=worker) as consumer:
        try:
            await discover()
            await scheduler.publish("k", None, name="job", options=options)
            await discover()
            await discover()  # the failed version, due, is seen; its run has not ended
            assert runs == ["k"] and len(held.held) == 1 and consumer.running == ["k"]
            held.held[0].set()
            for _ in range(3):
                await discover()
            assert runs == ["k", "k"], "the retry waited for a read that was not coming"
        finally:
            held.holding = False
            for gate in held.held:
                gate.set()
    task = await scheduler.get("k")
    assert task is not None and task.state is S.FAIL


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


async def test_an_exception_whose_str_raises_fails_only_its_task(
    scheduler: ms.Scheduler, discover: Discover
):
    """What a handler raises is that task's failure, never the consumer's."""
    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("odd", None, name="job", options=once)
    await scheduler.publish("surrogate", None, name="job", options=once)
    await scheduler.publish("fine", None, name="job")

    async def handler(task: ms.Task) -> str:
        if task.key == "odd":
            raise _Unprintable()
        if task.key == "surrogate":
            raise ValueError("bad byte \udc80 in input")  # a lone surrogate: not UTF-8
        return "ok"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": handler}, options=options) as consumer:
        await discover()
    odd, surrogate, fine = [await scheduler.get(key) for key in ("odd", "surrogate", "fine")]
    assert odd is not None and odd.state is S.FAIL and odd.error is not None
    assert "str() of this _Unprintable raised RuntimeError" in odd.error.message
    assert surrogate is not None and surrogate.state is S.FAIL and surrogate.error is not None
    assert surrogate.error.message.startswith("bad byte ")
    assert fine is not None and fine.state is S.SUCCESS
    assert consumer.stats.failed == 2 and consumer.stats.succeeded == 1


def test_worker_durations_are_bounded_at_validation():
    with pytest.raises(ValueError, match="shutdown_grace_ms"):
        ms.WorkerOptions(shutdown_grace_ms=10**15)
    with pytest.raises(ValueError, match="poll_interval_ms"):
        ms.WorkerOptions(poll_interval_ms=10**15)


@pytest.mark.parametrize(
    "field", ["unexpected_retry_delay_ms", "ping_interval_ms", "worker_timeout_ms"]
)
def test_task_durations_are_bounded_at_validation(field: str):
    """publish accepted 10**15 ms, and the consumer then crashed computing a date from it."""
    with pytest.raises(ValueError, match=field):
        ms.TaskOptions(**{field: 10**15})


@pytest.mark.parametrize("delay", [10**20, float("inf"), float("nan"), -1])
def test_retry_later_refuses_a_delay_no_date_can_hold(delay: float):
    with pytest.raises(ValueError, match="RetryLater: delay must be between 0 and"):
        ms.RetryLater(delay)


class _Unreachable:
    """A collection whose server went away after connect: every call fails on the network."""

    def __init__(self, collection: Any) -> None:
        self.wrapped = collection
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.wrapped, name)
        if not callable(attribute) or not self.down:
            return attribute

        error = AutoReconnect("connection refused")
        if name in ("find", "aggregate", "list_indexes"):
            return lambda *args, **kwargs: BrokenCursor(error)

        async def fail(*args: Any, **kwargs: Any) -> Any:
            raise error

        return fail


@pytest.mark.parametrize("read", ["list", "stats", "retry_failed", "purge"])
async def test_an_operators_read_on_an_unreachable_server_says_so(clock: ManualClock, read: str):
    """The CLI turns `BackendUnavailable` into one line and exit 2; a raw driver error would
    reach the operator as a traceback."""
    collection = _Unreachable(memory_server("").collection("db", "tasks"))
    sched = ms.Scheduler(collection, clock=clock)
    await sched.publish("k", None, name="job")  # connected, indexes made
    collection.down = True
    calls = {
        "list": sched.list_tasks,
        "stats": sched.stats,
        "retry_failed": sched.retry_failed,
        "purge": lambda: sched.purge(states=["success"], older_than=dt.timedelta(days=1)),
    }
    with pytest.raises(BackendUnavailable, match="unreachable"):
        await calls[read]()


class _LoseReplies(CountingCollection):
    """Applies the first claim, then loses its reply; with ``lookups_lost`` also the replies
    of that many following ``find_one`` calls (the look-up by run_id)."""

    def __init__(self, collection: Any, lookups_lost: int) -> None:
        super().__init__(collection)
        self.claims_lost = 1
        self.lookups_lost = lookups_lost

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.wrapped.find_one_and_update(*args, **kwargs)
        if self.claims_lost and kwargs.get("sort") is not None:  # a claim by name
            self.claims_lost -= 1
            raise AutoReconnect("connection reset after the claim was applied")
        return result

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:
        if self.lookups_lost:
            self.lookups_lost -= 1
            raise AutoReconnect("connection reset during the look-up")
        return await self.wrapped.find_one(*args, **kwargs)


@pytest.mark.parametrize("lookups_lost", [0, 1])
async def test_a_claim_whose_reply_is_lost_still_runs_its_task(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover, lookups_lost: int
):
    """With no retries left to spare, the task runs exactly once and succeeds: the worker
    finds the lease it took by the run_id it generated (lookups_lost=1: on its next turn)."""
    await scheduler.publish(
        "once", None, name="job", options=ms.TaskOptions(max_unexpected_retries=0)
    )
    lossy = _LoseReplies(scheduler.collection, lookups_lost)
    sched = ms.Scheduler(lossy, clock=scheduler.store.clock)
    recorder = Recorder()
    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with sched.consumer({"job": recorder.for_worker("w0")}, options=options):
        for _ in range(4):
            clock.advance(1)
            await discover()
    assert lossy.claims_lost == 0 and lossy.lookups_lost == 0, "the faults were not injected"
    assert recorder.runs == [("once", "w0")]
    task = await scheduler.get("once")
    assert task is not None and task.state is S.SUCCESS
    assert [ws.state for ws in task.worker_states] == [K.SUCCESS]


class _LoseNextReply(CountingCollection):
    """Once armed, applies the next write (a ``find_one_and_update``, or a ``bulk_write``: a
    success nobody reads back is sent as one) and loses its reply."""

    armed = False

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        return self._lose(await self.wrapped.find_one_and_update(*args, **kwargs))

    async def bulk_write(self, *args: Any, **kwargs: Any) -> Any:
        return self._lose(await self.wrapped.bulk_write(*args, **kwargs))

    def _lose(self, result: Any) -> Any:
        if self.armed:
            self.armed = False
            raise AutoReconnect("connection reset after the finish was applied")
        return result


async def test_a_finish_whose_reply_is_lost_is_not_reported_as_a_lost_lease(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    await scheduler.publish("k", None, name="job")
    lossy = _LoseNextReply(scheduler.collection)
    sched = ms.Scheduler(lossy, clock=scheduler.store.clock)

    async def handler(task: ms.Task) -> str:
        lossy.armed = True  # the next write is this run's success
        return "ok"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with sched.consumer({"job": handler}, options=options) as consumer:
        for _ in range(3):
            clock.advance(1)
            await discover()
    assert lossy.armed is False, "the fault was not injected"
    task = await scheduler.get("k")
    assert task is not None and task.state is S.SUCCESS and task.result == "ok"
    assert consumer.stats.succeeded == 1 and consumer.stats.lease_lost == 0


async def test_stop_returns_and_releases_when_a_handler_ignores_cancellation(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover, caplog
):
    await scheduler.publish("stubborn", None, name="job")
    release = anyio.Event()
    returned = anyio.Event()

    async def stubborn(task: ms.Task) -> str:
        with anyio.CancelScope(shield=True):  # a cleanup that never ends, say
            await release.wait()
        return "too late"

    options = ms.WorkerOptions(
        worker_id="w0", poll_interval_ms=POLL_MS, shutdown_grace_ms=1_000, cancel_timeout_ms=2_000
    )
    consumer = scheduler.consumer({"job": stubborn}, options=options)

    async def run() -> None:
        await consumer.run()
        returned.set()

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(run)
        await discover()
        assert consumer.running == ["stubborn"]
        consumer.stop()
        for _ in range(4):
            clock.advance(1)
            await until_idle()
        stopped = returned.is_set()
        release.set()  # let the abandoned handler end, whatever happened
    assert stopped, "stop() did not return with a handler that ignores cancellation"
    task = await scheduler.get("stubborn")
    assert task is not None and task.state is S.PENDING
    assert [ws.state for ws in task.worker_states] == [K.RELEASED]
    assert consumer.stats.abandoned == 1
    assert "handler of task 'stubborn' ignored cancellation" in caplog.text


async def test_stop_returns_when_an_outcome_write_outlasts_the_grace(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """A finish stuck on its way (a slow server, other consumers' batch ahead of it) gets
    ``cancel_timeout_ms`` past the grace, like a handler unwinding; then the stop goes on."""
    await scheduler.publish(
        "k", None, name="job", options=ms.TaskOptions(worker_timeout_ms=600_000)
    )
    held = HeldWrites(scheduler.collection)
    held.holding = False
    slow = ms.Scheduler(held, clock=clock)
    ended, returned = anyio.Event(), anyio.Event()

    async def handler(task: ms.Task) -> str:
        held.holding = True  # from now on, writes hang: this outcome's among them
        ended.set()
        return "done"

    options = ms.WorkerOptions(
        worker_id="w0", poll_interval_ms=POLL_MS, shutdown_grace_ms=1_000, cancel_timeout_ms=2_000
    )
    consumer = slow.consumer({"job": handler}, options=options)

    async def run() -> None:
        await consumer.run()
        returned.set()

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(run)
        await discover()
        await ended.wait()
        await until_idle()
        assert consumer.running == ["k"] and len(held.held) == 1  # its outcome, on its way
        consumer.stop()
        await until_idle()
        clock.advance(1)  # the grace
        await until_idle()
        assert not returned.is_set()
        clock.advance(2)  # and the cancel timeout
        await until_idle()
        stopped = returned.is_set()
        task_group.cancel_scope.cancel()
    assert stopped, "stop() waited on an outcome write past its grace and cancel timeout"
    task = await scheduler.get("k")
    assert task is not None and task.state is S.RUNNING  # its lease is left to expire
