"""Batch handlers (`batch`): one call for the tasks claimed together, one result per task,
each task with its own lease, pings and retries. Every engine, the manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError
from mscheduler.handlers import batch
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, until_idle

pytestmark = pytest.mark.anyio
Discover = Callable[[], Awaitable[None]]


def _options(**fields: object) -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS, **fields)  # type: ignore[arg-type]


async def _until(clock: ManualClock, done: Callable[[], bool], step: float = 0.0) -> None:
    with anyio.fail_after(30):
        while not done():
            await until_idle()
            clock.advance(step or POLL_MS / 1000)


async def test_a_batch_gets_the_tasks_claimed_together_and_each_its_own_result(
    scheduler: ms.Scheduler, clock: ManualClock
):
    calls: list[list[str]] = []

    async def handle(tasks: list[ms.Task]) -> list[int]:
        calls.append([task.key for task in tasks])
        return [task.payload * 10 for task in tasks]

    await scheduler.publish_many(ms.TaskSpec(key=f"t{n}", name="job", payload=n) for n in range(12))
    handlers = {"job": batch(handle, max_size=5, max_wait=dt.timedelta(seconds=1))}
    async with scheduler.consumer(handlers, options=_options(max_running=10)):
        await _until(clock, lambda: sum(map(len, calls)) == 12)
    assert sorted(map(len, calls)) == [2, 5, 5]  # two full, the rest after max_wait
    for n in range(12):
        task = await scheduler.get(f"t{n}")
        assert task is not None and task.state is ms.TaskState.SUCCESS and task.result == n * 10


async def test_a_batch_waits_at_most_max_wait_to_fill(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    calls: list[int] = []

    def handle(tasks: list[ms.Task]) -> list[None]:  # a plain def: run in a worker thread
        calls.append(len(tasks))
        return [None] * len(tasks)

    handlers = {"job": batch(handle, max_size=50, max_wait=dt.timedelta(seconds=5))}
    async with scheduler.consumer(handlers, options=_options(max_running=50)):
        await discover()
        await scheduler.publish_many(ms.TaskSpec(key=f"t{n}", name="job") for n in range(3))
        await discover()
        clock.advance(4)
        await until_idle()
        assert calls == []
        clock.advance(1)
        await _until(clock, lambda: calls == [3])


async def test_an_exception_fails_that_attempt_of_every_task_of_the_batch(
    scheduler: ms.Scheduler, clock: ManualClock
):
    tries: list[int] = []

    async def handle(tasks: list[ms.Task]) -> list[str]:
        tries.append(len(tasks))
        if len(tries) == 1:
            raise RuntimeError("the bulk API is down")
        return ["ok"] * len(tasks)

    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=1_000)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"t{n}", name="job", options=options) for n in range(4)
    )
    handlers = {"job": batch(handle, max_size=4, max_wait=dt.timedelta(seconds=1))}
    async with scheduler.consumer(handlers, options=_options(max_running=4, handler_retries=0)):
        await _until(clock, lambda: sum(tries) == 8, step=0.5)
    assert tries == [4, 4]
    for n in range(4):
        task = await scheduler.get(f"t{n}")
        assert task is not None and task.state is ms.TaskState.SUCCESS
        assert [ws.state for ws in task.worker_states] == [
            WorkerStateKind.FAIL,
            WorkerStateKind.SUCCESS,
        ]


async def test_a_wrong_number_of_results_fails_the_attempts(
    scheduler: ms.Scheduler, clock: ManualClock
):
    async def handle(tasks: list[ms.Task]) -> list[int]:
        return [1]

    options = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"t{n}", name="job", options=options) for n in range(2)
    )
    handlers = {"job": batch(handle, max_size=2, max_wait=dt.timedelta(seconds=1))}
    async with scheduler.consumer(handlers, options=_options(max_running=2, handler_retries=0)):

        async def failed() -> bool:
            tasks = [await scheduler.get(f"t{n}") for n in range(2)]
            return all(t is not None and t.state is ms.TaskState.FAIL for t in tasks)

        with anyio.fail_after(30):
            while not await failed():
                await until_idle()
                clock.advance(0.5)


def test_batch_refuses_bad_arguments_naming_the_field() -> None:
    with pytest.raises(ConfigurationError, match="max_size"):
        batch(lambda tasks: tasks, max_size=0)
    with pytest.raises(ConfigurationError, match="max_wait"):
        batch(lambda tasks: tasks, max_wait=-1)


async def test_a_start_under_a_rate_counts_from_when_its_batch_is_called(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """A task waits ``max_wait`` for its batch to fill: its start counts against its name's
    rate for ``per`` from the batch's call, when its handler really starts."""
    per = dt.timedelta(seconds=60)
    await scheduler.set_limit("job", rate=1, per=per)
    calls: list[dt.datetime] = []

    async def handle(tasks: list[ms.Task]) -> list[None]:
        calls.append(clock.now())
        return [None] * len(tasks)

    await scheduler.publish("t0", None, name="job")
    handlers = {"job": batch(handle, max_size=5, max_wait=dt.timedelta(seconds=5))}
    async with scheduler.consumer(handlers, options=_options(max_running=5)):
        await discover()
        assert calls == []
        clock.advance(5)
        await _until(clock, lambda: len(calls) == 1)
    [start] = (await scheduler.limits())["job"].starts
    assert start.until is not None and start.until >= calls[0] + per
