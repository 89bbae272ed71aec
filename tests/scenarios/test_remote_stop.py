"""Stopping a named worker from elsewhere (`Scheduler.stop_worker`): it claims nothing more,
drains or releases its running tasks, and its run ends; a stop for a worker that is not live
changes nothing, and one meant for an earlier run of an id never stops a later one. Every
engine, the manual clock."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import BackendUnavailable, ConfigurationError, WorkerNotLive
from mscheduler.handlers import Consumer
from mscheduler.models import WorkerInfo, WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import worker
from tests.faults import LosesBesideWrites

pytestmark = pytest.mark.anyio
S = ms.TaskState


class Run:
    """A consumer run in the background, so a test sees it end by itself."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.ended = False

    async def __call__(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        await self.consumer.run(task_status=task_status)
        self.ended = True


async def test_a_draining_stop_lets_running_tasks_finish_claims_nothing_more_and_ends_the_run(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    release = anyio.Event()
    ran: list[str] = []

    async def job(task: ms.Task) -> str:
        ran.append(task.key)
        await release.wait()
        return "done"

    consumer = scheduler.consumer({"email": job}, options=worker("w1"))
    run = Run(consumer)
    async with anyio.create_task_group() as tg:
        await tg.start(run)
        await scheduler.publish("first", None, name="email")
        await discover()
        assert ran == ["first"]
        told = await scheduler.stop_worker("w1")
        assert told.worker_id == "w1" and told.instance
        await discover()
        assert consumer.stop_requested and consumer.stopped_remotely
        await scheduler.publish("second", None, name="email")
        await discover()
        assert ran == ["first"], "a worker asked to stop claimed again"
        assert not run.ended, "a draining stop ended the run before its task finished"
        release.set()
        await discover()
        assert run.ended
    assert (await scheduler.get("first")).state is S.SUCCESS  # type: ignore[union-attr]
    assert (await scheduler.get("second")).state is S.PENDING  # type: ignore[union-attr]
    assert await scheduler.store.stops.of("w1") is None, "an applied stop was kept"
    assert await scheduler.workers() == []


async def test_a_stop_without_drain_releases_running_tasks_for_others_at_once(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    started = anyio.Event()

    async def stuck(task: ms.Task) -> None:
        started.set()
        await anyio.sleep_forever()

    consumer = scheduler.consumer({"email": stuck}, options=worker("w1"))
    run = Run(consumer)
    async with anyio.create_task_group() as tg:
        await tg.start(run)
        await scheduler.publish("long", None, name="email")
        await discover()
        assert started.is_set()
        await scheduler.stop_worker("w1", drain=False)
        await discover()
        assert run.ended, "a stop without drain waited for the running task"
    task = await scheduler.get("long")
    assert task is not None and task.state is S.PENDING
    assert [s.state for s in task.worker_states] == [WorkerStateKind.RELEASED]
    taken: list[str] = []

    async def quick(task: ms.Task) -> None:
        taken.append(task.key)

    async with scheduler.consumer({"email": quick}, options=worker("w2")):
        await discover()
    assert taken == ["long"]
    assert (await scheduler.get("long")).state is S.SUCCESS  # type: ignore[union-attr]


async def test_a_stop_without_drain_hurries_a_draining_one(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    async def stuck(task: ms.Task) -> None:
        await anyio.sleep_forever()

    consumer = scheduler.consumer(
        {"email": stuck}, options=worker("w1", shutdown_grace_ms=3_600_000)
    )
    run = Run(consumer)
    async with anyio.create_task_group() as tg:
        await tg.start(run)
        await scheduler.publish("long", None, name="email")
        await discover()
        await scheduler.stop_worker("w1")
        await discover()
        assert consumer.stop_requested and not run.ended  # draining, within an hour's grace
        await scheduler.stop_worker("w1", drain=False)
        await discover()
        assert run.ended
    assert (await scheduler.get("long")).state is S.PENDING  # type: ignore[union-attr]


async def test_a_stop_for_a_worker_that_is_not_live_says_so_and_changes_nothing(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    async def job(task: ms.Task) -> None:
        pass

    with pytest.raises(WorkerNotLive):
        await scheduler.stop_worker("nobody")
    dead = WorkerInfo(
        worker_id="dead",
        host="h",
        pid=1,
        names=["email"],
        max_running=1,
        started_at=clock.now(),
        last_seen_at=clock.now(),
        heartbeat_ms=1_000,
        instance="gone",
    )
    await scheduler.store.workers.beat(dead)
    clock.advance(10)  # it missed its heartbeats: stale
    async with scheduler.consumer({"email": job}, options=worker("w1")) as consumer:
        with pytest.raises(WorkerNotLive):
            await scheduler.stop_worker("dead")
        with pytest.raises(WorkerNotLive):
            await scheduler.stop_worker("w")  # ids are whole: no prefix of one
        await discover()
        assert not consumer.stop_requested
    assert await scheduler.store.stops.of("nobody") is None
    assert await scheduler.store.stops.of("dead") is None


async def test_a_stop_for_a_worker_of_a_release_without_remote_stop_is_refused(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Its entry names no run (``instance``): it would never read the stop."""
    older = WorkerInfo(
        worker_id="old-1",
        host="h",
        pid=1,
        names=["email"],
        max_running=1,
        started_at=clock.now(),
        last_seen_at=clock.now(),
        heartbeat_ms=30_000,
    )
    await scheduler.store.workers.beat(older)
    with pytest.raises(ConfigurationError):
        await scheduler.stop_worker("old-1")
    assert await scheduler.store.stops.of("old-1") is None


async def test_a_stop_meant_for_an_earlier_run_of_an_id_does_not_stop_a_later_one(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """The worker w1 was asked to stop but died before it read the request (its entry still
    looked alive); w1 started again is another run: it goes on, and clears the request."""
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    async with scheduler.consumer({"email": job}, options=worker("w1")):
        [earlier] = await scheduler.workers()
    await scheduler.store.stops.request(earlier, drain=False)  # as stop_worker writes it
    clock.advance(1)
    async with scheduler.consumer({"email": job}, options=worker("w1")) as later:
        await discover()
        assert not later.stop_requested
        assert await scheduler.store.stops.of("w1") is None, "the stale request was kept"
        await scheduler.publish("mail", None, name="email")
        await discover()
        assert ran == ["mail"]


@pytest.mark.parametrize("retried", [True, False], ids=["retried", "not_retried"])
async def test_a_stop_whose_signal_is_lost_still_reaches_the_worker(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, retried: bool
):
    """The stop is written and the version bump that tells the consumers of it is lost:
    retried, the call tells them at once; not retried, the worker reads its controls again
    within ``schedule_refresh_ms`` anyway."""

    async def job(task: ms.Task) -> None:
        pass

    operator = ms.Scheduler(LosesBesideWrites(scheduler.collection, ".controls"), clock=clock)
    options = worker("w1")
    consumer = scheduler.consumer({"email": job}, options=options)
    run = Run(consumer)
    async with anyio.create_task_group() as tg:
        await tg.start(run)
        await discover()
        with pytest.raises(BackendUnavailable):
            await operator.stop_worker("w1")
        await discover()
        assert not consumer.stop_requested
        if retried:
            await operator.stop_worker("w1")
        else:
            clock.advance(options.schedule_refresh_ms / 1000)
        await discover()
        assert run.ended
