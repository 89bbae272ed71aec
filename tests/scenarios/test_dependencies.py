"""Dependencies: blocked until every dependency succeeded, failures cascade, no cycles."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from pymongo.errors import AutoReconnect

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.errors import DependencyError, TaskRunning
from mscheduler.handlers import Consumer
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, until_idle
from tests.oracle import check_consistent
from tests.scenarios.test_consumer import Recorder, consumers

pytestmark = pytest.mark.anyio
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]


async def state_of(sched: ms.Scheduler, key: str) -> ms.TaskState:
    task = await sched.get(key)
    assert task is not None
    check_consistent(task)
    return task.state


async def finish(sched: ms.Scheduler, key: str, outcome: str = "success") -> ms.Task:
    lease = await sched.store.tasks.claim("w", key=key)
    assert lease is not None, f"{key} is not claimable"
    if outcome == "success":
        return await sched.store.tasks.succeed(lease, key)
    return await sched.store.tasks.fail(lease, RuntimeError(f"{key} broke"))


async def _unfinished(sched: ms.Scheduler) -> bool:
    return any(not ms.TaskState(row.state).is_terminal for row in await sched.stats())


async def run_all(sched: ms.Scheduler, *, workers: int = 3) -> list[str]:
    """Run every task with consumers until nothing is left to do; the order they started."""
    order: list[str] = []

    async def handler(task: ms.Task) -> Any:
        order.append(task.key)
        for dependency in task.depends_on:
            finished = await sched.get(dependency)
            assert finished is not None
            assert finished.state is S.SUCCESS or dependency in task.deps_failed, (
                f"{task.key} started before {dependency}"
            )
        return None

    consumers = [
        sched.consumer(
            {"job": handler},
            options=ms.WorkerOptions(worker_id=f"w{i}", poll_interval_ms=POLL_MS),
        )
        for i in range(workers)
    ]
    async with anyio.create_task_group() as tg:
        for consumer in consumers:
            tg.start_soon(consumer.run)
        await until_idle()
        # Without change streams (the wire engine) consumers see unblocked work at a poll.
        clock = sched.store.clock
        for _ in range(10_000):
            if not any(c.polling for c in consumers) or not await _unfinished(sched):
                break
            assert isinstance(clock, ManualClock)
            clock.advance(POLL_MS / 1000)
            await until_idle()
        for consumer in consumers:
            consumer.stop()
    return order


async def test_blocked_until_every_dependency_succeeded(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job")
    result = await scheduler.publish("c", None, name="job", depends_on=["a", "b"])
    assert result.task.state is S.BLOCKED and result.task.deps_pending == ["a", "b"]
    assert await scheduler.store.tasks.claim("w", key="c") is None
    await finish(scheduler, "a")
    assert await state_of(scheduler, "c") is S.BLOCKED
    await finish(scheduler, "b")
    assert await state_of(scheduler, "c") is S.PENDING
    await finish(scheduler, "c")


async def test_dependencies_that_already_succeeded_count_at_once(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await finish(scheduler, "a")
    result = await scheduler.publish("b", None, name="job", depends_on=["a"])
    assert result.task.state is S.PENDING and result.task.deps_pending == []


async def test_missing_dependency_is_an_error_unless_allowed(scheduler: ms.Scheduler):
    with pytest.raises(DependencyError, match="no task has the key"):
        await scheduler.publish("b", None, name="job", depends_on=["ghost"])
    assert await scheduler.get("b") is None, "a refused publish wrote something"
    result = await scheduler.publish(
        "b", None, name="job", depends_on=["ghost"], allow_missing=True
    )
    assert result.task.state is S.PENDING and result.task.depends_on == []


async def test_self_dependency_is_refused(scheduler: ms.Scheduler):
    with pytest.raises(DependencyError, match="cannot depend on itself"):
        await scheduler.publish("a", None, name="job", depends_on=["a"])


async def test_chain_of_ten_runs_in_order(scheduler: ms.Scheduler):
    keys = [f"step:{n}" for n in range(10)]
    for previous, key in zip([None, *keys], keys, strict=False):
        await scheduler.publish(key, None, name="job", depends_on=[previous] if previous else [])
    assert await run_all(scheduler) == keys


async def test_fan_out_of_fifty_joined_by_one(scheduler: ms.Scheduler):
    parts = [f"part:{n}" for n in range(50)]
    for key in parts:
        await scheduler.publish(key, None, name="job")
    await scheduler.publish("join", None, name="job", depends_on=parts)
    order = await run_all(scheduler)
    assert sorted(order[:50]) == sorted(parts) and order[50] == "join"


async def test_divisor_graph_never_runs_a_task_before_its_divisors(scheduler: ms.Scheduler):
    """63 tasks; task n depends on every proper divisor of n greater than 1."""
    for n in range(2, 65):
        divisors = [f"n{d}" for d in range(2, n) if n % d == 0]
        await scheduler.publish(f"n{n}", None, name="job", depends_on=divisors)
    order = await run_all(scheduler, workers=4)
    assert len(order) == 63 and len(set(order)) == 63
    position = {key: index for index, key in enumerate(order)}
    for n in range(2, 65):
        for d in range(2, n):
            if n % d == 0:
                assert position[f"n{d}"] < position[f"n{n}"], f"n{n} ran before n{d}"


async def test_failure_cancels_dependents_through_three_levels(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("root", None, name="job", options=opts)
    await scheduler.publish("child", None, name="job", depends_on=["root"])
    await scheduler.publish("grandchild", None, name="job", depends_on=["child"])
    await scheduler.publish("great", None, name="job", depends_on=["grandchild"])
    await scheduler.publish("unrelated", None, name="job")
    await finish(scheduler, "root", "fail")
    for key, cause in [("child", "root"), ("grandchild", "child"), ("great", "grandchild")]:
        task = await scheduler.get(key)
        assert task is not None and task.state is S.CANCELLED, key
        assert task.error is not None and f"dependency {cause!r}" in task.error.message
    assert await state_of(scheduler, "unrelated") is S.PENDING


async def test_cancel_cascades_like_a_failure(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    await scheduler.cancel("a")
    assert await state_of(scheduler, "b") is S.CANCELLED


async def test_on_dependency_failure_run_sees_what_failed(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("good", None, name="job")
    await scheduler.publish("bad", None, name="job", options=opts)
    anyway = ms.TaskOptions(on_dependency_failure="run")
    await scheduler.publish("report", None, name="job", options=anyway, depends_on=["good", "bad"])
    await finish(scheduler, "bad", "fail")
    assert await state_of(scheduler, "report") is S.BLOCKED
    await finish(scheduler, "good")
    task = await scheduler.get("report")
    assert task is not None and task.state is S.PENDING and task.deps_failed == ["bad"]
    lease = await scheduler.store.tasks.claim("w", key="report")
    assert lease is not None and lease.task.deps_failed == ["bad"]


async def test_publishing_on_a_failed_dependency_cancels_at_once(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await scheduler.cancel("a")
    result = await scheduler.publish("b", None, name="job", depends_on=["a"])
    assert result.task.state is S.CANCELLED
    assert result.task.error is not None and "'a'" in result.task.error.message


async def test_dependency_ending_during_publish_is_not_missed(scheduler: ms.Scheduler, monkeypatch):
    """The dependency finishes after the publisher read it as running but before the
    dependent is counted in: the re-read after insert catches it."""
    await scheduler.publish("a", None, name="job")
    lease = await scheduler.store.tasks.claim("w", key="a")
    assert lease is not None
    flows = scheduler.store.flows
    original = flows.resolve

    async def resolve_then_finish(*args: Any, **kwargs: Any) -> Any:
        resolved = await original(*args, **kwargs)
        await scheduler.store.tasks.succeed(lease, "done")  # nobody depends on a yet
        return resolved

    monkeypatch.setattr(flows, "resolve", resolve_then_finish)
    result = await scheduler.publish("b", None, name="job", depends_on=["a"])
    assert result.task.state is S.PENDING, "b waits forever for a dependency that succeeded"


async def test_dependents_of_a_crashed_writer_are_told_on_recovery(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    lease = await scheduler.store.tasks.claim("w", key="a")
    assert lease is not None

    async def crash(task: ms.Task) -> ms.Task:
        raise ConnectionError("the worker died right after its success was written")

    scheduler.store.tasks.after_write = crash  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await scheduler.store.tasks.succeed(lease, "done")
    del scheduler.store.tasks.after_write
    assert await state_of(scheduler, "b") is S.BLOCKED
    assert await scheduler.store.tasks.recover_dependents() == 1
    assert await state_of(scheduler, "b") is S.PENDING
    assert await scheduler.store.tasks.recover_dependents() == 0


async def test_add_dependencies_to_existing_tasks(scheduler: ms.Scheduler):
    for key in ("a", "b", "c"):
        await scheduler.publish(key, None, name="job")
    await finish(scheduler, "c")
    await scheduler.add_dependencies([("a", "b"), ("c", "b")])
    task = await scheduler.get("b")
    assert task is not None and task.state is S.BLOCKED
    assert task.depends_on == ["a", "c"] and task.deps_pending == ["a"]
    await finish(scheduler, "a")
    assert await state_of(scheduler, "b") is S.PENDING


@pytest.mark.parametrize(
    ("edges", "error", "message"),
    [
        ([("b", "a")], DependencyError, "closes a cycle"),
        ([("c", "a")], DependencyError, "closes a cycle"),
        ([("x", "y"), ("y", "x")], DependencyError, "closes a cycle"),
        ([("a", "a")], DependencyError, "cannot depend on itself"),
        ([("a", "ghost")], DependencyError, "no task has the key"),
        ([("x", "running")], TaskRunning, "already running"),
        ([("x", "done")], DependencyError, "has already success"),
    ],
)
async def test_bad_edges_are_refused_and_write_nothing(
    scheduler: ms.Scheduler, edges: list[tuple[str, str]], error: type[Exception], message: str
):
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    await scheduler.publish("c", None, name="job", depends_on=["b"])
    for key in ("x", "y", "running", "done"):
        await scheduler.publish(key, None, name="job")
    assert await scheduler.store.tasks.claim("w", key="running") is not None
    await finish(scheduler, "done")
    before = {t.key: t.version for t in await scheduler.store.get_many(["a", "b", "c", "x", "y"])}
    with pytest.raises(error, match=message):
        await scheduler.add_dependencies(edges)
    after = {t.key: t.version for t in await scheduler.store.get_many(["a", "b", "c", "x", "y"])}
    assert after == before


# ------------------------------------------------------------------------ handler decisions


async def _run_one(
    sched: ms.Scheduler, handler: Any, clock: ManualClock, steps: int = 0
) -> Consumer:
    consumer = sched.consumer({"job": handler}, options=ms.WorkerOptions(worker_id="w0"))
    async with consumer:
        await until_idle()
        for _ in range(steps):
            clock.advance(1)
            await until_idle()
    return consumer


async def test_abort_fails_at_once_and_cancels_dependents(scheduler: ms.Scheduler, clock):
    await scheduler.publish("a", None, name="job", options=ms.TaskOptions(max_unexpected_retries=5))
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    calls: list[str] = []

    async def handler(task: ms.Task) -> None:
        calls.append(task.key)
        raise ms.Abort("the input is corrupt")

    consumer = await _run_one(scheduler, handler, clock, steps=30)
    assert calls == ["a"], "an aborted task was retried"
    task = await scheduler.get("a")
    assert task is not None and task.state is S.FAIL
    assert task.error is not None and task.error.type == "Abort"
    assert task.error.message == "the input is corrupt"
    assert await state_of(scheduler, "b") is S.CANCELLED
    assert consumer.stats.aborted == 1


async def test_retry_later_is_not_a_failure(scheduler: ms.Scheduler, clock):
    opts = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("a", None, name="job", options=opts)
    calls: list[str] = []

    async def handler(task: ms.Task) -> str:
        calls.append(str(clock.now().time()))
        if len(calls) < 3:
            raise ms.RetryLater(5, "the bucket is not ready")
        return "done"

    consumer = await _run_one(scheduler, handler, clock, steps=12)
    assert calls == ["00:00:00", "00:00:05", "00:00:10"]
    task = await scheduler.get("a")
    assert task is not None and task.state is S.SUCCESS and task.unexpected_failures == 0
    assert consumer.stats.deferred == 2


async def test_max_tries_caps_retry_later(scheduler: ms.Scheduler, clock):
    await scheduler.publish("a", None, name="job", options=ms.TaskOptions(max_tries=2))
    calls: list[int] = []

    async def handler(task: ms.Task) -> None:
        calls.append(1)
        raise ms.RetryLater(1)

    await _run_one(scheduler, handler, clock, steps=10)
    assert len(calls) == 2
    assert await state_of(scheduler, "a") is S.FAIL


def test_retry_later_refuses_a_negative_delay():
    with pytest.raises(ValueError, match="delay must be between 0 and"):
        ms.RetryLater(-1)


async def _state(sched: ms.Scheduler, key: str) -> S:
    task = await sched.get(key)
    assert task is not None, f"{key} is gone"
    return task.state


class _TellingFails(CountingCollection):
    """Every update of dependents (the writes that tell them an outcome) fails on the network
    before it reaches the database, ``times`` times (-1: always)."""

    def __init__(self, collection: Any, times: int = -1) -> None:
        super().__init__(collection)
        self.times = times

    async def update_many(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "deps_pending" in query and self.times != 0:
            self.times -= 1
            raise AutoReconnect("connection reset while telling dependents")
        return await self.wrapped.update_many(query, *args, **kwargs)


async def _publish_pair(sched: ms.Scheduler) -> None:
    await sched.publish("dep", None, name="job")
    await sched.publish("child", None, name="job", depends_on=["dep"])


async def test_dependents_are_told_after_a_network_error_without_a_restart(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """The worker that finished ``dep`` could not tell ``child``: it does so itself once the
    network is back, and meanwhile ``dep`` is not purged (it would strand ``child``)."""
    await _publish_pair(scheduler)
    flaky = _TellingFails(scheduler.collection, times=1)
    sched = ms.Scheduler(flaky, clock=scheduler.store.clock)
    recorder = Recorder()
    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with sched.consumer({"job": recorder.for_worker("w0")}, options=options) as consumer:
        for _ in range(3):
            clock.advance(1)
            await discover()
    assert flaky.times == 0, "the fault was not injected"
    assert [key for key, _ in recorder.runs] == ["dep", "child"]
    assert await _state(scheduler, "child") is S.SUCCESS
    assert consumer.stats.lease_lost == 0, "the landed finish was written again"


async def test_a_dead_writers_dependents_are_told_by_a_running_consumer(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
):
    """Another process finished ``dep`` and never told ``child`` (its network stayed down):
    a long-running consumer that saw ``dep`` end tells ``child`` after a grace period."""
    outsider = ms.TaskOptions(specific_worker_ids=["outsider"])
    await scheduler.publish("dep", None, name="job", options=outsider)
    await scheduler.publish("child", None, name="job", depends_on=["dep"])
    other = ms.Scheduler(_TellingFails(scheduler.collection), clock=scheduler.store.clock)
    recorder = Recorder()
    async with consumers(scheduler, recorder):
        await discover()
        lease = await other.store.tasks.claim("outsider", key="dep")
        assert lease is not None
        await other.store.tasks.succeed(lease, "done")  # landed; telling child did not
        assert other.services.owed.keys == {"dep"}
        await discover()
        assert recorder.runs == []
        for _ in range(12):
            clock.advance(1)
            await discover()
        assert recorder.runs == [("child", "w0")]
    dep = await scheduler.get("dep")
    assert dep is not None and dep.dependents_notified is True


async def test_purge_keeps_a_finished_task_until_its_dependents_are_told(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("dep", None, name="job")
    await scheduler.publish("child", None, name="job", depends_on=["dep"])
    other = ms.Scheduler(_TellingFails(scheduler.collection), clock=scheduler.store.clock)
    lease = await other.store.tasks.claim("outsider", key="dep")
    assert lease is not None
    await other.store.tasks.succeed(lease, "done")  # telling child failed
    clock.advance(3600)
    hour = dt.timedelta(minutes=1)
    assert await scheduler.purge(states=["success"], older_than=hour) == 0, "child stranded"
    assert await scheduler.store.tasks.recover_dependents() == 1
    assert await scheduler.purge(states=["success"], older_than=hour) == 1
    assert await _state(scheduler, "child") is S.PENDING


async def test_deleting_a_dependency_in_a_commit_fails_its_waiting_dependents(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("dep", None, name="job")
    await scheduler.publish("child", None, name="job", depends_on=["dep"])
    await scheduler.publish("grandchild", None, name="job", depends_on=["child"])
    runs_anyway = ms.TaskOptions(on_dependency_failure="run")
    await scheduler.publish("tolerant", None, name="job", depends_on=["dep"], options=runs_anyway)
    await scheduler.commit(delete=["dep"])
    assert await scheduler.get("dep") is None
    child, grandchild, tolerant = [
        await scheduler.get(key) for key in ("child", "grandchild", "tolerant")
    ]
    assert child is not None and child.state is S.CANCELLED and child.error is not None
    assert child.error.message == "dependency 'dep' was deleted"
    assert grandchild is not None and grandchild.state is S.CANCELLED, "no cascade"
    assert tolerant is not None and tolerant.state is S.PENDING
    assert tolerant.deps_pending == [] and tolerant.deps_failed == ["dep"]


async def test_deleting_and_publishing_a_key_keeps_its_dependents_waiting(
    scheduler: ms.Scheduler,
):
    """The barrier pattern: the key is replaced, so its dependents wait for the new task."""
    await scheduler.publish("barrier", None, name="job")
    await scheduler.publish("after", None, name="job", depends_on=["barrier"])
    await scheduler.commit(delete=["barrier"], publish=[ms.TaskSpec(key="barrier", name="job")])
    after = await scheduler.get("after")
    assert after is not None and after.state is S.BLOCKED and after.deps_pending == ["barrier"]
