"""Consumer scenarios on the memory backend: several consumers in one process, a manual clock.

Nothing here sleeps: `until_idle` waits until every task in the process is blocked (each consumer
idle, waiting on the clock or an event), and the clock moves only when a test moves it."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
from pymongo.errors import AutoReconnect

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.consumer.heap import ClaimHeap
from mscheduler.errors import ConfigurationError, LeaseLost
from mscheduler.handlers import Consumer
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, needs_change_streams, until_idle
from tests.oracle import check_consistent

pytestmark = pytest.mark.anyio
K = WorkerStateKind
S = ms.TaskState
OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]
Discover = Callable[[], Awaitable[None]]
FAST = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=5_000)


class Recorder:
    """A handler that records who ran what; optionally waits on a gate or fails."""

    def __init__(self, *, gate: anyio.Event | None = None, fail: bool = False) -> None:
        self.runs: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.gate = gate
        self.fail = fail

    def for_worker(self, worker_id: str) -> Callable[[ms.Task], Any]:
        async def handler(task: ms.Task) -> Any:
            self.runs.append((task.key, worker_id))
            try:
                if self.gate is not None:
                    await self.gate.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled.append(task.key)
                raise
            if self.fail:
                raise RuntimeError(f"{task.key} failed")
            return {"by": worker_id}

        return handler


@contextlib.asynccontextmanager
async def consumers(
    sched: ms.Scheduler, recorder: Recorder, count: int = 1, **options: Any
) -> AsyncIterator[list[Consumer]]:
    started = [
        sched.consumer(
            {"job": recorder.for_worker(f"w{i}")},
            options=ms.WorkerOptions(worker_id=f"w{i}", **{"poll_interval_ms": POLL_MS, **options}),
        )
        for i in range(count)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for consumer in started:
            await stack.enter_async_context(consumer)
        yield started


async def test_tasks_before_and_after_start_each_run_once(
    scheduler: ms.Scheduler, discover: Discover
):
    for n in range(50):
        await scheduler.publish(f"before:{n}", {"n": n}, name="job")
    recorder = Recorder()
    async with consumers(scheduler, recorder, count=3):
        for n in range(50):
            await scheduler.publish(f"after:{n}", {"n": n}, name="job")
        # On the wire the consumers poll: the tasks published after their last fetch wait for
        # the next poll (until_idle() alone passed only when a claim happened to pick them up).
        await discover()
    keys = [key for key, _ in recorder.runs]
    assert sorted(keys) == sorted(
        [f"before:{n}" for n in range(50)] + [f"after:{n}" for n in range(50)]
    )
    assert len(set(keys)) == 100, "a task ran twice"
    assert len({worker for _, worker in recorder.runs}) > 1, "the work was not shared"
    for key in keys[:5]:
        task = await scheduler.get(key)
        assert task is not None and task.state is S.SUCCESS
        check_consistent(task)


async def test_concurrency_two_runs_on_exactly_two_workers(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(concurrent_worker_cnt=2)
    await scheduler.publish("pair", None, name="job", options=opts)
    recorder = Recorder()
    async with consumers(scheduler, recorder, count=3):
        await until_idle()
    task = await scheduler.get("pair")
    assert task is not None and task.state is S.SUCCESS
    assert len(recorder.runs) == 2
    assert len({ws.worker_id for ws in task.states(K.SUCCESS)}) == 2


async def test_specific_worker_runs_its_task(scheduler: ms.Scheduler):
    for n in range(5):
        opts = ms.TaskOptions(specific_worker_ids=["w2"])
        await scheduler.publish(f"only-w2:{n}", None, name="job", options=opts)
    recorder = Recorder()
    async with consumers(scheduler, recorder, count=3):
        await until_idle()
    assert {worker for _, worker in recorder.runs} == {"w2"}
    assert len(recorder.runs) == 5


async def test_higher_priority_published_later_runs_first(
    scheduler: ms.Scheduler, clock, discover: Discover
):
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    async with consumers(scheduler, recorder, max_running=1):
        await scheduler.publish("blocker", None, name="job")
        await discover()
        await scheduler.publish("low", None, name="job", options=ms.TaskOptions(priority=0))
        clock.advance(1)
        await scheduler.publish("high", None, name="job", options=ms.TaskOptions(priority=9))
        await until_idle()
        assert [key for key, _ in recorder.runs] == ["blocker"]
        gate.set()
        await discover()
        await discover()
    assert [key for key, _ in recorder.runs] == ["blocker", "high", "low"]


async def test_not_before_wakes_the_consumer_when_due_without_polling(clock):
    sched = ms.Scheduler(CountingCollection(_memory_collection()), clock=clock)
    recorder = Recorder()
    async with consumers(sched, recorder):
        due = clock.now() + dt.timedelta(minutes=1)
        await sched.publish("later", None, name="job", options=ms.TaskOptions(not_before=due))
        await until_idle()
        sched.collection.reset()
        clock.advance(59.999)
        await until_idle()
        assert recorder.runs == []
        assert sched.collection.calls == 0, "an idle consumer queried the database"
        clock.advance(0.001)
        await until_idle()
        assert recorder.runs == [("later", "w0")]


async def test_takeover_of_a_vanished_workers_task(scheduler: ms.Scheduler, clock):
    await scheduler.publish("orphan", None, name="job", options=FAST)
    ghost = await scheduler.store.tasks.claim("ghost", names=["job"])
    assert ghost is not None
    recorder = Recorder()
    async with consumers(scheduler, recorder):
        await until_idle()
        clock.advance(4.999)
        await until_idle()
        assert recorder.runs == [], "taken over before the lease expired"
        clock.advance(0.001)
        await until_idle()
        assert recorder.runs == [("orphan", "w0")]
    with pytest.raises(LeaseLost):
        await scheduler.store.tasks.succeed(ghost, "too late")
    task = await scheduler.get("orphan")
    assert task is not None and task.state is S.SUCCESS and task.result == {"by": "w0"}
    assert [ws.state for ws in task.worker_states] == [K.TIMEOUT, K.SUCCESS]


async def test_pings_keep_a_long_task_and_one_write_covers_all(clock):
    sched = ms.Scheduler(CountingCollection(_memory_collection()), clock=clock)
    for n in range(10):
        await sched.publish(f"long:{n}", None, name="job", options=FAST)
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    async with consumers(sched, recorder, count=1) as (consumer,):
        await until_idle()
        assert len(recorder.runs) == 10
        sched.collection.reset()
        for _ in range(20):  # 20 s: four times the worker timeout
            clock.advance(1)
            await until_idle()
        assert sched.collection.counts == {"bulk_write": 20}, sched.collection.counts
        assert consumer.stats.pings == 20
        gate.set()
        await until_idle()
    assert consumer.stats.succeeded == 10 and consumer.stats.lease_lost == 0


async def test_a_new_ping_interval_applies_from_the_next_ping(
    scheduler: ms.Scheduler, clock, discover: Discover
):
    await scheduler.publish("k", None, name="job", options=FAST)
    gate = anyio.Event()
    async with consumers(scheduler, Recorder(gate=gate)) as (consumer,):
        await until_idle()
        slower = ms.TaskOptions(ping_interval_ms=3_000, worker_timeout_ms=10_000)
        await scheduler.set_options("k", slower)
        await discover()
        clock.advance(1)  # the ping already scheduled happens
        await until_idle()
        assert consumer.stats.pings == 1
        clock.advance(2)
        await until_idle()
        assert consumer.stats.pings == 1, "pinged at the old interval"
        clock.advance(1)
        await until_idle()
        assert consumer.stats.pings == 2
        gate.set()


async def test_remote_cancel_stops_the_handler(scheduler: ms.Scheduler, discover: Discover):
    """Polling too (the wire engine): the process's poll reads the cancelled task, long
    before the next ping would find the lease lost."""
    await scheduler.publish("k", None, name="job")
    recorder = Recorder(gate=anyio.Event())
    async with consumers(scheduler, recorder) as (consumer,):
        await until_idle()
        assert await scheduler.cancel("k")
        await discover()
        assert recorder.cancelled == ["k"]
        assert consumer.running == []
    task = await scheduler.get("k")
    assert task is not None and task.state is S.CANCELLED
    assert consumer.stats.cancelled == 1


async def test_excluded_worker_stops_and_gives_the_task_back(
    scheduler: ms.Scheduler, discover: Discover
):
    await scheduler.publish("k", None, name="job")
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    async with consumers(scheduler, recorder, count=2):
        await until_idle()
        ((_, first_worker),) = recorder.runs
        other = "w1" if first_worker == "w0" else "w0"
        await scheduler.set_options("k", ms.TaskOptions(specific_worker_ids=[other]))
        await discover()
        assert recorder.cancelled == ["k"]
        gate.set()
        await discover()
    assert recorder.runs == [("k", first_worker), ("k", other)]
    task = await scheduler.get("k")
    assert task is not None and task.state is S.SUCCESS
    assert [ws.state for ws in task.worker_states] == [K.RELEASED, K.SUCCESS]
    assert task.unexpected_failures == 0


async def test_a_consumer_told_to_resync_still_hears_of_its_running_tasks(
    scheduler: ms.Scheduler, discover: Discover
):
    """A consumer that falls behind the process's hub is told to resync in place of the
    events it lost: among them, the write that removed it from a running task's
    ``specific_worker_ids``. Its resync reads its running tasks too, not only a page of
    the claimable ones (here a backlog it has no slot for fills that page), so it still
    stops that handler and gives the task back."""
    await scheduler.publish("k", None, name="job")
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    async with consumers(scheduler, recorder, max_running=1, fetch_batch_size=4) as (consumer,):
        await until_idle()
        assert recorder.runs == [("k", "w0")]
        await scheduler.publish_many(ms.TaskSpec(key=f"b{n}", name="job") for n in range(8))
        await discover()
        consumer._listener.subscription.buffer_size = 0  # every event lost: a resync
        await scheduler.set_options("k", ms.TaskOptions(specific_worker_ids=["w9"]))
        await discover()
        assert consumer._listener.subscription.resyncs >= 1
        assert recorder.cancelled == ["k"]
        gate.set()  # the backlog's handlers end
        await discover()
    task = await scheduler.get("k")
    assert task is not None and [ws.state for ws in task.worker_states] == [K.RELEASED]


async def test_handler_errors_retry_locally_then_fail(scheduler: ms.Scheduler, clock):
    opts = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("k", None, name="job", options=opts)
    recorder = Recorder(fail=True)
    async with consumers(scheduler, recorder, handler_retries=2, retry_backoff_ms=100) as (
        consumer,
    ):
        await until_idle()
        assert len(recorder.runs) == 1
        clock.advance(0.1)
        await until_idle()
        assert len(recorder.runs) == 2
        clock.advance(0.2)  # backoff doubles
        await until_idle()
        assert len(recorder.runs) == 3
    task = await scheduler.get("k")
    assert task is not None and task.state is S.FAIL
    assert task.error is not None and task.error.message == "k failed"
    assert consumer.stats.handler_retries == 2 and consumer.stats.failed == 1


async def test_graceful_stop_releases_running_tasks(scheduler: ms.Scheduler, clock):
    await scheduler.publish("k", None, name="job")
    recorder = Recorder(gate=anyio.Event())
    consumer = scheduler.consumer(
        {"job": recorder.for_worker("w0")},
        options=ms.WorkerOptions(worker_id="w0", shutdown_grace_ms=1_000),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.run)
        await until_idle()
        consumer.stop()
        await until_idle()
        assert recorder.cancelled == [], "cancelled before the grace period ended"
        clock.advance(1)
    assert recorder.cancelled == ["k"]
    task = await scheduler.get("k")
    assert task is not None and task.state is S.PENDING
    assert [ws.state for ws in task.worker_states] == [K.RELEASED]
    assert await scheduler.store.tasks.claim("w1", names=["job"]) is not None, (
        "not claimable at once"
    )


async def test_stop_now_during_the_grace_period_releases_at_once(scheduler: ms.Scheduler, clock):
    """A second Ctrl-C (`Consumer.stop_now`): the handlers are cancelled without waiting for
    the grace period, their leases released, and no failure counted."""
    await scheduler.publish("k", None, name="job")
    recorder = Recorder(gate=anyio.Event())
    consumer = scheduler.consumer(
        {"job": recorder.for_worker("w0")},
        options=ms.WorkerOptions(worker_id="w0", shutdown_grace_ms=600_000),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.run)
        await until_idle()
        consumer.stop()
        await until_idle()
        assert recorder.cancelled == []
        consumer.stop_now()  # the clock does not move: no grace period ends
    assert recorder.cancelled == ["k"]
    task = await scheduler.get("k")
    assert task is not None and task.state is S.PENDING and task.unexpected_failures == 0
    assert [ws.state for ws in task.worker_states] == [K.RELEASED]
    assert await scheduler.store.tasks.claim("w1", names=["job"]) is not None, (
        "not claimable at once"
    )


async def test_graceful_stop_lets_a_handler_finish_within_grace(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    consumer = scheduler.consumer({"job": recorder.for_worker("w0")})
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.run)
        await until_idle()
        consumer.stop()
        await until_idle()
        gate.set()
    task = await scheduler.get("k")
    assert task is not None and task.state is S.SUCCESS


async def test_wait_stopped_returns_once_the_running_outcomes_are_written(
    scheduler: ms.Scheduler,
):
    """A user who stops a consumer and awaits `Consumer.wait_stopped` reads the outcome of
    the task it was running: it returns once the consumer has stopped, not when the stop was
    asked for (`Consumer.wait_stop_requested` does that)."""
    await scheduler.publish("k", None, name="job")
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    consumer = scheduler.consumer({"job": recorder.for_worker("w0")})
    seen: list[ms.Task | None] = []

    async def stop_and_read() -> None:
        consumer.stop()
        await consumer.wait_stopped()
        seen.append(await scheduler.get("k"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.run)
        await until_idle()
        assert recorder.runs == [("k", "w0")]
        tg.start_soon(stop_and_read)
        await until_idle()  # the handler still runs, within the grace period
        gate.set()
    (task,) = seen
    assert task is not None and task.state is S.SUCCESS, "read before its outcome was written"


async def test_hard_stop_leaves_the_lease_to_expire(scheduler: ms.Scheduler, clock):
    await scheduler.publish("k", None, name="job", options=FAST)
    recorder = Recorder(gate=anyio.Event())
    consumer = scheduler.consumer({"job": recorder.for_worker("w0")})
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.run)
        await until_idle()
        tg.cancel_scope.cancel()
    task = await scheduler.get("k")
    assert task is not None and task.state is S.RUNNING
    assert await scheduler.store.tasks.claim("w1", names=["job"]) is None
    clock.advance(5)
    assert await scheduler.store.tasks.claim("w1", names=["job"]) is not None


async def test_stream_error_is_resumed_without_missing_a_task(
    scheduler: ms.Scheduler, clock, engine: str
):
    needs_change_streams(engine)
    recorder = Recorder()
    async with consumers(scheduler, recorder, reconnect_backoff_ms=100) as (consumer,):
        scheduler.collection.changes.inject_error(AutoReconnect("connection reset"))
        await until_idle()
        await scheduler.publish("during-outage", None, name="job")
        await until_idle()
        assert recorder.runs == [], "the stream was supposed to be down"
        clock.advance(0.1)
        await until_idle()
        assert recorder.runs == [("during-outage", "w0")]
        assert consumer._listener.reopened == 1 and consumer._listener.resyncs == 0


async def test_isolated_stream_errors_hours_apart_do_not_grow_the_backoff(
    scheduler: ms.Scheduler, clock, engine: str
):
    """The reconnect backoff doubles while the stream keeps failing, and starts again
    from the base once a reopened stream has stayed up (here: an hour)."""
    needs_change_streams(engine)
    recorder = Recorder()
    options = {"reconnect_backoff_ms": 100, "reconnect_backoff_max_ms": 30_000}
    async with consumers(scheduler, recorder, **options) as (consumer,):
        for outage in range(1, 4):
            scheduler.collection.changes.inject_error(AutoReconnect("connection reset"))
            await until_idle()
            await scheduler.publish(f"after-outage-{outage}", None, name="job")
            clock.advance(0.1)  # the base backoff, every time
            await until_idle()
            assert consumer._listener.reopened == outage
            assert (f"after-outage-{outage}", "w0") in recorder.runs
            clock.advance(3_600)


async def test_an_ended_stream_is_reopened(scheduler: ms.Scheduler, clock, engine: str):
    needs_change_streams(engine)
    recorder = Recorder()
    async with consumers(scheduler, recorder, reconnect_backoff_ms=100) as (consumer,):
        scheduler.collection.changes.end_streams()
        await until_idle()
        await scheduler.publish("after-invalidate", None, name="job")
        clock.advance(0.1)
        await until_idle()
        assert recorder.runs == [("after-invalidate", "w0")]
        assert consumer._listener.reopened == 1


async def test_unresumable_stream_loss_refetches_everything(
    scheduler: ms.Scheduler, clock, engine: str
):
    needs_change_streams(engine)
    recorder = Recorder()
    async with consumers(scheduler, recorder, reconnect_backoff_ms=100) as (consumer,):
        feed = scheduler.collection.changes
        feed.inject_error(AutoReconnect("connection reset"))
        await until_idle()
        await scheduler.publish("lost-event", None, name="job")
        feed.forget_history()  # the oplog rolled past our resume token
        clock.advance(0.1)
        await until_idle()
        assert recorder.runs == [("lost-event", "w0")]
        assert consumer._listener.resyncs == 1
        await scheduler.publish("after", None, name="job")
        await until_idle()
        assert ("after", "w0") in recorder.runs


async def test_polling_fallback_warns_and_keeps_working(clock, caplog):
    sched = await ms.Scheduler.connect("memory://?changestreams=0", clock=clock)
    recorder = Recorder(gate=anyio.Event())
    with caplog.at_level(logging.WARNING, logger="mscheduler"):
        async with consumers(sched, recorder, poll_interval_ms=2_000) as (consumer,):
            assert consumer.polling
            await sched.publish("k1", None, name="job", options=FAST)
            await until_idle()
            assert recorder.runs == []
            clock.advance(2)
            await until_idle()
            assert recorder.runs == [("k1", "w0")]
            # Without a stream, a remote cancel is noticed at the next ping (LeaseLost).
            await sched.cancel("k1")
            clock.advance(1)
            await until_idle()
            assert recorder.cancelled == ["k1"]
            assert consumer.stats.lease_lost == 1
    warnings = [r for r in caplog.records if getattr(r, "action", "") == "polling_fallback"]
    assert len(warnings) == 1
    assert "only supported on replica sets" in warnings[0].getMessage()
    assert "every 2.0 s" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("handlers", "message"),
    [
        ({}, "non-empty mapping"),
        ([("job", None)], "non-empty mapping"),
        ({"job": "not callable"}, "handlers\\['job'\\]: expected a function"),
        ({"": Recorder().for_worker("w")}, "name: must be a non-empty string"),
    ],
)
async def test_bad_handlers_are_refused(scheduler: ms.Scheduler, handlers: Any, message: str):
    with pytest.raises(ConfigurationError, match=message):
        scheduler.consumer(handlers)


def test_bad_worker_options_name_the_field():
    with pytest.raises(ValueError, match="max_running"):
        ms.WorkerOptions(max_running=0)


def _memory_collection() -> Any:
    from mscheduler.backends.memory import memory_server

    return memory_server("").collection("db", "tasks", notablescan=True)


async def test_a_consumer_hears_one_event_per_task_and_none_of_its_pings(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """Not every ping, claim and finish of every task of its names (3 events and more per
    task per consumer, each looked up)."""
    needs_change_streams(engine)
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    for n in range(12):
        await scheduler.publish(f"t{n}", None, name="job", options=FAST)
    async with consumers(scheduler, recorder, count=3, max_running=2) as started:
        for n in range(12, 30):
            await scheduler.publish(f"t{n}", None, name="job", options=FAST)
        for _ in range(6):  # runs long enough to be pinged a few times
            clock.advance(1)
            await until_idle()
        gate.set()
        for _ in range(20):
            await until_idle()
            clock.advance(0.1)
    assert len(recorder.runs) == 30
    assert sum(c.stats.pings for c in started) > 0
    for consumer in started:
        # The 18 published while it ran, each one insert; the 12 before came from the fetch.
        assert consumer.stats.events <= 18, consumer.stats


async def test_a_task_claimed_unseen_is_taken_over_at_its_last_pings_expiry(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """Claims and pings wake nobody now: a consumer that finds a task taken asks when it may
    be claimable next, and so still takes it over once its holder stops pinging."""
    needs_change_streams(engine)
    gate = anyio.Event()
    recorder = Recorder(gate=gate)
    async with consumers(scheduler, recorder, max_running=1) as (consumer,):
        await scheduler.publish("blocker", None, name="job", options=FAST)
        await until_idle()
        await scheduler.publish("long", None, name="job", options=FAST)
        ghost = await scheduler.store.tasks.claim("ghost", key="long")
        assert ghost is not None
        for _ in range(3):
            clock.advance(2)
            await scheduler.store.tasks.ping(ghost)  # the ghost's last ping: expires in 5 s
            await until_idle()
        gate.set()  # the slot frees: "long" is found taken, and its expiry read
        await until_idle()
        assert [key for key, _ in recorder.runs] == ["blocker"]
        assert consumer.stats.rescheduled >= 1
        clock.advance(4.9)
        await until_idle()
        assert [key for key, _ in recorder.runs] == ["blocker"], "taken over while pinged"
        clock.advance(0.2)
        await until_idle()
        assert [key for key, _ in recorder.runs] == ["blocker", "long"]
    assert consumer.stats.events <= 2


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


async def test_a_backlog_pinned_to_other_workers_does_not_spin_the_fetcher(
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


async def test_a_busy_consumer_keeps_its_heap_bounded(
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
        pairs = [consumer._claimer._heap.stored_pairs for consumer in started]
        gate.set()
        await discover()
    assert sorted(key for key, _ in recorder.runs) == [f"k{n}" for n in range(6)]
    assert max(pairs) <= 2 * 3 + 16, f"heap pairs grew to {pairs}"


def test_the_heap_holds_one_pair_per_key_however_often_it_is_offered():
    heap = ClaimHeap(bound=100)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for ping in range(1_000):
        for n in range(10):
            heap.offer(f"k{n}", start + dt.timedelta(seconds=ping), version=ping + 1)
    assert len(heap) == 10 and heap.stored_pairs <= 2 * 10 + 16
    assert heap.pop_due(start + dt.timedelta(seconds=999)) == [f"k{n}" for n in range(10)]


async def test_a_consumer_runs_tasks_queued_behind_dead_last_tries(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Three tasks whose only try's worker vanished (max_tries=1) sit first in claim order;
    a consumer of three slots must still run the three claimable tasks behind them."""

    fast = dict(ping_interval_ms=1_000, worker_timeout_ms=5_000)
    for n in range(3):
        await scheduler.publish(
            f"dead{n}", None, name="job", options=ms.TaskOptions(max_tries=1, **fast)
        )
        assert await scheduler.store.tasks.claim("ghost", key=f"dead{n}") is not None
    clock.advance(10)
    for n in range(3):
        await scheduler.publish(f"ok{n}", None, name="job", options=ms.TaskOptions(**fast))
    recorder = Recorder()
    async with consumers(scheduler, recorder, max_running=3):
        for _ in range(20):
            await until_idle()
            clock.advance(POLL_MS / 1000)
        await until_idle()
    assert sorted(key for key, _ in recorder.runs) == ["ok0", "ok1", "ok2"]
