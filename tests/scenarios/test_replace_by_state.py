"""``replace_finished`` by state: a finished task whose state is named is published anew,
one in another state is left as it is; the same in publish, publish_many (specs) and
commit, with bad values refused naming ``replace_finished``. On every engine."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import mscheduler as ms
from mscheduler.errors import ConfigurationError, TaskRunning
from tests.scenarios.test_dependencies import finish

pytestmark = pytest.mark.anyio
S = ms.TaskState
ONCE = ms.TaskOptions(max_unexpected_retries=0)


async def ended(sched: ms.Scheduler, key: str, outcome: str) -> ms.Task:
    """A task ``key`` that ended ``success``, ``fail`` or ``cancelled``."""
    await sched.publish(key, {"run": 1}, name="job", options=ONCE)
    if outcome == "cancelled":
        assert await sched.cancel(key)
    else:
        await finish(sched, key, outcome)
    task = await sched.get(key)
    assert task is not None and task.state.value == outcome
    return task


@pytest.mark.parametrize("outcome", ["fail", "cancelled"])
async def test_a_task_in_a_named_state_is_published_anew(scheduler: ms.Scheduler, outcome: str):
    before = await ended(scheduler, "k", outcome)
    again = await scheduler.publish(
        "k", {"run": 2}, name="job", replace_finished=("fail", "cancelled")
    )
    assert again.replaced and not again.created
    assert (again.task.state, again.task.payload, again.task.runs) == (S.PENDING, {"run": 2}, 2)
    assert again.task.version > before.version


async def test_a_task_in_another_finished_state_is_left_as_it_is(scheduler: ms.Scheduler):
    before = await ended(scheduler, "k", "success")
    again = await scheduler.publish(
        "k", {"run": 2}, name="job", replace_finished=[S.FAIL, S.CANCELLED]
    )
    assert not again.created and not again.replaced
    assert (again.task.state, again.task.payload) == (S.SUCCESS, {"run": 1})
    assert again.task.version == before.version


async def test_true_still_replaces_every_finished_state(scheduler: ms.Scheduler):
    for outcome in ("success", "fail", "cancelled"):
        await ended(scheduler, outcome, outcome)
        again = await scheduler.publish(outcome, None, name="job", replace_finished=True)
        assert again.replaced, outcome


async def test_a_waiting_or_running_task_is_not_replaced(scheduler: ms.Scheduler):
    await scheduler.publish("waiting", {"run": 1}, name="job")
    left = await scheduler.publish("waiting", {"run": 2}, name="job", replace_finished=["fail"])
    assert not left.created and not left.replaced and left.task.payload == {"run": 1}
    await scheduler.publish("running", None, name="job")
    assert await scheduler.store.tasks.claim("w1", key="running") is not None
    with pytest.raises(TaskRunning):
        await scheduler.publish("running", None, name="job", replace_finished=["fail"])


@pytest.mark.parametrize("value", ["fail", ["running"], ("fail", "pending"), ["nope"], 3, None])
async def test_anything_else_is_refused_naming_replace_finished(
    scheduler: ms.Scheduler, value: Any
):
    await ended(scheduler, "k", "fail")
    with pytest.raises(ConfigurationError, match="replace_finished"):
        await scheduler.publish("k", {"run": 2}, name="job", replace_finished=value)
    task = await scheduler.get("k")
    assert task is not None and task.state is S.FAIL and task.payload == {"run": 1}
    with pytest.raises(ValidationError, match="replace_finished"):
        ms.TaskSpec(key="k", name="job", replace_finished=value)


async def test_publish_many_replaces_by_state_and_the_flow_waits_for_the_new_run(
    scheduler: ms.Scheduler,
):
    await ended(scheduler, "extract", "fail")
    await ended(scheduler, "done", "success")
    again = ("fail", "cancelled")
    flow = ms.chain(
        ms.TaskSpec(key="extract", name="job", payload={"run": 2}, replace_finished=again),
        ms.TaskSpec(key="load", name="job"),
    )
    kept = ms.TaskSpec(key="done", name="job", payload={"run": 2}, replace_finished=again)
    results = await scheduler.publish_many([flow, kept])
    by_key = {r.task.key: r for r in results}
    assert by_key["extract"].replaced and by_key["extract"].task.state is S.PENDING
    assert by_key["load"].created and by_key["load"].task.state is S.BLOCKED
    assert not by_key["done"].replaced and by_key["done"].task.payload == {"run": 1}
    await finish(scheduler, "extract")
    load = await scheduler.get("load")
    assert load is not None and load.state is S.PENDING, "the new run's success frees it"


async def test_publish_many_refuses_to_replace_a_running_task_and_writes_nothing(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("busy", None, name="job")
    assert await scheduler.store.tasks.claim("w1", key="busy") is not None
    batch = [
        ms.TaskSpec(key="new", name="job"),
        ms.TaskSpec(key="busy", name="job", replace_finished=True),
    ]
    with pytest.raises(TaskRunning, match="nothing written"):
        await scheduler.publish_many(batch)
    assert await scheduler.get("new") is None


async def test_commit_publishes_a_spec_anew_by_its_state(scheduler: ms.Scheduler):
    await ended(scheduler, "k", "cancelled")
    [result] = await scheduler.commit(
        publish=[ms.TaskSpec(key="k", name="job", replace_finished=["cancelled"])]
    )
    assert result.replaced and result.task.state is S.PENDING
