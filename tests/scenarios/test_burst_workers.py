"""Workers that stop by themselves: ``burst`` (once nothing of their names may be claimed
now and their handlers are done) and ``max_tasks`` (after that many runs), as RQ's
``--burst`` and ``--max-jobs`` do. On every engine, with a manual clock: nothing sleeps."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

import mscheduler as ms
from mscheduler.handlers import Consumer
from mscheduler.testing import ManualClock
from tests.engines import worker

pytestmark = pytest.mark.anyio
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]


class Runs:
    """A handler that records the keys it ran; one named in ``fail`` raises, and while
    ``gate`` is set every run waits for it."""

    def __init__(self, *, fail: tuple[str, ...] = (), gate: anyio.Event | None = None) -> None:
        self.keys: list[str] = []
        self.fail = fail
        self.gate = gate

    async def __call__(self, task: ms.Task) -> Any:
        self.keys.append(task.key)
        if self.gate is not None:
            await self.gate.wait()
        if task.key in self.fail:
            raise RuntimeError(f"{task.key} broke")
        return task.key


async def run_until_stopped(consumer: Consumer, discover: Discover, *steps: Any) -> bool:
    """Run ``consumer``; after each discovery do the next of ``steps`` (a callable, awaited);
    True if it had stopped by itself by the end (else it is stopped here)."""
    async with anyio.create_task_group() as task_group:
        await task_group.start(consumer.run)
        await discover()
        for step in steps:
            await step()
            await discover()
        stopped = consumer.stop_requested
        consumer.stop()
    return stopped


async def states(sched: ms.Scheduler, *keys: str) -> list[S]:
    found = {task.key: task.state for task in await sched.store.get_many(list(keys))}
    return [found[key] for key in keys]


async def test_a_burst_worker_runs_what_is_due_then_stops(
    scheduler: ms.Scheduler, discover: Discover
):
    for n in range(5):
        await scheduler.publish(f"now:{n}", None, name="job")
    await scheduler.publish("later", None, name="job", delay=3_600)
    runs = Runs()
    consumer = scheduler.consumer({"job": runs}, options=worker(burst=True, max_running=2))
    assert await run_until_stopped(consumer, discover)
    assert consumer.done_by_itself == "burst"
    assert sorted(runs.keys) == [f"now:{n}" for n in range(5)]
    assert await states(scheduler, "later") == [S.PENDING], "due later: not waited for"


async def test_an_idle_burst_worker_stops_at_once(scheduler: ms.Scheduler, discover: Discover):
    consumer = scheduler.consumer({"job": Runs()}, options=worker(burst=True))
    assert await run_until_stopped(consumer, discover)


async def test_a_burst_worker_waits_for_its_running_handlers(
    scheduler: ms.Scheduler, discover: Discover
):
    await scheduler.publish("slow", None, name="job")
    gate = anyio.Event()
    runs = Runs(gate=gate)
    consumer = scheduler.consumer({"job": runs}, options=worker(burst=True))
    seen: list[bool] = []

    async def while_running() -> None:
        seen.append(consumer.stop_requested)
        # Published while the handler runs: claimable now, so it is run too.
        await scheduler.publish("meanwhile", None, name="job")
        gate.set()

    assert await run_until_stopped(consumer, discover, while_running)
    assert seen == [False], "stopped with a handler still running"
    assert sorted(runs.keys) == ["meanwhile", "slow"]
    assert await states(scheduler, "slow", "meanwhile") == [S.SUCCESS, S.SUCCESS]


async def test_a_retry_due_later_does_not_keep_a_burst_worker(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock
):
    opts = ms.TaskOptions(unexpected_retry_delay_ms=60_000)
    await scheduler.publish("flaky", None, name="job", options=opts)
    runs = Runs(fail=("flaky",))
    consumer = scheduler.consumer({"job": runs}, options=worker(burst=True))
    assert await run_until_stopped(consumer, discover)
    assert runs.keys == ["flaky"]
    task = await scheduler.get("flaky")
    assert task is not None and task.state is S.PENDING and task.retry_at is not None


async def test_a_paused_names_tasks_do_not_keep_a_burst_worker(
    scheduler: ms.Scheduler, discover: Discover
):
    await scheduler.publish("held", None, name="job")
    await scheduler.pause("job", "maintenance")
    consumer = scheduler.consumer({"job": Runs()}, options=worker(burst=True))
    assert await run_until_stopped(consumer, discover)
    assert await states(scheduler, "held") == [S.PENDING]


async def test_max_tasks_stops_after_that_many_runs(scheduler: ms.Scheduler, discover: Discover):
    for n in range(5):
        await scheduler.publish(f"k:{n}", None, name="job")
    runs = Runs()
    consumer = scheduler.consumer({"job": runs}, options=worker(max_tasks=3, max_running=10))
    assert await run_until_stopped(consumer, discover)
    assert consumer.done_by_itself == "max_tasks"
    assert len(runs.keys) == 3, "no more claimed than it may run"
    finished = await states(scheduler, *(f"k:{n}" for n in range(5)))
    assert sorted(finished) == sorted([S.SUCCESS] * 3 + [S.PENDING] * 2)


async def test_max_tasks_counts_failed_runs_too(scheduler: ms.Scheduler, discover: Discover):
    once = ms.TaskOptions(max_unexpected_retries=0)
    for key in ("a", "b", "c"):
        await scheduler.publish(key, None, name="job", options=once)
    runs = Runs(fail=("a", "b", "c"))
    consumer = scheduler.consumer({"job": runs}, options=worker(max_tasks=2, max_running=1))
    assert await run_until_stopped(consumer, discover)
    assert len(runs.keys) == 2


async def test_without_burst_or_max_tasks_a_worker_keeps_waiting(
    scheduler: ms.Scheduler, discover: Discover
):
    consumer = scheduler.consumer({"job": Runs()}, options=worker())
    assert not await run_until_stopped(consumer, discover)


@pytest.mark.parametrize("value", [0, -1])
def test_max_tasks_must_be_positive(value: int):
    with pytest.raises(ValidationError, match="max_tasks"):
        ms.WorkerOptions(max_tasks=value)
