"""``cancel_many``: every task of a name in some unfinished states cancelled in one call,
running ones only when named, their dependents told as after ``cancel``. On every engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError, LeaseLost
from tests.engines import worker

pytestmark = pytest.mark.anyio
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]


async def state_of(sched: ms.Scheduler, key: str) -> S:
    task = await sched.get(key)
    assert task is not None
    return task.state


async def fill(sched: ms.Scheduler) -> ms.Lease:
    """Of name ``job``: two pending, one blocked, one running (its lease returned), one
    finished; of name ``other``: one pending."""
    await sched.publish("p1", None, name="job")
    await sched.publish("p2", None, name="job")
    await sched.publish("gate", None, name="other")
    await sched.publish("b1", None, name="job", depends_on=["gate"])
    await sched.publish("r1", None, name="job")
    lease = await sched.store.tasks.claim("w1", key="r1")
    assert lease is not None
    await sched.publish("done", None, name="job")
    done = await sched.store.tasks.claim("w1", key="done")
    assert done is not None
    await sched.store.tasks.succeed(done, None)
    return lease


async def test_pending_and_blocked_tasks_of_the_name_are_cancelled(scheduler: ms.Scheduler):
    lease = await fill(scheduler)
    assert await scheduler.cancel_many(name="job") == 3
    states = {key: await state_of(scheduler, key) for key in ("p1", "p2", "b1", "r1", "done")}
    assert states == {
        "p1": S.CANCELLED,
        "p2": S.CANCELLED,
        "b1": S.CANCELLED,
        "r1": S.RUNNING,  # running ones only when named
        "done": S.SUCCESS,
    }
    assert await state_of(scheduler, "gate") is S.PENDING, "another name is left alone"
    task = await scheduler.get("p1")
    assert task is not None and task.error is not None and task.error.type == "Cancelled"
    await scheduler.store.tasks.ping(lease)  # the running one still holds its lease
    assert await scheduler.cancel_many(name="job") == 0, "nothing left to cancel"


async def test_running_tasks_are_cancelled_when_named_and_lose_their_lease(
    scheduler: ms.Scheduler,
):
    lease = await fill(scheduler)
    assert await scheduler.cancel_many(name="job", states=["running"]) == 1
    assert await state_of(scheduler, "r1") is S.CANCELLED
    assert await state_of(scheduler, "p1") is S.PENDING
    with pytest.raises(LeaseLost):
        await scheduler.store.tasks.ping(lease)


async def test_a_running_handler_is_stopped(scheduler: ms.Scheduler, discover: Discover):
    await scheduler.publish("long", None, name="job")
    started, stopped = anyio.Event(), anyio.Event()

    async def handler(task: ms.Task) -> Any:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()

    async with scheduler.consumer({"job": handler}, options=worker()):
        await discover()
        assert started.is_set()
        assert await scheduler.cancel_many(name="job", states=("pending", "running")) == 1
        await discover()
        assert stopped.is_set(), "the handler of a cancelled task is cancelled"
    assert await state_of(scheduler, "long") is S.CANCELLED


async def test_dependents_are_told_as_after_cancel(scheduler: ms.Scheduler):
    await scheduler.publish("extract", None, name="etl")
    await scheduler.publish("load", None, name="load", depends_on=["extract"])
    anyway = ms.TaskOptions(on_dependency_failure="run")
    await scheduler.publish("notify", None, name="load", depends_on=["extract"], options=anyway)
    assert await scheduler.cancel_many(name="etl") == 1
    assert await state_of(scheduler, "load") is S.CANCELLED
    assert await state_of(scheduler, "notify") is S.PENDING


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (["success"], "states: only unfinished tasks"),
        (["pending", "fail"], "states: only unfinished tasks"),
        (["nope"], "states: 'nope' is not one of"),
        ("pending", "states: expected a non-empty list"),
        ([], "states: expected a non-empty list"),
    ],
)
async def test_bad_states_are_refused_naming_states_and_nothing_is_cancelled(
    scheduler: ms.Scheduler, states: Any, message: str
):
    await scheduler.publish("p1", None, name="job")
    with pytest.raises(ConfigurationError, match=message):
        await scheduler.cancel_many(name="job", states=states)
    assert await state_of(scheduler, "p1") is S.PENDING


async def test_a_bad_name_is_refused(scheduler: ms.Scheduler):
    with pytest.raises(ConfigurationError, match="name"):
        await scheduler.cancel_many(name="")
