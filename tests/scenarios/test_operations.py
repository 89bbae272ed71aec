"""Operating the queue: list, retry (the dead-letter queue), purge, TTL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable

import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError, TaskNotFound
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.scenarios.test_consumer import Recorder, consumers
from tests.scenarios.test_dependencies import finish

pytestmark = pytest.mark.anyio
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]
NO_RETRY = ms.TaskOptions(max_unexpected_retries=0)


async def test_list_newest_first_with_filters(scheduler: ms.Scheduler):
    for n in range(5):
        await scheduler.publish(f"e{n}", None, name="email")
    await scheduler.publish("s0", None, name="sms")
    await finish(scheduler, "e0")
    assert [t.key for t in await scheduler.list_tasks(limit=3)] == ["s0", "e4", "e3"]
    assert [t.key for t in await scheduler.list_tasks(name="email", state="success")] == ["e0"]
    with pytest.raises(ConfigurationError, match="'done' is not one of pending"):
        await scheduler.list_tasks(state="done")


async def test_retry_runs_a_failed_task_again(scheduler: ms.Scheduler):
    await scheduler.publish("k", {"to": "x"}, name="email", options=NO_RETRY)
    await finish(scheduler, "k", "fail")
    result = await scheduler.retry("k")
    assert result.replaced and result.task.state is S.PENDING
    assert result.task.payload == {"to": "x"} and result.task.options == NO_RETRY
    assert result.task.worker_states == []


async def test_a_retried_task_keeps_the_attempts_of_its_earlier_runs(
    scheduler: ms.Scheduler, clock: ManualClock
):
    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    first = await scheduler.publish("k", {"to": "x"}, name="email", options=options)
    await finish(scheduler, "k", "fail")
    clock.advance(5)
    await finish(scheduler, "k", "fail")
    clock.advance(60)
    retried = (await scheduler.retry("k")).task
    assert retried.state is S.PENDING and retried.worker_states == [] and retried.error is None
    assert retried.runs == 2 and retried.first_created_at == first.task.created_at
    assert [
        (a.run, a.state, a.error.type if a.error else None) for a in retried.earlier_attempts
    ] == [
        (1, WorkerStateKind.FAIL, "RuntimeError"),
        (1, WorkerStateKind.FAIL, "RuntimeError"),
    ]
    assert retried.earlier_attempts[1].started_at == first.task.created_at + dt.timedelta(seconds=5)
    await finish(scheduler, "k")
    again = await scheduler.publish("k", {"to": "y"}, name="email", replace_finished=True)
    task = again.task
    assert again.replaced and task.runs == 3 and task.attempts == 0
    assert [(a.run, a.state) for a in task.earlier_attempts][-1] == (2, WorkerStateKind.SUCCESS)
    assert task.earlier_attempts[-1].result is None, "an earlier run's result is not carried"
    assert task.attempts_in_all == 3
    assert await scheduler.get("k") == task


async def test_the_history_of_earlier_runs_is_bounded_and_counted(scheduler: ms.Scheduler):
    from mscheduler import constants as c

    runs = c.KEPT_EARLIER_ATTEMPTS + 3
    await scheduler.publish("k", None, name="email", options=NO_RETRY)
    for _ in range(runs):
        await finish(scheduler, "k", "fail")
        await scheduler.retry("k")
    task = await scheduler.get("k")
    assert task is not None and task.runs == runs + 1
    assert len(task.earlier_attempts) == c.KEPT_EARLIER_ATTEMPTS
    assert task.earlier_dropped == 3 and task.attempts_in_all == runs
    assert [a.run for a in task.earlier_attempts] == list(range(4, runs + 1))


async def test_retry_with_dependents_revives_those_the_failure_cancelled(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("a", None, name="job", options=NO_RETRY)
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    await scheduler.publish("c", None, name="job", depends_on=["b"])
    await scheduler.publish("kept", None, name="job", depends_on=["a"])
    await scheduler.cancel("kept", "not wanted")  # cancelled by an operator: stays so
    await finish(scheduler, "a", "fail")
    assert [(await scheduler.get(k)).state for k in "bc"] == [S.CANCELLED] * 2  # type: ignore[union-attr]
    plain = await scheduler.retry("a")
    assert plain.revived == []
    assert (await scheduler.get("b")).state is S.CANCELLED  # type: ignore[union-attr]
    await finish(scheduler, "a", "fail")
    result = await scheduler.retry("a", with_dependents=True)
    assert result.task.state is S.PENDING and result.revived == ["b", "c"]
    assert [(await scheduler.get(k)).state for k in "bc"] == [S.BLOCKED] * 2  # type: ignore[union-attr]
    kept = await scheduler.get("kept")
    assert kept is not None and kept.state is S.CANCELLED and kept.error is not None
    assert kept.error.type == "Cancelled", "the failure rewrote why it was cancelled"
    await finish(scheduler, "a")
    assert (await scheduler.get("b")).state is S.PENDING  # type: ignore[union-attr]


async def test_a_retry_that_raced_a_run_to_success_does_not_run_it_again(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch
):
    """Between the retry's read of the failed task and its write, another retry ran it to
    success: the retry decides again on what is there (a success: refused), and the work is
    not run a second time."""
    await scheduler.publish("k", None, name="job", options=NO_RETRY)
    await finish(scheduler, "k", "fail")
    store = scheduler.store
    read = store.get
    raced = False

    async def get_then_race(key: str) -> ms.Task | None:
        nonlocal raced
        task = await read(key)
        if key == "k" and not raced:
            raced = True
            monkeypatch.setattr(store, "get", read)
            await scheduler.retry("k")  # someone else's retry ...
            await finish(scheduler, "k")  # ... which then ran and succeeded
        return task

    monkeypatch.setattr(store, "get", get_then_race)
    with pytest.raises(ConfigurationError, match="is success: only failed or cancelled"):
        await scheduler.retry("k")
    task = await scheduler.get("k")
    assert task is not None and task.state is S.SUCCESS and task.runs == 2


async def test_retry_with_dependents_leaves_a_dependent_an_operator_cancelled_meanwhile(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch
):
    """Between finding the dependents the failure cancelled and reviving them, one was run
    again on its own and then cancelled by an operator: that cancel stands."""
    await scheduler.publish("a", None, name="job", options=NO_RETRY)
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    await finish(scheduler, "a", "fail")
    operations = scheduler.store.operations
    find = operations.cancelled_by

    async def find_then_race(key: str) -> list[ms.Task]:
        found = await find(key)
        if key == "a":
            await scheduler.retry("b")
            await scheduler.cancel("b", "operator: not wanted")
        return found

    monkeypatch.setattr(operations, "cancelled_by", find_then_race)
    result = await scheduler.retry("a", with_dependents=True)
    b = await scheduler.get("b")
    assert result.revived == []
    assert b is not None and b.state is S.CANCELLED and b.error is not None
    assert b.error.type == "Cancelled" and b.runs == 2


async def test_retry_refuses_what_did_not_fail(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="email")
    with pytest.raises(ConfigurationError, match="is pending: only failed or cancelled"):
        await scheduler.retry("k")
    with pytest.raises(TaskNotFound):
        await scheduler.retry("nope")


async def test_retry_failed_drains_the_dead_letter_queue(scheduler: ms.Scheduler):
    for key, name in [("a", "email"), ("b", "email"), ("c", "sms")]:
        await scheduler.publish(key, None, name=name, options=NO_RETRY)
        await finish(scheduler, key, "fail")
    assert sorted(r.task.key for r in await scheduler.retry_failed(name="email")) == ["a", "b"]
    assert (await scheduler.get("c")).state is S.FAIL  # type: ignore[union-attr]


async def test_purge_deletes_finished_tasks_by_age(scheduler: ms.Scheduler, clock):
    await scheduler.publish("old", None, name="job")
    await finish(scheduler, "old")
    clock.advance(8 * 86_400)
    await scheduler.publish("recent", None, name="job")
    await finish(scheduler, "recent")
    await scheduler.publish("waiting", None, name="job")
    clock.advance(86_400)
    deleted = await scheduler.purge(states=["success"], older_than=dt.timedelta(days=7))
    assert deleted == 1
    assert await scheduler.get("old") is None
    assert await scheduler.get("recent") is not None and await scheduler.get("waiting") is not None
    with pytest.raises(ConfigurationError, match="only finished tasks"):
        await scheduler.purge(states=["pending"], older_than=dt.timedelta(0))


async def test_finished_ttl_index(scheduler: ms.Scheduler):
    names = await scheduler.ensure_indexes(finished_ttl=dt.timedelta(days=30))
    assert "finished_ttl" in names
    info = await scheduler.collection.index_information()
    assert info["finished_ttl"]["expireAfterSeconds"] == 30 * 86_400


async def test_a_changed_finished_ttl_updates_the_index(scheduler: ms.Scheduler):
    await scheduler.ensure_indexes(finished_ttl=dt.timedelta(days=30))
    await scheduler.ensure_indexes(finished_ttl=dt.timedelta(days=7))
    info = await scheduler.collection.index_information()
    assert info["finished_ttl"]["expireAfterSeconds"] == 7 * 86_400


async def test_the_ttl_waits_until_the_dependents_are_told(scheduler: ms.Scheduler):
    """The TTL index deletes by ``settled_at``, set once the task ended *and* its dependents
    were told: on ``finished_at`` it could delete a task whose writer died before telling
    them, and they would stay blocked for ever."""
    await scheduler.ensure_indexes(finished_ttl=dt.timedelta(days=30))
    info = await scheduler.collection.index_information()
    [(ttl_field, _)] = list(info["finished_ttl"]["key"])
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    await scheduler.publish("alone", None, name="job")

    async def ttl_date(key: str) -> object:
        document = await scheduler.collection.find_one({"key": key})
        assert document is not None
        return document.get(ttl_field)

    lease = await scheduler.store.tasks.claim("w", key="alone")
    assert lease is not None
    await scheduler.store.tasks.succeed(lease, "done")
    assert await ttl_date("alone") is not None, "nothing to tell: deletable"

    async def crash(task: ms.Task) -> ms.Task:
        raise ConnectionError("the worker died right after its success was written")

    lease = await scheduler.store.tasks.claim("w", key="a")
    assert lease is not None
    scheduler.store.tasks.after_write = crash  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await scheduler.store.tasks.succeed(lease, "done")
    del scheduler.store.tasks.after_write
    assert await ttl_date("a") is None, "its dependent is still to be told: not deletable"
    assert await scheduler.store.tasks.recover_dependents() == 1
    assert await ttl_date("a") is not None


async def test_the_ttl_index_keyed_on_finished_at_before_is_rebuilt(scheduler: ms.Scheduler):
    from pymongo import IndexModel

    await scheduler.publish("old", None, name="job")
    await scheduler.collection.create_indexes(
        [IndexModel([("finished_at", 1)], name="finished_ttl", expireAfterSeconds=3_600)]
    )
    await scheduler.ensure_indexes(finished_ttl=dt.timedelta(hours=1))
    info = await scheduler.collection.index_information()
    assert [field for field, _ in info["finished_ttl"]["key"]] == ["settled_at"]


async def _state(sched: ms.Scheduler, key: str) -> S:
    task = await sched.get(key)
    assert task is not None, f"{key} is gone"
    return task.state


async def test_a_purged_and_republished_key_runs_again(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """The old task reached a high version; the new one starts at 1 with a new _id."""
    recorder = Recorder()
    async with consumers(scheduler, recorder):
        await scheduler.publish("report", {"n": 1}, name="job")
        await discover()
        old = await scheduler.get("report")
        assert old is not None and old.state is S.SUCCESS and old.version > 1
        clock.advance(3600)
        assert await scheduler.purge(states=["success"], older_than=dt.timedelta(minutes=1)) == 1
        await scheduler.publish("report", {"n": 2}, name="job")
        await discover()
        assert await _state(scheduler, "report") is S.SUCCESS
    assert [key for key, _ in recorder.runs] == ["report", "report"]


async def test_cancel_says_whether_it_cancelled_and_refuses_a_key_no_task_has(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("k", None, name="job")
    assert await scheduler.cancel("k") is True
    assert await scheduler.cancel("k") is False  # already ended: nothing to do
    with pytest.raises(TaskNotFound, match="nothing"):
        await scheduler.cancel("nothing")
    assert await scheduler.get("nothing") is None
