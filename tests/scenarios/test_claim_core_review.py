"""Adversarial interleavings of the one claim core (`consumer.limits.Limiter`): pull leases,
consumers and limit changes across two processes on one database, the manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable

import anyio
import pytest

import mscheduler as ms
from mscheduler.models import Lease
from mscheduler.testing import ManualClock
from tests.engines import until_idle

pytestmark = pytest.mark.anyio
SECONDS = dt.timedelta(seconds=1)


async def _publish(sched: ms.Scheduler, count: int, **options: object) -> None:
    await sched.publish_many(
        ms.TaskSpec(key=f"t{n}", name="job", options=ms.TaskOptions(**options))  # type: ignore[arg-type]
        for n in range(count)
    )


async def _live_slots(sched: ms.Scheduler, name: str) -> int:
    limit = (await sched.limits()).get(name)
    now = sched.store.clock.now()
    return 0 if limit is None else len([s for s in limit.slots if s.until and s.until > now])


async def test_a_shortened_lease_of_a_vanished_owner_frees_its_slot_at_its_new_end(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.set_limit("job", max_running=1)
    await _publish(scheduler, 2)
    [lease] = await scheduler.own(["job"], worker_id="gone", lease=3600 * SECONDS)
    await scheduler.extend(lease, 2 * SECONDS)
    clock.advance(2.1)
    [taken] = await scheduler.own(["job"], worker_id="w")
    assert taken.key == "t0"


async def test_push_and_pull_share_max_running_across_processes(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]],
    discover: Callable[[], Awaitable[None]],
):
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await sched.set_limit("job", max_running=1)
    await _publish(sched, 3)
    release = anyio.Event()
    running = 0

    async def handler(task: ms.Task) -> None:
        nonlocal running
        running += 1
        await release.wait()
        running -= 1

    async with sched.consumer({"job": handler}, options=ms.WorkerOptions(worker_id="c")):
        with anyio.fail_after(10):
            while not running:
                await discover()
        assert await other.own(["job"], worker_id="w") == []
        release.set()
        await discover()
        await discover()
    # the consumer is gone; at most one more ran meanwhile
    leases = await other.own(["job"], worker_id="w", max_tasks=3)
    assert len(leases) <= 1


async def test_remove_and_set_cycles_leave_no_slot(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]], clock: ManualClock
):
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await _publish(sched, 12)
    for _ in range(4):
        await sched.set_limit("job", max_running=2, rate=5, per=SECONDS)
        a = await sched.own(["job"], worker_id="w", max_tasks=2)
        assert len(a) == 2
        await other.remove_limit("job")
        b = await other.own(["job"], worker_id="w")
        await sched.set_limit("job", max_running=1)
        assert await other.own(["job"], worker_id="w") == []
        for lease in (*a, *b):
            await other.succeed(lease)
        assert await _live_slots(sched, "job") == 0
        clock.advance(2)
    await sched.remove_limit("job")


async def test_a_waiting_owner_wakes_when_a_slot_frees_in_another_process(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]], clock: ManualClock
):
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await sched.set_limit("job", max_running=1)
    await _publish(sched, 2)
    [held] = await other.own(["job"], worker_id="o", lease=3600 * SECONDS)
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await sched.own(["job"], worker_id="w", wait=60 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        await other.succeed(held)
        with anyio.fail_after(10):
            while not found:
                await until_idle()
                clock.advance(0.5)
    assert clock.now() < held.task.created_at + 5 * SECONDS


async def test_a_waiting_owner_wakes_when_a_limit_is_raised_elsewhere(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]], clock: ManualClock
):
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await sched.set_limit("job", rate=1, per=dt.timedelta(hours=1))
    await _publish(sched, 2)
    [held] = await other.own(["job"], worker_id="o")
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await sched.own(["job"], worker_id="w", wait=600 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        await other.set_limit("job", rate=2, per=dt.timedelta(hours=1))
        with anyio.fail_after(10):
            while not found:
                await until_idle()
                clock.advance(0.5)
    assert clock.now() < held.task.created_at + 10 * SECONDS


async def test_a_cancelled_waiting_owner_leaves_nothing_held(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.set_limit("job", max_running=1, rate=10, per=SECONDS)
    await scheduler.publish("t0", None, name="job", delay=5)

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(lambda: scheduler.own(["job"], worker_id="w", wait=60 * SECONDS))
        await until_idle()
        task_group.cancel_scope.cancel()
    clock.advance(6)
    [lease] = await scheduler.own(["job"], worker_id="w2")
    assert lease.key == "t0"


async def test_an_owner_that_vanishes_while_its_token_is_written_leaves_no_slot(
    scheduler: ms.Scheduler, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
):
    """The owner's call is cancelled (its HTTP client went away) after its token's write was
    applied and before the reply came: no lease was made, so the name is not blocked."""
    await scheduler.set_limit("job", max_running=1)
    await _publish(scheduler, 1)
    original = scheduler.store.limits.acquire
    applied = anyio.Event()

    async def reply_never_comes(*args: object, **kwargs: object) -> object:
        await original(*args, **kwargs)  # type: ignore[arg-type]
        applied.set()
        await anyio.sleep_forever()

    monkeypatch.setattr(scheduler.store.limits, "acquire", reply_never_comes)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(lambda: scheduler.own(["job"], worker_id="gone"))
        await applied.wait()
        task_group.cancel_scope.cancel()
    monkeypatch.setattr(scheduler.store.limits, "acquire", original)
    [lease] = await scheduler.own(["job"], worker_id="w")
    assert lease.key == "t0"


async def test_pull_and_push_starts_share_one_rate_across_processes(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]],
    discover: Callable[[], Awaitable[None]],
    clock: ManualClock,
):
    """``rate=2`` an hour: an owner in one process takes one, a consumer in another starts
    exactly one more, and nothing else starts in the hour whichever side asks."""
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await sched.set_limit("job", rate=2, per=dt.timedelta(hours=1))
    await _publish(sched, 4)
    [owned] = await other.own(["job"], worker_id="w")
    started: list[str] = []

    async def handler(task: ms.Task) -> None:
        started.append(task.key)

    async with sched.consumer({"job": handler}, options=ms.WorkerOptions(worker_id="c")):
        for _ in range(6):
            await discover()
            clock.advance(1)
        assert len(started) == 1
        assert await other.own(["job"], worker_id="w", max_tasks=2) == []
    assert owned.key not in started
