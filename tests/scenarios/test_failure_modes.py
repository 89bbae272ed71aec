"""Failure modes: nothing stuck, nothing spinning, no poison, after lost replies, network
errors, purges, handlers that ignore cancellation or return what cannot be stored. Each test
failed (or hung the event loop, or crashed the consumer) before its fix; the number in a
test's name is the item of the issue that reported it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from pymongo.errors import AutoReconnect

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.consumer.heap import ClaimHeap
from mscheduler.errors import ConfigurationError
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, settle
from tests.faults import HeldWrites
from tests.scenarios.test_consumer import FAST, Recorder, consumers

pytestmark = pytest.mark.anyio
K = WorkerStateKind
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
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
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
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
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


class _TellingFails(CountingCollection):
    """Every update of dependents (the writes that tell them an outcome) fails on the network
    before it reaches the database, ``times`` times (-1: always)."""

    def __init__(self, collection: Any, times: int = -1) -> None:
        super().__init__(collection)
        self.times = times

    async def update_many(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "deps_pending" in query and self.times != 0:
            self.times -= 1
            raise AutoReconnect("connection reset while telling dependents")
        return await self.wrapped.update_many(query, *args, **kwargs)


async def _publish_pair(sched: ms.Scheduler) -> None:
    await sched.publish("dep", None, name="job")
    await sched.publish("child", None, name="job", depends_on=["dep"])


async def test_3_dependents_are_told_after_a_network_error_without_a_restart(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """The worker that finished ``dep`` could not tell ``child``: it does so itself once the
    network is back, and meanwhile ``dep`` is not purged (it would strand ``child``)."""
    await _publish_pair(scheduler)
    flaky = _TellingFails(scheduler.collection, times=1)
    sched = ms.Scheduler(flaky, clock=scheduler.store.clock)
    recorder = Recorder()
    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with sched.consumer({"job": recorder.for_worker("w0")}, options=options) as consumer:
        for _ in range(3):
            clock.advance(1)
            await discover()
    assert flaky.times == 0, "the fault was not injected"
    assert [key for key, _ in recorder.runs] == ["dep", "child"]
    assert await _state(scheduler, "child") is S.SUCCESS
    assert consumer.stats.lease_lost == 0, "the landed finish was written again"


async def test_3_a_dead_writers_dependents_are_told_by_a_running_consumer(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """Another process finished ``dep`` and never told ``child`` (its network stayed down):
    a long-running consumer that saw ``dep`` end tells ``child`` after a grace period."""
    outsider = ms.TaskOptions(specific_worker_ids=["outsider"])
    await scheduler.publish("dep", None, name="job", options=outsider)
    await scheduler.publish("child", None, name="job", depends_on=["dep"])
    other = ms.Scheduler(_TellingFails(scheduler.collection), clock=scheduler.store.clock)
    recorder = Recorder()
    async with consumers(scheduler, recorder):
        await discover()
        lease = await other.store.claim("outsider", key="dep")
        assert lease is not None
        await other.store.succeed(lease, "done")  # landed; telling child did not
        assert other.store.owed == {"dep"}
        await discover()
        assert recorder.runs == []
        for _ in range(12):
            clock.advance(1)
            await discover()
        assert recorder.runs == [("child", "w0")]
    dep = await scheduler.get("dep")
    assert dep is not None and dep.dependents_notified is True


async def test_2_purge_keeps_a_finished_task_until_its_dependents_are_told(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("dep", None, name="job")
    await scheduler.publish("child", None, name="job", depends_on=["dep"])
    other = ms.Scheduler(_TellingFails(scheduler.collection), clock=scheduler.store.clock)
    lease = await other.store.claim("outsider", key="dep")
    assert lease is not None
    await other.store.succeed(lease, "done")  # telling child failed
    clock.advance(3600)
    hour = dt.timedelta(minutes=1)
    assert await scheduler.purge(states=["success"], older_than=hour) == 0, "child stranded"
    assert await scheduler.store.recover_dependents() == 1
    assert await scheduler.purge(states=["success"], older_than=hour) == 1
    assert await _state(scheduler, "child") is S.PENDING


async def test_2_deleting_a_dependency_in_a_commit_fails_its_waiting_dependents(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("dep", None, name="job")
    await scheduler.publish("child", None, name="job", depends_on=["dep"])
    await scheduler.publish("grandchild", None, name="job", depends_on=["child"])
    runs_anyway = ms.TaskOptions(on_dependency_failure="run")
    await scheduler.publish("tolerant", None, name="job", depends_on=["dep"], options=runs_anyway)
    await scheduler.commit(delete=["dep"])
    assert await scheduler.get("dep") is None
    child, grandchild, tolerant = [
        await scheduler.get(key) for key in ("child", "grandchild", "tolerant")
    ]
    assert child is not None and child.state is S.CANCELLED and child.error is not None
    assert child.error.message == "dependency 'dep' was deleted"
    assert grandchild is not None and grandchild.state is S.CANCELLED, "no cascade"
    assert tolerant is not None and tolerant.state is S.PENDING
    assert tolerant.deps_pending == [] and tolerant.deps_failed == ["dep"]


async def test_2_deleting_and_publishing_a_key_keeps_its_dependents_waiting(
    scheduler: ms.Scheduler,
):
    """The barrier pattern: the key is replaced, so its dependents wait for the new task."""
    await scheduler.publish("barrier", None, name="job")
    await scheduler.publish("after", None, name="job", depends_on=["barrier"])
    await scheduler.commit(delete=["barrier"], publish=[ms.TaskSpec(key="barrier", name="job")])
    after = await scheduler.get("after")
    assert after is not None and after.state is S.BLOCKED and after.deps_pending == ["barrier"]


async def test_7_stop_returns_and_releases_when_a_handler_ignores_cancellation(
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
            await settle()
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
        await settle()
        assert consumer.running == ["k"] and len(held.held) == 1  # its outcome, on its way
        consumer.stop()
        await settle()
        clock.advance(1)  # the grace
        await settle()
        assert not returned.is_set()
        clock.advance(2)  # and the cancel timeout
        await settle()
        stopped = returned.is_set()
        task_group.cancel_scope.cancel()
    assert stopped, "stop() waited on an outcome write past its grace and cancel timeout"
    task = await scheduler.get("k")
    assert task is not None and task.state is S.RUNNING  # its lease is left to expire


async def test_10_a_handler_raising_cancelled_error_fails_only_its_task(
    scheduler: ms.Scheduler, discover: Discover
):
    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("weird", None, name="job", options=once)
    await scheduler.publish("fine", None, name="job")

    async def handler(task: ms.Task) -> str:
        if task.key == "weird":
            raise anyio.get_cancelled_exc_class()()  # its own, nothing cancelled it
        return "ok"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": handler}, options=options) as consumer:
        await discover()
    weird, fine = await scheduler.get("weird"), await scheduler.get("fine")
    assert weird is not None and weird.state is S.FAIL and weird.error is not None
    assert weird.error.type == "HandlerCancelled"
    assert fine is not None and fine.state is S.SUCCESS
    assert consumer.stats.failed == 1


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


class _Unserialisable(ms.TaskOptions):
    def model_dump(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("cannot dump me")


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (_self_containing(), "contains itself"),
        (_Unserialisable(), "TypeError: cannot dump me"),
        ({"n": 2**70}, "cannot be stored as BSON"),
    ],
    ids=["self-containing", "model-dump-raises", "int-overflow"],
)
async def test_10_an_unstorable_result_fails_only_its_task(
    scheduler: ms.Scheduler, discover: Discover, result: Any, said: str
):
    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("odd", None, name="job", options=once)
    await scheduler.publish("fine", None, name="job")

    async def handler(task: ms.Task) -> Any:
        return result if task.key == "odd" else "ok"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": handler}, options=options):
        await discover()
    odd, fine = await scheduler.get("odd"), await scheduler.get("fine")
    assert odd is not None and odd.state is S.FAIL and odd.error is not None
    assert odd.error.type == "PayloadError" and said in odd.error.message
    assert fine is not None and fine.state is S.SUCCESS


async def test_12_a_batch_with_a_key_of_another_name_writes_nothing(scheduler: ms.Scheduler):
    await scheduler.publish("taken", None, name="other")
    specs = [ms.TaskSpec(key=f"new:{n}", name="job") for n in range(3)]
    with pytest.raises(ConfigurationError, match="'taken' names a task of name 'other'"):
        await scheduler.publish_many([*specs, ms.TaskSpec(key="taken", name="job")])
    assert await scheduler.store.get_many([spec.key for spec in specs]) == []


async def test_12_a_commit_with_a_key_of_another_name_records_nothing(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("taken", None, name="other")
    await scheduler.publish("mine", None, name="job")
    lease = await scheduler.store.claim("w0", key="mine")
    assert lease is not None
    with pytest.raises(ConfigurationError, match="nothing written"):
        await scheduler.commit(
            complete=[(lease, "done")],
            delete=["gone"],
            publish=[ms.TaskSpec(key="next", name="job"), ms.TaskSpec(key="taken", name="job")],
        )
    mine = await scheduler.get("mine")
    assert mine is not None and mine.state is S.RUNNING, "the completion was recorded"
    assert await scheduler.get("next") is None


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
