"""One discovery hub per process: however many consumers and waiters a `Scheduler` runs, one
task change stream is open (memory engine), or one poll read is made per interval (the wire
engine, which has no change streams); each consumer still hears of its own names, and a
subscriber that falls behind reads everything again instead of losing a change."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.services.discovery import DUE_PAGE, RESYNC, STATE_READ_INTERVAL, Subscription
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, OpenStreams, SkewedClock, needs_change_streams, until_idle

pytestmark = pytest.mark.anyio
OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]
Discover = Callable[[], Awaitable[None]]


def _runs(into: list[tuple[str, str]], worker: str) -> Callable[[ms.Task], Awaitable[None]]:
    async def handler(task: ms.Task) -> None:
        into.append((task.key, worker))

    return handler


async def test_ten_consumers_share_one_task_stream(scheduler: ms.Scheduler, engine: str) -> None:
    needs_change_streams(engine)
    streams = OpenStreams(scheduler)
    ran: list[tuple[str, str]] = []
    async with scheduler.consumers({"job": _runs(ran, "any")}, count=10) as group:
        assert len(group) == 10
        await until_idle()
        await scheduler.publish("k", None, name="job")
        await until_idle()
    assert streams.opened == 1
    assert [key for key, _ in ran] == ["k"]


async def test_consumers_of_different_names_each_get_their_own(
    scheduler: ms.Scheduler, discover: Discover, engine: str
) -> None:
    """On memory: never more than one task stream open at once (a consumer of new names
    reopens it, wider, from its resume token); on the wire the one poll covers all names."""
    streams = OpenStreams(scheduler) if engine == "memory" else None
    ran: list[tuple[str, str]] = []
    names = [f"n{n}" for n in range(4)]
    consumers = [
        scheduler.consumer(
            {name: _runs(ran, name)},
            options=ms.WorkerOptions(worker_id=name, poll_interval_ms=POLL_MS),
        )
        for name in names
    ]
    async with anyio.create_task_group() as task_group:
        for consumer in consumers:
            await task_group.start(consumer.run)
        for name in names:
            await scheduler.publish(f"{name}-task", None, name=name)
        await discover()
        for consumer in consumers:
            consumer.stop()
    assert sorted(ran) == sorted((f"{name}-task", name) for name in names)
    if streams is not None:
        assert streams.most_at_once == 1


async def test_wait_many_shares_the_consumers_stream(scheduler: ms.Scheduler, engine: str) -> None:
    needs_change_streams(engine)
    streams = OpenStreams(scheduler)
    ran: list[tuple[str, str]] = []
    await scheduler.publish_many(ms.TaskSpec(key=f"k{n}", name="job") for n in range(5))
    async with scheduler.consumers({"job": _runs(ran, "any")}, count=3):
        done = await scheduler.wait_many([f"k{n}" for n in range(5)], timeout=5)
    assert all(task.state is ms.TaskState.SUCCESS for task in done.values())
    assert streams.most_at_once == 1


async def test_a_polling_process_polls_once_per_interval_whatever_its_consumers(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """Idle, with 1 and then 6 consumers and a waiter, for five intervals of a second: one
    read of the tasks collection each interval for the whole process (the writes since the
    previous poll), and once in those five seconds two reads by state (the consumers' due
    tasks, the waiter's ended one); not per consumer."""
    base = await open_scheduler(changestreams=False)
    counted = CountingCollection(base.collection)
    sched = ms.Scheduler(counted, clock=clock)
    await sched.publish("waited", None, name="other")
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=1_000)
    reads: dict[int, int] = {}
    for count in (1, 6):
        running = sched.consumers({"job": _runs([], "w")}, count=count, options=options)
        async with running, anyio.create_task_group() as task_group:
            task_group.start_soon(lambda: sched.wait("waited", poll_interval_ms=1_000))
            await until_idle()
            clock.advance(1)
            await until_idle()
            counted.reset()
            for _ in range(5):
                clock.advance(1)
                await until_idle()
            reads[count] = counted.counts["find"]
            task_group.cancel_scope.cancel()
    assert reads == {1: 5 + 2, 6: 5 + 2}


async def test_a_subscriber_that_falls_behind_resyncs_and_blocks_nobody(
    scheduler: ms.Scheduler, discover: Discover
) -> None:
    """One subscriber (room for two events) reads nothing while fifty tasks are published and
    run: the consumer beside it runs them all, and the slow one is told to read everything
    again (`RESYNC`) in place of the events it had no room for, never silently short of them."""
    ran: list[tuple[str, str]] = []
    keys = [f"k{n}" for n in range(50)]
    slow = Subscription(ms.WorkerOptions(poll_interval_ms=POLL_MS), states=keys, buffer_size=2)
    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS, max_running=64)
    consumer = scheduler.consumer({"job": _runs(ran, "w0")}, options=options)
    async with consumer, scheduler.services.task_hub.subscription(slow):
        await scheduler.publish_many(ms.TaskSpec(key=key, name="job") for key in keys)
        for _ in range(3):
            await discover()
        assert sorted(key for key, _ in ran) == sorted(keys)
        assert slow.resyncs >= 1
        assert await slow.next() is RESYNC


async def test_a_watch_shares_the_consumers_stream(
    scheduler: ms.Scheduler, discover: Discover, engine: str
) -> None:
    """A watch started while consumers run opens no stream of its own (memory: one open at
    once, the consumers' one, reopened wider), polls with them on the wire, and still shows a
    task published after it started, every change of it in order."""
    streams = OpenStreams(scheduler) if engine == "memory" else None
    hub = scheduler.services.task_hub
    ran: list[tuple[str, str]] = []
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    seen: list[tuple[str, ms.TaskState]] = []
    async with scheduler.consumer({"job": _runs(ran, "w")}, options=options):
        await until_idle()
        async with contextlib.aclosing(scheduler.watch(names=["job"])) as watch:

            async def follow() -> None:
                async for task in watch:
                    seen.append((task.key, task.state))
                    if task.state.is_terminal:
                        return

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(follow)
                await until_idle()
                assert hub.subscribers == 2  # the consumer and the watch
                await scheduler.publish("k", None, name="job")
                for _ in range(4):
                    await discover()
    assert ran == [("k", "w")]
    assert seen[0] == ("k", ms.TaskState.PENDING)
    assert seen[-1] == ("k", ms.TaskState.SUCCESS)
    if streams is not None:
        assert streams.most_at_once == 1


async def test_a_watch_abandoned_mid_iteration_leaves_no_subscriber(
    scheduler: ms.Scheduler, discover: Discover
) -> None:
    """The caller breaks out of the watch without closing it, or closes it: either way the
    hub forgets it (so its filter no longer widens the process's stream)."""
    hub = scheduler.services.task_hub
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": _runs([], "w")}, options=options):
        await until_idle()
        watch = scheduler.watch(names=["job"])
        closed = scheduler.watch()
        async with anyio.create_task_group() as task_group:

            async def first(of: AsyncIterator[ms.Task]) -> None:
                async for _ in of:
                    break  # left without closing it

            async def next_of(of: AsyncIterator[ms.Task]) -> None:
                await of.__anext__()

            task_group.start_soon(first, watch)
            task_group.start_soon(next_of, closed)
            await until_idle()
            assert hub.subscribers == 3
            await scheduler.publish("k", None, name="job")
            for _ in range(2):
                await discover()
        await closed.aclose()  # type: ignore[attr-defined]
        del watch  # dropped: its finalizer closes it
        await until_idle()
        assert hub.subscribers == 1  # the consumer alone


async def test_a_shared_watch_goes_on_after_the_consumers_stop(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock
) -> None:
    """The watch joined the consumers' hub; they stop, and it runs the hub itself while it
    waits (from the kept resume token, or poll time, at the watch's own interval of 1 s): a
    task published then still shows."""
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    seen: list[str] = []
    async with contextlib.aclosing(scheduler.watch(names=["job"])) as watch:

        async def follow() -> None:
            async for task in watch:
                seen.append(task.key)
                if task.key == "after":
                    return

        async with anyio.create_task_group() as task_group:
            async with scheduler.consumer({"other": _runs([], "w")}, options=options):
                await until_idle()
                task_group.start_soon(follow)
                await discover()
                await scheduler.publish("during", None, name="job")
                await discover()
            assert scheduler.services.task_hub.subscribers == 1  # the watch alone
            await scheduler.publish("after", None, name="job")
            for _ in range(2):
                clock.advance(1)
                await until_idle()
    assert seen == ["during", "after"]


async def test_a_shared_watch_told_to_resync_shows_what_it_lost(
    scheduler: ms.Scheduler, discover: Discover
) -> None:
    """The hub drops the events waiting for a watch (it fell behind, or the stream lost its
    place) for one resync: the watch reads the tasks written since the last one it showed, so
    the dropped change still shows (a task shown just before may show again)."""
    hub = scheduler.services.task_hub
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"other": _runs([], "w")}, options=options):
        await until_idle()
        async with contextlib.aclosing(scheduler.watch(names=["job"])) as watch:
            shown: list[str] = []

            async def show_one() -> None:
                shown.append((await anext(watch)).key)

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(show_one)
                await until_idle()
                await scheduler.publish("first", None, name="job")
                await discover()
            (sub,) = [sub for sub in hub._subs if sub.every]
            await scheduler.publish("lost", None, name="job")
            await discover()
            assert sub.pending == 1  # the watch has not read it yet
            sub.deliver(RESYNC)  # dropped
            await scheduler.publish("later", None, name="job")
            await discover()
            while "later" not in shown:
                await show_one()
    assert shown[0] == "first"
    assert shown[-2:] == ["lost", "later"]
    assert set(shown) == {"first", "lost", "later"}


async def test_a_waiter_beside_the_consumers_holds_back_no_page_of_the_backlog(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """A waiter widens the process's stream (or poll) to every state change of its tasks,
    claims included. A consumer that took those for work would fill its heap with running
    tasks due when their leases expire, and read the next page of the backlog only as its
    heap drains: the backlog runs at the pace of the finishes' events, not of the slots."""
    keys = [f"k{n}" for n in range(40)]
    await scheduler.publish_many(ms.TaskSpec(key=key, name="job") for key in keys)
    ran: list[tuple[str, str]] = []
    rounds = 0
    options = ms.WorkerOptions(
        worker_id="w", max_running=4, fetch_batch_size=4, poll_interval_ms=POLL_MS
    )
    running = scheduler.consumer({"job": _runs(ran, "w")}, options=options)
    async with running, anyio.create_task_group() as task_group:
        task_group.start_soon(functools.partial(scheduler.wait_many, keys, timeout=None))
        while len(ran) < len(keys) and rounds < 200:
            await until_idle()
            clock.advance(POLL_MS / 1000)
            rounds += 1
        task_group.cancel_scope.cancel()
    assert sorted(key for key, _ in ran) == sorted(keys)
    # A page of 4 a round: about 10 rounds (and as many polls on the wire engine).
    assert rounds <= 3 * len(keys) // 4, f"{rounds} rounds for {len(keys)} tasks"


async def test_a_polling_consumer_finds_a_write_that_showed_long_after_it_was_stamped(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """A write is stamped before it is sent, and a poll reads by that stamp: a slow
    transaction's writes, or a writer whose clock is behind ours, show up after the poll has
    moved past their stamp. The consumers find such a task by its state within a poll
    interval, not at the backstop fetch a minute later."""
    sched = await open_scheduler(changestreams=False)
    late = await open_scheduler(changestreams=False, clock=SkewedClock(clock, -30))
    ran: list[tuple[str, str]] = []
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    async with sched.consumer({"job": _runs(ran, "w")}, options=options):
        for _ in range(3):
            clock.advance(POLL_MS / 1000)
            await until_idle()
        await late.publish("late", None, name="job")
        await _read_by_state(clock)
        assert ran == [("late", "w")]


async def test_a_polling_waiter_sees_an_end_that_showed_long_after_it_was_stamped(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """The same for `wait`: a task cancelled by a writer whose clock is behind ours ends the
    wait within a poll interval, where reading by the time of the write would wait forever."""
    sched = await open_scheduler(changestreams=False)
    late = await open_scheduler(changestreams=False, clock=SkewedClock(clock, -30))
    await sched.publish("k", None, name="job")
    ended: list[ms.Task] = []

    async def waiting() -> None:
        ended.append(await sched.wait("k", timeout=3_600, poll_interval_ms=POLL_MS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(waiting)
        for _ in range(3):
            clock.advance(POLL_MS / 1000)
            await until_idle()
        await late.cancel("k")
        await _read_by_state(clock)
        task_group.cancel_scope.cancel()
    assert [task.state for task in ended] == [ms.TaskState.CANCELLED]


async def test_a_missed_write_is_found_whatever_the_backlog_of_another_name(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """The poll reads the due tasks name by name: a paused name's backlog, due for ever, does
    not hide a task of another name that the read of writes missed (stamped by a clock
    behind ours)."""
    sched = await open_scheduler(changestreams=False)
    operator = await open_scheduler(changestreams=False)
    late = await open_scheduler(changestreams=False, clock=SkewedClock(clock, -30))
    await operator.pause("paused")
    await operator.publish_many(ms.TaskSpec(key=f"p{n}", name="paused") for n in range(150))
    clock.advance(60)  # the backlog is due before the late task: first in the claim order
    ran: list[tuple[str, str]] = []
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    handlers = {"paused": _runs(ran, "w"), "job": _runs(ran, "w")}
    async with sched.consumer(handlers, options=options):
        for _ in range(3):
            clock.advance(POLL_MS / 1000)
            await until_idle()
        await late.publish("late", None, name="job")
        await _read_by_state(clock)
        assert ran == [("late", "w")]


async def test_a_shared_watch_shows_a_write_that_came_between_the_polls_reads(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """A task published after the poll read the writes but before it read the due tasks goes
    to the consumers at once (read as due); the watch beside them still shows it, from the
    next poll's read of writes."""
    sched = await open_scheduler(changestreams=False)
    operator = await open_scheduler(changestreams=False)
    await operator.pause("job")  # so the task stays as published
    read_due = sched.store.due
    race = {"armed": False}

    async def due_after_a_publish(*args: Any) -> list[ms.Task]:
        if race["armed"]:
            race["armed"] = False
            await operator.publish("raced", None, name="job")
        return await read_due(*args)

    sched.store.due = due_after_a_publish  # type: ignore[method-assign]
    shown: list[str] = []
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    async with sched.consumer({"job": _runs([], "w")}, options=options):
        await until_idle()

        async def watching() -> None:
            async for task in sched.watch(names=["job"]):
                shown.append(task.key)

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(watching)
            await until_idle()
            race["armed"] = True
            await _read_by_state(clock)
            for _ in range(2):
                clock.advance(POLL_MS / 1000)
                await until_idle()
            task_group.cancel_scope.cancel()
    assert shown == ["raced"]


async def test_a_polling_consumer_gets_a_task_due_after_a_write_that_woke_nobody(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """Another process claims a task with a short lease: the poll reads that claim (which
    gives no consumer work) and, its lease expired a moment later, reads the task as due.
    The consumers get it then: the claim's version was handed out, but not to them."""
    sched = await open_scheduler(changestreams=False)
    other = await open_scheduler(changestreams=False)
    ran: list[tuple[str, str]] = []
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    short = ms.TaskOptions(ping_interval_ms=100, worker_timeout_ms=500)
    async with sched.consumer({"job": _runs(ran, "w")}, options=options):
        await until_idle()  # the first poll, and its read by state
        clock.advance(STATE_READ_INTERVAL.total_seconds() - 0.6)
        await until_idle()
        await other.publish("k", None, name="job", options=short)
        assert await other.store.tasks.claim("gone", key="k") is not None  # never pings
        clock.advance(POLL_MS / 1000)
        await until_idle()  # the poll reads the claim: nothing for the consumers
        assert ran == []
        clock.advance(0.6)
        await until_idle()  # the lease expired: the read by state finds the task due
        for _ in range(3):
            clock.advance(POLL_MS / 1000)
            await until_idle()
        assert ran == [("k", "w")]


async def test_a_polling_consumer_gets_an_expired_lease_behind_tasks_pinned_elsewhere(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """The poll reads a page of each name's due tasks: tasks pinned to workers of other
    processes, due sooner and more than a page of them, do not hide a lease that expired
    behind them (found otherwise only by the consumer's backstop fetch a minute later)."""
    sched = await open_scheduler(changestreams=False)
    other = await open_scheduler(changestreams=False)
    pinned = ms.TaskOptions(specific_worker_ids=["elsewhere"])
    await other.publish_many(
        ms.TaskSpec(key=f"p{n}", name="job", options=pinned) for n in range(DUE_PAGE + 5)
    )
    clock.advance(1)
    ran: list[tuple[str, str]] = []
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS)
    short = ms.TaskOptions(ping_interval_ms=100, worker_timeout_ms=500)
    async with sched.consumer({"job": _runs(ran, "w")}, options=options):
        await until_idle()  # the first poll, and its read by state
        clock.advance(STATE_READ_INTERVAL.total_seconds() - 0.6)
        await until_idle()
        await other.publish("k", None, name="job", options=short)
        assert await other.store.tasks.claim("gone", key="k") is not None  # never pings
        clock.advance(POLL_MS / 1000)
        await until_idle()  # the poll reads the claim: nothing for the consumers
        clock.advance(0.6)
        await until_idle()  # the lease expired: the read by state finds the task due
        for _ in range(3):
            clock.advance(POLL_MS / 1000)
            await until_idle()
        assert ran == [("k", "w")]


async def _read_by_state(clock: ManualClock) -> None:
    """Time for the poll's next read by state (and a poll after it)."""
    clock.advance(STATE_READ_INTERVAL.total_seconds())
    await until_idle()
    clock.advance(POLL_MS / 1000)
    await until_idle()


async def test_a_waiter_hides_no_slot_freed_for_a_later_retry(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    """One slot of a task run by two workers at once fails: the task stays running, its
    free slot claimable once the retry delay passes, and the failure's write wakes the
    consumers. A waiter beside them widens the process's stream (or poll) to every state
    change of the task; the consumer still hears of that write, and claims the slot when
    its retry is due, not at its backstop fetch a minute later."""
    options = ms.TaskOptions(concurrent_worker_cnt=2, unexpected_retry_delay_ms=300)
    await scheduler.publish("k", None, name="job", options=options)
    held = await scheduler.store.tasks.claim(
        "other", key="k"
    )  # the other slot, for the test's span
    assert held is not None
    runs: list[str] = []

    async def fails_once(task: ms.Task) -> None:
        runs.append(task.key)
        if len(runs) == 1:
            raise RuntimeError("this slot fails")

    worker = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(functools.partial(scheduler.wait, "k", poll_interval_ms=POLL_MS))
        await discover()
        async with scheduler.consumer({"job": fails_once}, options=worker):
            await discover()
            assert runs == ["k"]
            clock.advance(0.3)
            for _ in range(3):
                await discover()
            assert runs == ["k", "k"]
        task_group.cancel_scope.cancel()
