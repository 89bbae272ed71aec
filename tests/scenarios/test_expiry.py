"""Expiry before start: a task not started by its `expires_at` is cancelled and never claimed;
one started in time runs to the end. Every engine, the manual clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.testing import ManualClock
from tests.engines import FAST, until_idle, worker

pytestmark = pytest.mark.anyio
S = ms.TaskState


async def test_a_task_not_started_by_expires_at_is_cancelled_and_never_claimed(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    expires = clock.now() + dt.timedelta(seconds=10)
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    await scheduler.publish("late", None, name="job", options=ms.TaskOptions(expires_at=expires))
    clock.advance(10)
    assert await scheduler.store.tasks.claim("w", key="late") is None  # expired: never claimed
    async with scheduler.consumer({"job": job}, options=worker()):
        await discover()
    task = await scheduler.get("late")
    assert ran == [] and task is not None and task.state is S.CANCELLED
    assert task.error is not None and task.error.message.startswith("expired: not started by")


async def test_a_task_started_before_it_expires_runs_to_the_end(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    gate = anyio.Event()

    async def job(task: ms.Task) -> str:
        await gate.wait()
        return "done"

    options = ms.TaskOptions(expires_at=clock.now() + dt.timedelta(seconds=10), **FAST)
    await scheduler.publish("early", None, name="job", options=options)
    async with scheduler.consumer({"job": job}, options=worker(schedule_refresh_ms=1_000)):
        await discover()
        for _ in range(15):  # past the expiry, pinged, swept every second
            clock.advance(1)
            await until_idle()
        gate.set()
        await discover()
    task = await scheduler.get("early")
    assert task is not None and task.state is S.SUCCESS and task.result == "done"
