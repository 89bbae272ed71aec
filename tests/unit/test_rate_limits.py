"""Limits per name (issue 14 #2): never exceeded in any window, under many consumers at once;
a consumer at the limit sleeps until the window frees. Both engines, the manual clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest

import mscheduler as ms
from tests.engines import POLL_MS, settle

pytestmark = pytest.mark.anyio


def worker(**fields: Any) -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS, **fields)


async def test_five_consumers_never_exceed_the_rate_in_any_window(
    scheduler: ms.Scheduler, clock: ms.ManualClock, engine: str
):
    tasks = 1_000 if engine == "memory" else 200  # the wire engine is ~10x slower per call
    await scheduler.set_limit("email", rate=100, per=dt.timedelta(minutes=1))
    ran = 0

    async def email(task: ms.Task) -> None:
        nonlocal ran
        ran += 1

    # A start is counted when its claim's token is taken (a round trip before the claim):
    # read them from the limit's document after each step, before they age out of it.
    tokens: dict[str, dt.datetime] = {}
    await scheduler.publish_many(ms.TaskSpec(key=f"m{n}", name="email") for n in range(tasks))
    options = worker(max_running=8)
    async with scheduler.consumers({"email": email}, count=5, options=options) as group:
        with anyio.fail_after(300):
            while ran < tasks:
                clock.advance(1)
                await settle()
                limit = (await scheduler.limits())["email"]
                for entry in limit.starts:
                    assert entry.until is not None
                    tokens[entry.id] = entry.until - dt.timedelta(minutes=1)
    starts = list(tokens.values())
    starts.sort()
    window = dt.timedelta(minutes=1)
    busiest = max(
        sum(1 for later in starts[i:] if later < start + window) for i, start in enumerate(starts)
    )
    assert busiest == 100, busiest  # the limit, reached and never passed
    minutes = (starts[-1] - starts[0]).total_seconds() / 60
    assert minutes >= tasks / 100 - 1  # it took as long as the rate demands
    # Each consumer, at the limit, slept until the window freed instead of asking again:
    # a few refusals per window, not one per loop.
    refusals = sum(consumer.stats.limited for consumer in group)
    assert refusals <= 5 * 4 * (tasks / 100 + 1), refusals


async def test_max_running_holds_across_consumers(
    scheduler: ms.Scheduler, clock: ms.ManualClock, discover: Any
):
    await scheduler.set_limit("render", max_running=2)
    running, most = 0, 0
    gates = [anyio.Event() for _ in range(6)]

    async def render(task: ms.Task) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await gates[int(task.payload)].wait()
        finally:
            running -= 1

    for n in range(6):
        await scheduler.publish(f"r{n}", n, name="render")
    async with scheduler.consumers({"render": render}, count=3, options=worker(max_running=4)):
        await discover()
        assert running == 2
        for gate in gates:
            gate.set()
            await discover()
            clock.advance(1)  # the other consumers ask again each second
            await discover()
            assert running <= 2
    assert most == 2
    finished = [await scheduler.get(f"r{n}") for n in range(6)]
    assert all(t is not None and t.state is ms.TaskState.SUCCESS for t in finished)
    limit = (await scheduler.limits())["render"]
    assert [slot for slot in limit.slots if slot.until and slot.until > clock.now()] == []


async def test_a_crashed_holders_slot_frees_with_its_lease(
    scheduler: ms.Scheduler, clock: ms.ManualClock
):
    await scheduler.set_limit("render", max_running=1)
    until = clock.now() + dt.timedelta(seconds=5)
    token = await scheduler.store.limits.acquire("render", until)  # a worker that then died
    assert isinstance(token, str)
    # Full: ask again in a second (a slot may free at any moment), and so on until then.
    assert await scheduler.store.limits.acquire("render", until) == clock.now() + dt.timedelta(
        seconds=1
    )
    clock.advance(4.9)
    assert not isinstance(await scheduler.store.limits.acquire("render", until), str)
    clock.advance(0.101)
    assert isinstance(await scheduler.store.limits.acquire("render", until), str)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rate": 0, "per": dt.timedelta(minutes=1)}, "rate: expected an integer from 1"),
        ({"rate": 10}, "per: give rate and per together"),
        ({"rate": 10, "per": dt.timedelta(0)}, "per: expected a timedelta from 1 ms"),
        ({"max_running": True}, "max_running: expected an integer"),
        ({}, "give rate and per, max_running, or both"),
    ],
)
async def test_a_bad_limit_names_the_field_and_writes_nothing(
    scheduler: ms.Scheduler, fields: dict[str, Any], message: str
):
    with pytest.raises(ms.ConfigurationError, match=message):
        await scheduler.set_limit("email", **fields)
    assert await scheduler.limits() == {}
