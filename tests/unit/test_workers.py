"""The live workers: each consumer lists itself beside the tasks, refreshed with its heartbeat,
removed at stop; one that died shows as stale. `stats` counts the live ones per name."""

from __future__ import annotations

import datetime as dt
import os
import socket

import anyio
import pytest

import mscheduler as ms
from tests.engines import POLL_MS, settle

pytestmark = pytest.mark.anyio


def options(worker_id: str, **more: int) -> ms.WorkerOptions:
    return ms.WorkerOptions(
        worker_id=worker_id, poll_interval_ms=POLL_MS, heartbeat_ms=1_000, **more
    )


async def test_a_consumer_is_listed_while_it_runs_and_removed_at_stop(
    scheduler: ms.Scheduler, clock: ms.ManualClock
):
    gate = anyio.Event()

    async def slow(task: ms.Task) -> None:
        await gate.wait()

    consumer = scheduler.consumer(
        {"render": slow, "email": slow}, options=options("w1", max_running=4)
    )
    started = clock.now()
    async with consumer:
        [info] = await scheduler.workers()
        assert info.worker_id == "w1" and info.alive
        assert info.names == ["email", "render"] and info.max_running == 4
        assert info.host == socket.gethostname() and info.pid == os.getpid()
        assert info.running == 0 and info.started_at == started
        await scheduler.publish("r1", None, name="render")
        await scheduler.publish("r2", None, name="render")
        clock.advance(POLL_MS / 1000)
        await settle()
        assert sorted(consumer.running) == ["r1", "r2"]
        clock.advance(1.0)  # a heartbeat: the entry says what runs now
        await settle()
        [info] = await scheduler.workers()
        assert info.running == 2 and sorted(info.running_keys) == ["r1", "r2"]
        assert info.last_seen_at == clock.now() and info.alive
        assert [w.worker_id for w in await scheduler.workers(names=["email"])] == ["w1"]
        assert await scheduler.workers(names=["sms"]) == []
        gate.set()
    assert await scheduler.workers() == []


async def test_a_worker_that_died_is_shown_stale(scheduler: ms.Scheduler, clock: ms.ManualClock):
    """A kill -9 leaves the entry: alive until three heartbeats were missed."""
    now = clock.now()
    dead = ms.WorkerInfo(
        worker_id="gone",
        host="h",
        pid=1,
        names=["job"],
        max_running=1,
        started_at=now,
        last_seen_at=now,
        heartbeat_ms=10_000,
    )
    await scheduler.store.workers.beat(dead)
    clock.advance(29.9)
    assert [w.alive for w in await scheduler.workers()] == [True]
    clock.advance(0.1)
    [info] = await scheduler.workers()
    assert not info.alive and info.stale_at() == now + dt.timedelta(seconds=30)


async def test_stats_count_live_workers_and_list_paused_names_without_tasks(
    scheduler: ms.Scheduler, clock: ms.ManualClock
):
    async def noop(task: ms.Task) -> None: ...

    await scheduler.publish("e1", None, name="email")
    await scheduler.publish("o1", None, name="orphan")
    await scheduler.pause("email", reason="provider outage")
    await scheduler.pause("sms")
    async with (
        scheduler.consumer({"email": noop}, options=options("w1")),
        scheduler.consumer({"email": noop}, options=options("w2")),
    ):
        rows = {(r.name, r.state.value): r for r in await scheduler.stats()}
    assert rows["email", "pending"].live_workers == 2
    assert rows["email", "pending"].pause_reason == "provider outage"
    assert rows["orphan", "pending"].live_workers == 0
    sms = rows["sms", "pending"]  # paused, no task: still listed, so the pause is seen
    assert sms.count == 0 and sms.paused and sms.pause_reason == ""
    after = {(r.name, r.state.value): r for r in await scheduler.stats()}
    assert after["email", "pending"].live_workers == 0  # both stopped
