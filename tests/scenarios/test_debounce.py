"""Debounced publishes: a burst of publishes of one key makes one run with the last payload,
and leaves a failed attempt waiting for its retry alone. Every engine, the manual clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError
from mscheduler.testing import ManualClock
from tests.engines import FAST, worker

pytestmark = pytest.mark.anyio
S = ms.TaskState


async def test_debounced_publishes_make_one_run_with_the_last_payload(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    ran: list[Any] = []

    async def reindex(task: ms.Task) -> None:
        ran.append(task.payload)

    async with scheduler.consumer({"reindex": reindex}, options=worker()):
        first = await scheduler.publish("reindex:42", {"v": 1}, name="reindex", debounce=5)
        assert first.created
        clock.advance(3)
        await discover()
        again = await scheduler.publish("reindex:42", {"v": 2}, name="reindex", debounce=5)
        assert not again.created and again.payload_updated
        assert again.task.not_before == clock.now() + dt.timedelta(seconds=5)
        clock.advance(3)  # the first window has passed, the second has not
        await discover()
        assert ran == []
        clock.advance(2.1)
        await discover()
        await discover()
    assert ran == [{"v": 2}]
    after = await scheduler.publish("reindex:42", {"v": 3}, name="reindex", debounce=5)
    assert not after.created and not after.payload_updated  # it ran: as publish says


async def test_a_debounce_leaves_a_failed_attempt_waiting_for_its_retry_alone(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """It started: its retry runs with the payload it had, when it was due (as publish)."""
    ran: list[Any] = []

    async def reindex(task: ms.Task) -> None:
        ran.append(task.payload)
        if len(ran) == 1:
            raise RuntimeError("first attempt fails")

    options = ms.TaskOptions(**FAST, max_unexpected_retries=1, unexpected_retry_delay_ms=10_000)
    async with scheduler.consumer({"reindex": reindex}, options=worker()):
        await scheduler.publish("reindex:42", {"v": 1}, name="reindex", options=options)
        await discover()
        assert ran == [{"v": 1}]
        again = await scheduler.publish(
            "reindex:42", {"v": 2}, name="reindex", options=options, debounce=60
        )
        assert not again.created and not again.payload_updated
        clock.advance(10)  # the retry's time, unchanged
        await discover()
        await discover()
    assert ran == [{"v": 1}, {"v": 1}]
    task = await scheduler.get("reindex:42")
    assert task is not None and task.state is S.SUCCESS and task.payload == {"v": 1}


async def test_a_bad_debounce_names_it(scheduler: ms.Scheduler):
    with pytest.raises(ConfigurationError, match="debounce: -1 seconds is not between"):
        await scheduler.publish("k", None, name="job", debounce=-1)
    with pytest.raises(ConfigurationError, match="give either debounce or delay"):
        await scheduler.publish("k", None, name="job", debounce=1, delay=1)
    assert await scheduler.get("k") is None
