"""Issue 10's regressions: nothing stuck, nothing spinning, no poison. Each test failed (or hung
the event loop, or crashed the consumer) before its fix; the number is the issue's item."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from pymongo.errors import AutoReconnect

import mscheduler as ms
from mscheduler.heap import ClaimHeap
from mscheduler.testing import CountingCollection
from tests.engines import POLL_MS
from tests.unit.test_consumer import FAST, Recorder, consumers

pytestmark = pytest.mark.anyio
K = ms.WorkerStateKind
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]
OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]


async def _state(sched: ms.Scheduler, key: str) -> S:
    task = await sched.get(key)
    assert task is not None, f"{key} is gone"
    return task.state


class _FetchLimit(CountingCollection):
    """Fails the test (instead of hanging it) when a consumer fetches in a loop."""

    def __init__(self, collection: Any, limit: int) -> None:
        super().__init__(collection)
        self.limit = limit

    def find(self, *args: Any, **kwargs: Any) -> Any:
        if self.counts["find"] >= self.limit:
            raise AssertionError(f"{self.limit} finds: the consumer fetches in a loop")
        return super().find(*args, **kwargs)


async def test_1_a_purged_and_republished_key_runs_again(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Discover
):
    """The old task reached a high version; the new one starts at 1 with a new _id."""
    recorder = Recorder()
    async with consumers(scheduler, recorder):
        await scheduler.publish("report", {"n": 1}, name="job")
        await discover()
        old = await scheduler.get("report")
        assert old is not None and old.state is S.SUCCESS and old.version > 1
        clock.advance(3600)
        assert await scheduler.purge(states=["success"], older_than=dt.timedelta(minutes=1)) == 1
        await scheduler.publish("report", {"n": 2}, name="job")
        await discover()
        assert await _state(scheduler, "report") is S.SUCCESS
    assert [key for key, _ in recorder.runs] == ["report", "report"]


async def test_5_a_backlog_pinned_to_other_workers_does_not_spin_the_fetcher(
    open_scheduler: OpenScheduler, discover: Discover
):
    """More tasks than the heap holds, all for another worker: this one still runs its own
    task, and fetches a bounded number of times."""
    sched = await open_scheduler()
    pinned = ms.TaskOptions(specific_worker_ids=["elsewhere"])
    await sched.publish_many(
        [ms.TaskSpec(key=f"pinned:{n}", name="job", options=pinned) for n in range(30)]
    )
    counted = _FetchLimit(sched.collection, limit=50)
    mine = ms.Scheduler(counted, clock=sched.store.clock)
    recorder = Recorder()
    options = ms.WorkerOptions(worker_id="w0", heap_size=10, poll_interval_ms=POLL_MS)
    async with mine.consumer({"job": recorder.for_worker("w0")}, options=options):
        await mine.publish("mine", None, name="job")
        await discover()
        await discover()
    assert recorder.runs == [("mine", "w0")]
    assert await _state(sched, "pinned:0") is S.PENDING


async def test_9_a_busy_consumer_keeps_its_heap_bounded(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Discover
):
    """Each consumer sees the other's running tasks again on every ping (their leases move):
    superseded heap pairs must not pile up."""
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    for n in range(6):
        await scheduler.publish(f"k{n}", None, name="job", options=FAST)
    async with consumers(scheduler, recorder, count=2, max_running=3) as started:
        for _ in range(40):
            clock.advance(0.5)
            await discover()
        pairs = [consumer._heap.stored_pairs for consumer in started]
        gate.set()
        await discover()
    assert sorted(key for key, _ in recorder.runs) == [f"k{n}" for n in range(6)]
    assert max(pairs) <= 2 * 3 + 16, f"heap pairs grew to {pairs}"


def test_9_the_heap_holds_one_pair_per_key_however_often_it_is_offered():
    heap = ClaimHeap(bound=100)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for ping in range(1_000):
        for n in range(10):
            heap.offer(f"k{n}", start + dt.timedelta(seconds=ping), version=ping + 1)
    assert len(heap) == 10 and heap.stored_pairs <= 2 * 10 + 16
    assert heap.pop_due(start + dt.timedelta(seconds=999)) == [f"k{n}" for n in range(10)]


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
async def test_4_a_claim_whose_reply_is_lost_still_runs_its_task(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Discover, lookups_lost: int
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
