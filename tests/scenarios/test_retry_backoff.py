"""A failure's retry delay grows with each unexpected failure (``retry_backoff``), up to a
maximum (``retry_backoff_max_ms``), spread by ``retry_jitter``; the defaults wait the same
``unexpected_retry_delay_ms`` after every failure. On every engine."""

from __future__ import annotations

import datetime as dt

import pytest

import mscheduler as ms
from mscheduler.constants import MAX_RETRY_DELAY_MS
from mscheduler.testing import ManualClock

pytestmark = pytest.mark.anyio


async def fail_once(sched: ms.Scheduler, clock: ManualClock) -> tuple[ms.Task, float]:
    """Claim the task ``k`` once it is due, fail its run, and return the task and the delay
    (in milliseconds) its failure set before the next claim."""
    task = await sched.get("k")
    assert task is not None and task.next_claim_at is not None
    if task.next_claim_at > clock.now():
        clock.advance((task.next_claim_at - clock.now()).total_seconds())
    lease = await sched.store.tasks.claim("w1", names=["job"])
    assert lease is not None, "the task is claimable once its retry is due"
    failed_at = clock.now()
    task = await sched.store.tasks.fail(lease, RuntimeError("boom"))
    assert task.retry_at is not None
    return task, (task.retry_at - failed_at) / dt.timedelta(milliseconds=1)


async def test_each_failure_waits_longer_up_to_the_maximum(
    scheduler: ms.Scheduler, clock: ManualClock
):
    opts = ms.TaskOptions(
        unexpected_retry_delay_ms=1_000,
        retry_backoff=2.0,
        retry_backoff_max_ms=5_000,
        max_unexpected_retries=10,
    )
    await scheduler.publish("k", None, name="job", options=opts)
    delays = [(await fail_once(scheduler, clock))[1] for _ in range(5)]
    assert delays == [1_000, 2_000, 4_000, 5_000, 5_000]


async def test_a_retry_is_not_claimable_before_its_grown_delay(
    scheduler: ms.Scheduler, clock: ManualClock
):
    opts = ms.TaskOptions(unexpected_retry_delay_ms=1_000, retry_backoff=3.0)
    await scheduler.publish("k", None, name="job", options=opts)
    await fail_once(scheduler, clock)
    await fail_once(scheduler, clock)  # the second failure waits 3 s
    clock.advance(2.999)
    assert await scheduler.store.tasks.claim("w1", names=["job"]) is None
    clock.advance(0.001)
    assert await scheduler.store.tasks.claim("w1", names=["job"]) is not None


async def test_jitter_spreads_each_delay_within_its_bounds(
    scheduler: ms.Scheduler, clock: ManualClock
):
    opts = ms.TaskOptions(
        unexpected_retry_delay_ms=10_000,
        retry_backoff=2.0,
        retry_backoff_max_ms=40_000,
        retry_jitter=0.5,
        max_unexpected_retries=20,
    )
    await scheduler.publish("k", None, name="job", options=opts)
    delays = [(await fail_once(scheduler, clock))[1] for _ in range(8)]
    unspread = [10_000, 20_000, 40_000, 40_000, 40_000, 40_000, 40_000, 40_000]
    for delay, middle in zip(delays, unspread, strict=True):
        assert middle * 0.5 <= delay <= middle * 1.5
        assert delay == int(delay), "a whole number of milliseconds"
    capped = delays[2:]
    assert len(set(capped)) > 1, "failures at the maximum still retry apart"


async def test_without_backoff_options_every_failure_waits_the_same_delay(
    scheduler: ms.Scheduler, clock: ManualClock
):
    opts = ms.TaskOptions(unexpected_retry_delay_ms=2_500, max_unexpected_retries=5)
    await scheduler.publish("k", None, name="job", options=opts)
    delays = [(await fail_once(scheduler, clock))[1] for _ in range(4)]
    assert delays == [2_500] * 4


async def test_backoff_options_are_stored_only_when_chosen(scheduler: ms.Scheduler):
    await scheduler.publish("plain", None, name="job")
    chosen = ms.TaskOptions(retry_backoff=2.0, retry_jitter=0.1, retry_backoff_max_ms=60_000)
    await scheduler.publish("backoff", None, name="job", options=chosen)
    plain = await scheduler.collection.find_one({"key": "plain"})
    assert plain is not None
    assert not {"retry_backoff", "retry_backoff_max_ms", "retry_jitter"} & set(plain["options"])
    stored = await scheduler.collection.find_one({"key": "backoff"})
    assert stored is not None
    assert stored["options"]["retry_backoff"] == 2.0
    assert stored["options"]["retry_backoff_max_ms"] == 60_000
    assert stored["options"]["retry_jitter"] == 0.1
    task = await scheduler.get("backoff")
    assert task is not None and task.options == chosen


async def test_a_steep_backoff_without_maximum_stops_growing(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Past the longest delay a task may wait, a growing delay without a maximum of its own
    stops there: the failure is still recorded, the retry still comes."""
    opts = ms.TaskOptions(
        unexpected_retry_delay_ms=86_400_000, retry_backoff=10.0, max_unexpected_retries=1_000
    )
    await scheduler.publish("k", None, name="job", options=opts)
    delays = [(await fail_once(scheduler, clock))[1] for _ in range(3)]
    assert delays == [86_400_000, 864_000_000, MAX_RETRY_DELAY_MS]
    # Hundreds of failures behind it (their states dropped from the history, counted):
    # ten to the power of their number is no finite number, the delay is still the longest.
    await scheduler.collection.update_one({"key": "k"}, {"$set": {"dropped_failures": 600}})
    task, delay = await fail_once(scheduler, clock)
    assert delay == MAX_RETRY_DELAY_MS
    assert task.state is ms.TaskState.PENDING and task.unexpected_failures == 604


async def test_show_and_the_task_page_tell_when_the_next_retry_comes(
    scheduler: ms.Scheduler, clock: ManualClock
):
    from mscheduler.cli.show import render
    from mscheduler.dashboard import create_app
    from tests.scenarios.test_dashboard import client, text_of

    opts = ms.TaskOptions(unexpected_retry_delay_ms=60_000, retry_backoff=2.0)
    await scheduler.publish("k", None, name="job", options=opts)
    await fail_once(scheduler, clock)
    task, _ = await fail_once(scheduler, clock)  # the second failure waits two minutes
    shown = render(task, clock.now())
    assert "retry at:" in shown and "(2.0m from now)" in shown
    assert "retry_backoff=2.0" in shown  # among the options that differ from the defaults
    async with client(create_app(scheduler)) as http:
        page = (await http.get("/tasks/k")).text
    assert "next retry in 2m" in text_of(page)
