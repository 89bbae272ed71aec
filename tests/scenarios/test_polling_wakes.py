"""Without change streams, with the default poll interval: a task starts within the bound of
what made it startable, whatever that was (a publish, a retry, a freed slot of a limit, a
dependency's end, a delay's end, a resume), written by this process or another. The writer
bumps the signal (`store.signal`), the polling process reads it between its polls.

The consumer and the writer are two schedulers on one collection (two processes); each test
lets the manual clock pass `BOUND` only, far less than the poll interval.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Awaitable, Callable

import anyio
import pytest

import mscheduler as ms
from mscheduler.testing import ManualClock
from tests.engines import needs_change_streams, until_idle

pytestmark = pytest.mark.anyio
OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]

# How late a task may start after what made it startable, at most, without change streams.
BOUND = dt.timedelta(milliseconds=250)
DEFAULTS = ms.WorkerOptions(worker_id="w1")  # the poll interval untouched


class Starts:
    """When each key's handler started, on the test's clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.at: dict[str, list[dt.datetime]] = {}

    def record(self, task: ms.Task) -> None:
        self.at.setdefault(task.key, []).append(self.clock.now())


async def _pair(open_scheduler: OpenScheduler) -> tuple[ms.Scheduler, ms.Scheduler]:
    """The consumer's process and another one that writes, both polling."""
    consumer_side = await open_scheduler(changestreams=False)
    writer = await open_scheduler(changestreams=False)
    return consumer_side, writer


async def _within_bound(clock: ManualClock, starts: Starts, key: str, count: int = 1) -> None:
    """Lets `BOUND` pass on the clock, in small steps; the key has started ``count`` times."""
    began = clock.now()
    while clock.now() - began < BOUND and len(starts.at.get(key, [])) < count:
        await until_idle()
        clock.advance(0.05)
    await until_idle()
    assert len(starts.at.get(key, [])) >= count, f"{key!r} did not start within {BOUND}"


async def _settled(clock: ManualClock) -> None:
    """A long idle time first: the first task after it is the one that waits longest."""
    for _ in range(3):
        await until_idle()
        clock.advance(10)
    await until_idle()


async def test_a_publish_by_another_process_starts_within_the_bound(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    side, writer = await _pair(open_scheduler)
    starts = Starts(clock)

    async def job(task: ms.Task) -> None:
        starts.record(task)

    async with side.consumer({"job": job}, options=DEFAULTS) as consumer:
        assert consumer.polling
        await _settled(clock)
        await writer.publish("k", None, name="job")
        await _within_bound(clock, starts, "k")


async def test_a_retry_starts_within_the_bound_of_the_failure(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    side, writer = await _pair(open_scheduler)
    starts = Starts(clock)

    async def flaky(task: ms.Task) -> None:
        starts.record(task)
        if len(starts.at[task.key]) == 1:
            raise RuntimeError("the first attempt fails")

    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    async with side.consumer({"job": flaky}, options=DEFAULTS):
        await _settled(clock)
        await writer.publish("k", None, name="job", options=options)
        await _within_bound(clock, starts, "k")
        await _within_bound(clock, starts, "k", count=2)
    task = await writer.get("k")
    assert task is not None and task.state is ms.TaskState.SUCCESS


async def test_a_freed_slot_of_a_limit_starts_the_next_task_within_the_bound(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    side, writer = await _pair(open_scheduler)
    await writer.set_limit("job", max_running=1)
    starts = Starts(clock)
    release = anyio.Event()

    async def job(task: ms.Task) -> None:
        starts.record(task)
        if task.key == "first":
            await release.wait()

    async with writer.consumer({"job": job}, options=ms.WorkerOptions(worker_id="w2")):
        await _settled(clock)
        await writer.publish("first", None, name="job")
        await _within_bound(clock, starts, "first")
        async with side.consumer({"job": job}, options=DEFAULTS):
            # Only the other process's worker may take it: the slot is freed here.
            only_w1 = ms.TaskOptions(specific_worker_ids=["w1"])
            await writer.publish("second", None, name="job", options=only_w1)
            await _settled(clock)
            assert "second" not in starts.at  # the limit holds it
            release.set()
            await _within_bound(clock, starts, "second")


async def test_a_dependents_start_follows_its_dependency_within_the_bound(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    side, writer = await _pair(open_scheduler)
    starts = Starts(clock)
    release = anyio.Event()

    async def job(task: ms.Task) -> None:
        starts.record(task)
        if task.key == "before":
            await release.wait()

    async with (
        side.consumer({"after": job}, options=DEFAULTS),
        writer.consumer({"before": job}, options=ms.WorkerOptions(worker_id="w2")),
    ):
        await _settled(clock)
        await writer.publish("before", None, name="before")
        await writer.publish("after", None, name="after", depends_on=["before"])
        await _within_bound(clock, starts, "before")
        await _settled(clock)
        assert "after" not in starts.at
        release.set()  # "before" ends in the writer's process
        await _within_bound(clock, starts, "after")


async def test_a_delays_end_starts_the_task_within_the_bound(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    side, writer = await _pair(open_scheduler)
    starts = Starts(clock)

    async def job(task: ms.Task) -> None:
        starts.record(task)

    async with side.consumer({"job": job}, options=DEFAULTS):
        await _settled(clock)
        due = clock.now() + dt.timedelta(seconds=7.3)  # not on a poll's beat
        await writer.publish("k", None, name="job", options=ms.TaskOptions(not_before=due))
        await until_idle()
        clock.set(due - dt.timedelta(milliseconds=1))
        await until_idle()
        assert "k" not in starts.at
        await _within_bound(clock, starts, "k")


async def test_a_resume_starts_the_paused_name_within_the_bound(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    side, writer = await _pair(open_scheduler)
    starts = Starts(clock)

    async def job(task: ms.Task) -> None:
        starts.record(task)

    await writer.pause("job")
    async with side.consumer({"job": job}, options=DEFAULTS):
        await _settled(clock)
        await writer.publish("k", None, name="job")
        await _settled(clock)
        assert "k" not in starts.at
        await writer.resume("job")
        await _within_bound(clock, starts, "k")


async def test_a_watch_beside_a_polling_consumer_sees_each_version_once(
    open_scheduler: OpenScheduler, clock: ManualClock
) -> None:
    """The reads the signal brings read back only a moment, the polls at their interval a
    second: across both, each version of a task reaches a watch once, in order."""
    side, writer = await _pair(open_scheduler)
    seen: list[tuple[str, int, ms.TaskState]] = []

    async def job(task: ms.Task) -> None:
        return None

    async with (
        side.consumer({"job": job}, options=DEFAULTS),
        contextlib.aclosing(side.watch(names=["job"])) as watch,
    ):

        async def follow() -> None:
            async for task in watch:
                seen.append((task.key, task.version, task.state))

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(follow)
            await _settled(clock)
            for n in range(5):
                await writer.publish(f"k{n}", None, name="job")
                for _ in range(3):
                    await until_idle()
                    clock.advance(0.05)
            for _ in range(60):  # past several polls at their interval
                await until_idle()
                clock.advance(0.05)
            await until_idle()
            task_group.cancel_scope.cancel()
        assert side.services.task_hub.signal_reads > 0  # the reads the signal brought ran
    assert len(seen) == len(set(seen)), f"a version was handed out twice: {seen}"
    for n in range(5):
        versions = [version for key, version, _ in seen if key == f"k{n}"]
        assert versions == sorted(versions)
        assert (f"k{n}", ms.TaskState.SUCCESS) in {(key, state) for key, _, state in seen}


async def test_with_change_streams_writers_send_nothing_to_the_signal(
    open_scheduler: OpenScheduler, clock: ManualClock, engine: str
) -> None:
    """Nobody polls: a publish, a retry, a dependent told and a control change write nothing
    more, and each writer reads whether someone polls once at most while the clock stands."""
    needs_change_streams(engine)
    sched = await open_scheduler()
    starts = Starts(clock)

    async def flaky(task: ms.Task) -> None:
        starts.record(task)
        if task.key == "k0" and len(starts.at[task.key]) == 1:
            raise RuntimeError("the first attempt fails")

    retry = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    async with sched.consumer({"job": flaky}, options=DEFAULTS) as consumer:
        assert not consumer.polling
        await sched.publish("k0", None, name="job", options=retry)
        await sched.publish_many(ms.TaskSpec(key=f"k{n}", name="job") for n in range(1, 20))
        await sched.publish("after", None, name="job", depends_on=["k1"])
        await sched.pause("job")
        await sched.resume("job")
        for _ in range(5):
            await until_idle()
            clock.advance(0.05)
        assert len(starts.at.get("k0", [])) == 2 and "after" in starts.at
    assert sched.store.signal.bumps == 0
    assert sched.store.signal.reads <= 1
