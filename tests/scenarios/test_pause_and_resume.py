"""Pausing a name: its tasks are not claimed until it is resumed. Every engine, the manual
clock, consumers as users run them."""

from __future__ import annotations

from typing import Any

import pytest

import mscheduler as ms
from mscheduler.errors import BackendUnavailable
from mscheduler.testing import ManualClock
from tests.engines import worker
from tests.faults import LosesBesideWrites

pytestmark = pytest.mark.anyio
S = ms.TaskState


async def test_a_paused_name_is_not_claimed_until_resumed(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    async def other(task: ms.Task) -> None:
        ran.append(task.key)

    handlers = {"email": job, "sms": other}
    async with scheduler.consumers(handlers, count=2, options=worker()) as group:
        assert await scheduler.pause("email", reason="SMTP quota") is True
        assert await scheduler.pause("email") is False
        await discover()
        assert all(consumer.paused == {"email"} for consumer in group)
        await scheduler.publish("mail", None, name="email")
        await scheduler.publish("text", None, name="sms")
        await discover()
        await discover()
        assert ran == ["text"], "a paused name was claimed"
        rows = {(row.name, row.state): row.paused for row in await scheduler.stats()}
        assert rows[("email", S.PENDING)] is True and rows[("sms", S.SUCCESS)] is False
        assert set(await scheduler.paused()) == {"email"}
        assert await scheduler.resume("email") is True
        await discover()
        await discover()
    assert ran == ["text", "mail"]
    assert await scheduler.resume("email") is False


@pytest.mark.parametrize("change", ["pause", "resume"])
@pytest.mark.parametrize("retried", [True, False], ids=["retried", "not_retried"])
async def test_a_pause_or_resume_whose_signal_is_lost_still_reaches_the_consumers(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, change: str, retried: bool
):
    """The pause (or resume) is written and the version bump that tells the consumers of it
    is lost on the network: retried (it finds the change made), the call tells them at once;
    not retried, they read their controls again within ``schedule_refresh_ms`` anyway."""
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    if change == "resume":
        await scheduler.pause("email")
    operator = ms.Scheduler(LosesBesideWrites(scheduler.collection, ".controls"), clock=clock)
    options = worker()
    async with scheduler.consumer({"email": job}, options=options) as consumer:
        await discover()
        with pytest.raises(BackendUnavailable):
            await getattr(operator, change)("email")
        if retried:
            assert await getattr(operator, change)("email") is False  # made already
        else:
            clock.advance(options.schedule_refresh_ms / 1000)
        await discover()
        assert consumer.paused == ({"email"} if change == "pause" else set())
        await scheduler.publish("mail", None, name="email")
        await discover()
        await discover()
        assert ran == ([] if change == "pause" else ["mail"])
