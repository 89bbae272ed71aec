"""Progress, expiry before start, debounce, pause and resume. Every engine, the manual clock,
consumers as users run them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest

import mscheduler as ms
from tests.engines import POLL_MS, settle

pytestmark = pytest.mark.anyio
S = ms.TaskState
FAST = {"ping_interval_ms": 1_000, "worker_timeout_ms": 5_000}


def worker(**fields: Any) -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id="w1", poll_interval_ms=POLL_MS, **fields)


# ------------------------------------------------------------------------ progress


async def test_progress_is_visible_within_a_second_coalesced_and_cleared_at_the_end(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
):
    """The first report is written at once, later ones at most once a second per task, and
    the reports of several tasks go in one write; cleared when the attempt ends."""
    gate, step = anyio.Event(), anyio.Event()
    reported: dict[str, anyio.Event] = {"a": anyio.Event(), "b": anyio.Event()}

    async def resize(task: ms.Task) -> None:
        await ms.current_lease().progress(0.1, "started")
        reported[task.key].set()
        await step.wait()
        for done in (2, 3, 4):  # a tight loop of reports: one write for them all
            await ms.current_lease().progress(done / 10, f"resized {done}0/100")
        await gate.wait()

    options = ms.TaskOptions(ping_interval_ms=30_000, worker_timeout_ms=60_000)
    for key in reported:
        await scheduler.publish(key, None, name="resize", options=options)
    async with scheduler.consumer({"resize": resize}, options=worker()) as consumer:
        await discover()
        for event in reported.values():
            await event.wait()
        await settle()
        for key in reported:
            task = await scheduler.get(key)
            assert task is not None and task.progress is not None, "not written at once"
            assert (task.progress.fraction, task.progress.message) == (0.1, "started")
        pings = consumer.stats.pings
        step.set()
        await settle()
        clock.advance(0.5)
        await settle()
        assert consumer.stats.pings == pings, "more than one write a second"
        clock.advance(0.5)
        await settle()
        assert consumer.stats.pings == pings + 1, "one write for both tasks"
        for key in reported:
            task = await scheduler.get(key)
            assert task is not None and task.progress is not None
            assert (task.progress.fraction, task.progress.message) == (0.4, "resized 40/100")
            assert task.progress.worker_id == "w1" and task.progress.at == clock.now()
        gate.set()
        await settle()
    for key in reported:
        task = await scheduler.get(key)
        assert task is not None and task.state is S.SUCCESS and task.progress is None


async def test_bad_progress_names_the_field(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    lease = await scheduler.store.claim("w", key="k")
    assert lease is not None
    with pytest.raises(ms.ConfigurationError, match="progress: fraction: Input should be less"):
        await lease.progress(1.5)
    with pytest.raises(ms.ConfigurationError, match="progress: message: String should have"):
        await lease.progress(0.5, "x" * 1001)
    assert lease.reported_progress is None


# ------------------------------------------------------------------------ expiry


async def test_a_task_not_started_by_expires_at_is_cancelled_and_never_claimed(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
):
    expires = clock.now() + dt.timedelta(seconds=10)
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    await scheduler.publish("late", None, name="job", options=ms.TaskOptions(expires_at=expires))
    clock.advance(10)
    assert await scheduler.store.claim("w", key="late") is None  # expired: never claimed
    async with scheduler.consumer({"job": job}, options=worker()):
        await discover()
    task = await scheduler.get("late")
    assert ran == [] and task is not None and task.state is S.CANCELLED
    assert task.error is not None and task.error.message.startswith("expired: not started by")


async def test_a_task_started_before_it_expires_runs_to_the_end(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
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
            await settle()
        gate.set()
        await discover()
    task = await scheduler.get("early")
    assert task is not None and task.state is S.SUCCESS and task.result == "done"


# ------------------------------------------------------------------------ debounce


async def test_debounced_publishes_make_one_run_with_the_last_payload(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
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
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
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
    with pytest.raises(ms.ConfigurationError, match="debounce: -1 seconds is not between"):
        await scheduler.publish("k", None, name="job", debounce=-1)
    with pytest.raises(ms.ConfigurationError, match="give either debounce or delay"):
        await scheduler.publish("k", None, name="job", debounce=1, delay=1)
    assert await scheduler.get("k") is None


# ------------------------------------------------------------------------ pause and resume


async def test_a_paused_name_is_not_claimed_until_resumed(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
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
