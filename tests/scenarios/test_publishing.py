"""Publishing: a task per key, whatever the concurrency; what a repeated publish may change
(the payload of a waiting task, a finished task run again), and what it refuses."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError, TaskRunning
from mscheduler.models import PublishResult
from mscheduler.testing import ManualClock
from tests.scenarios.test_task_lifecycle import claim, current, must_claim

pytestmark = pytest.mark.anyio
S = ms.TaskState


async def test_publish_creates_a_pending_task(scheduler: ms.Scheduler, clock: ManualClock):
    result = await scheduler.publish("email:1", {"to": "a@b.c"}, name="email")
    assert result.created
    task = await current(scheduler, "email:1")
    assert task.state is S.PENDING
    assert task.payload == {"to": "a@b.c"}
    assert task.next_claim_at == clock.now()
    assert task.options == ms.TaskOptions()


async def test_publish_is_idempotent_by_key(scheduler: ms.Scheduler):
    first = await scheduler.publish("k", {"n": 1}, name="job")
    second = await scheduler.publish("k", {"n": 2}, name="job")
    assert (first.created, second.created) == (True, False)
    assert second.task.id == first.task.id
    assert second.task.payload == {"n": 1}, "a repeated publish must change nothing"
    assert second.task.version == first.task.version


async def test_fifty_concurrent_publishes_make_one_task(scheduler: ms.Scheduler):
    results: list[PublishResult] = []

    async def publish(i: int) -> None:
        results.append(await scheduler.publish("same", {"i": i}, name="job"))

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(publish, i)
    assert sum(r.created for r in results) == 1
    assert len({r.task.id for r in results}) == 1
    assert await scheduler.collection.count_documents({"key": "same"}) == 1


async def test_update_payload_changes_a_waiting_task(scheduler: ms.Scheduler):
    await scheduler.publish("k", {"n": 1}, name="job")
    result = await scheduler.publish("k", {"n": 2}, name="job", update_payload=True)
    assert result.payload_updated and not result.created
    assert (await current(scheduler, "k")).payload == {"n": 2}


async def test_running_task_is_never_replaced_or_updated(scheduler: ms.Scheduler):
    await scheduler.publish("k", {"n": 1}, name="job")
    await must_claim(scheduler, "w1")
    with pytest.raises(TaskRunning):
        await scheduler.publish("k", {"n": 2}, name="job", update_payload=True)
    with pytest.raises(TaskRunning):
        await scheduler.publish("k", {"n": 2}, name="job", replace_finished=True)
    assert (await current(scheduler, "k")).payload == {"n": 1}


@pytest.mark.parametrize("outcome", ["success", "fail"])
async def test_replace_finished_runs_the_task_again(scheduler: ms.Scheduler, outcome: str):
    opts = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("k", {"n": 1}, name="job", options=opts)
    lease = await must_claim(scheduler, "w1")
    if outcome == "success":
        await scheduler.store.tasks.succeed(lease, "done")
    else:
        await scheduler.store.tasks.fail(lease, RuntimeError("boom"))
    finished = await current(scheduler, "k")
    assert finished.state.value == outcome

    unchanged = await scheduler.publish("k", {"n": 2}, name="job")
    assert not unchanged.created and unchanged.task.state.value == outcome

    again = await scheduler.publish("k", {"n": 2}, name="job", replace_finished=True)
    assert again.replaced
    task = await current(scheduler, "k")
    assert (task.state, task.payload, task.worker_states) == (S.PENDING, {"n": 2}, [])
    assert task.id == finished.id and task.version > finished.version
    assert await claim(scheduler, "w1") is not None


async def test_publish_under_another_name_is_refused(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    with pytest.raises(ConfigurationError, match="name 'job'"):
        await scheduler.publish("k", None, name="other")


async def test_pydantic_payload_is_stored_as_plain_fields(scheduler: ms.Scheduler):
    from pydantic import BaseModel

    class Email(BaseModel):
        to: str
        at: dt.datetime

    when = dt.datetime(2030, 5, 1, tzinfo=dt.timezone.utc)
    await scheduler.publish("k", Email(to="x@y.z", at=when), name="email")
    assert (await current(scheduler, "k")).payload == {"to": "x@y.z", "at": "2030-05-01T00:00:00Z"}


async def test_an_option_publish_or_schedule_does_not_know_is_refused_writing_nothing(
    scheduler: ms.Scheduler,
):
    """The options are declared once and taken as keywords: one misspelt is refused as a
    signature that listed it would refuse it, not dropped."""
    options: dict[str, object] = {"delay_seconds": 5}
    with pytest.raises(TypeError, match="delay_seconds"):
        await scheduler.publish("email:1", name="email", **options)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay_seconds"):
        await scheduler.schedule("nightly", name="email", cron="0 3 * * *", **options)  # type: ignore[arg-type]
    assert await scheduler.get("email:1") is None
    assert await scheduler.schedules() == []


async def test_an_option_connect_own_or_replace_does_not_know_is_refused(
    scheduler: ms.Scheduler,
):
    """Their options too are declared once (`ConnectParams`, `OwnParams`, `TaskParams`) and
    taken as keywords: one misspelt, or a required one left out, is refused as a signature
    would refuse it, and nothing is written."""
    await scheduler.publish("email:1", name="email")
    misspelt: dict[str, Any] = {"worker": "w1"}
    with pytest.raises(TypeError, match="'worker'"):
        await scheduler.own(["email"], worker_id="w1", **misspelt)
    with pytest.raises(TypeError, match="worker_id"):
        await scheduler.own(["email"])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'delay'"):
        await scheduler.replace("email:1", name="email", delay=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'database_name'"):
        await ms.Scheduler.connect("memory://", database_name="app")  # type: ignore[call-arg]
    task = await scheduler.get("email:1")
    assert task is not None and task.state is ms.TaskState.PENDING and not task.worker_states
