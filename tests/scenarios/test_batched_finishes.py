"""Group commit of finishes: outcomes written together go out as one bulk write, and one read
where a caller wants its document or a write missed; a lone finish is the single fenced
write it always was; lease loss, and a write the server refuses, are per task."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.errors import LeaseLost, StoreError
from mscheduler.models import Lease, WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import until_idle
from tests.faults import HeldWrites

S = ms.TaskState.SUCCESS

pytestmark = pytest.mark.anyio


async def _claimed(sched: ms.Scheduler, count: int) -> list[Lease]:
    await sched.publish_many(ms.TaskSpec(key=f"t{n}", name="job") for n in range(count))
    leases = [await sched.store.tasks.claim("w1", key=f"t{n}") for n in range(count)]
    assert all(lease is not None for lease in leases)
    return [lease for lease in leases if lease is not None]


async def _counting(scheduler: ms.Scheduler) -> tuple[ms.Scheduler, CountingCollection]:
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    counting.reset()
    return sched, counting


async def _held(scheduler: ms.Scheduler) -> tuple[ms.Scheduler, HeldWrites]:
    held = HeldWrites(scheduler.collection)
    sched = ms.Scheduler(held, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    return sched, held


async def _record_successes(sched: ms.Scheduler, leases: list[Lease]) -> dict[str, Any]:
    outcomes: dict[str, Any] = {}

    async def finish(lease: Lease) -> None:
        try:
            outcomes[lease.key] = await sched.store.tasks.record_success(lease, lease.key)
        except LeaseLost as exc:
            outcomes[lease.key] = exc

    async with anyio.create_task_group() as group:
        for lease in leases:
            group.start_soon(finish, lease)
    return outcomes


async def test_finishes_written_together_cost_two_calls(scheduler: ms.Scheduler):
    leases = await _claimed(scheduler, 5)
    await scheduler.cancel("t3")  # its holder's finish must be reported lost, the others not
    sched, counting = await _counting(scheduler)
    outcomes: dict[str, Any] = {}

    async def finish(lease: Lease) -> None:
        try:
            if lease.key == "t1":
                task = await sched.store.tasks.fail(lease, RuntimeError("bad input"))
            elif lease.key == "t2":
                task = await sched.store.tasks.retry_later(lease, 30, "busy")
            else:
                task = await sched.store.tasks.succeed(lease, {"key": lease.key})
            outcomes[lease.key] = task.state
        except LeaseLost as exc:
            outcomes[lease.key] = exc

    async with anyio.create_task_group() as group:
        for lease in leases:
            group.start_soon(finish, lease)
    assert counting.counts["bulk_write"] == 1 and counting.counts["find"] == 1, counting.counts
    assert counting.counts["find_one_and_update"] == 0
    assert outcomes["t0"] is ms.TaskState.SUCCESS and outcomes["t4"] is ms.TaskState.SUCCESS
    assert outcomes["t1"] is ms.TaskState.PENDING  # retries left: pending again
    assert outcomes["t2"] is ms.TaskState.PENDING
    assert isinstance(outcomes["t3"], LeaseLost) and "cancelled" in str(outcomes["t3"])
    stored = {t.key: t for t in await scheduler.store.get_many([f"t{n}" for n in range(5)])}
    assert stored["t0"].result == {"key": "t0"}
    assert stored["t1"].worker_states[-1].state is WorkerStateKind.FAIL
    assert stored["t2"].retry_at is not None


async def test_a_consumers_successes_written_together_cost_one_call(scheduler: ms.Scheduler):
    """The consumer reads nothing back after a success: a batch of them that all landed is
    one bulk write, and nothing read after it."""
    leases = await _claimed(scheduler, 5)
    sched, counting = await _counting(scheduler)
    async with anyio.create_task_group() as group:
        for lease in leases:
            group.start_soon(sched.store.tasks.record_success, lease, {"key": lease.key})
    assert counting.counts == {"bulk_write": 1}, counting.counts
    stored = await scheduler.store.get_many([lease.key for lease in leases])
    assert [(t.state, t.result) for t in stored] == [
        (ms.TaskState.SUCCESS, {"key": lease.key}) for lease in leases
    ]


async def test_a_success_written_unread_still_tells_dependents_published_while_it_ran(
    scheduler: ms.Scheduler,
):
    """A dependent published after its dependency was claimed (the lease's copy of the task
    knows nothing of it): the batch's success must still find it and tell it."""
    leases = await _claimed(scheduler, 3)
    await scheduler.publish("after-t1", None, name="job", depends_on=["t1"])
    sched, counting = await _counting(scheduler)
    outcomes = await _record_successes(sched, leases)
    assert outcomes == {"t0": None, "t1": None, "t2": None}
    stored = {t.key: t for t in await scheduler.store.get_many(["t0", "t1", "t2", "after-t1"])}
    assert [stored[key].state for key in ("t0", "t1", "t2")] == [ms.TaskState.SUCCESS] * 3
    assert stored["t1"].dependents_notified is True
    assert stored["after-t1"].state is ms.TaskState.PENDING, "its dependency's success was lost"
    # The one that missed is written again alone: a round trip more, for it only.
    assert counting.counts["bulk_write"] == 1 and counting.counts["find_one_and_update"] == 1


async def test_a_task_claimed_with_dependents_is_read_back_with_its_batch(
    scheduler: ms.Scheduler,
):
    leases = await _claimed(scheduler, 3)
    await scheduler.store.tasks.release(leases[1])
    await scheduler.publish("after-t1", None, name="job", depends_on=["t1"])
    again = await scheduler.store.tasks.claim("w1", key="t1")
    assert again is not None and again.task.dependent_count == 1
    sched, counting = await _counting(scheduler)
    outcomes = await _record_successes(sched, [leases[0], again, leases[2]])
    assert outcomes == {"t0": None, "t1": None, "t2": None}
    assert counting.counts["bulk_write"] == 1 and counting.counts["find"] == 1, counting.counts
    assert counting.counts["find_one_and_update"] == 0, "written twice: it could be read once"
    assert (await scheduler.get("after-t1")).state is ms.TaskState.PENDING  # type: ignore[union-attr]


async def test_a_success_written_unread_still_reports_its_lost_lease(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Lost to a cancel, or to its lease's expiry before anyone took it over: told by the read
    after the batch, never by writing again."""
    leases = await _claimed(scheduler, 4)
    await scheduler.cancel("t1")
    expiring = leases[3]
    assert expiring.ping_expire_at is not None
    clock.advance((expiring.ping_expire_at - clock.now()).total_seconds() - 1)
    await scheduler.store.tasks.ping_many([leases[0], leases[2]])  # they outlive it
    clock.advance(2)
    sched, counting = await _counting(scheduler)
    outcomes = await _record_successes(sched, leases)
    assert "cancelled" in str(outcomes.pop("t1")) and "expired" in str(outcomes.pop("t3"))
    assert outcomes == {"t0": None, "t2": None}
    assert counting.counts == {"bulk_write": 1, "find": 1}, counting.counts


async def test_a_success_returns_without_waiting_for_another_written_again(
    scheduler: ms.Scheduler,
):
    leases = await _claimed(scheduler, 3)
    await scheduler.publish("after-t2", None, name="job", depends_on=["t2"])
    sched, held = await _held(scheduler)
    returned: list[str] = []

    async def finish(lease: Lease) -> None:
        await sched.store.tasks.record_success(lease, lease.key)
        returned.append(lease.key)

    async with anyio.create_task_group() as group:
        group.start_soon(finish, leases[0])
        await until_idle()
        group.start_soon(finish, leases[1])  # these two go together, after t0's write
        group.start_soon(finish, leases[2])
        await until_idle()
        held.held[0].set()
        await until_idle()
        held.held[1].set()  # the bulk write, sent by t1's writer: t2 misses on its dependent
        await until_idle()
        assert sorted(returned) == ["t0", "t1"], "t1 waited on t2's write"
        assert len(held.held) == 3  # t2's, alone
        held.held[2].set()
    assert sorted(returned) == ["t0", "t1", "t2"]
    assert (await scheduler.get("after-t2")).state is ms.TaskState.PENDING  # type: ignore[union-attr]


async def test_a_quick_success_is_fenced_by_the_worker_too(scheduler: ms.Scheduler):
    """A lease naming another worker but this run id: the fence should refuse it."""
    await scheduler.publish("t", None, name="job")
    [lease] = await scheduler.store.tasks.claim_many("w1", names=["job"], limit=1)
    forged = Lease(key=lease.key, worker_id="w2", run_id=lease.run_id, task=lease.task)
    with pytest.raises(LeaseLost):
        await scheduler.store.tasks.record_success(forged, None)


class _RefusesOneOfABulk:
    """A bulk write whose write of ``key`` the server refuses (as it would one whose document
    outgrew 16 MiB); the others land, as in an unordered bulk write."""

    def __init__(self, collection: Any, key: str) -> None:
        self.wrapped = collection
        self.key = key
        self.bulks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def bulk_write(self, requests: list[UpdateOne], **kwargs: Any) -> Any:
        self.bulks += 1
        index = next(n for n, r in enumerate(requests) if r._filter["key"] == self.key)
        kept = requests[:index] + requests[index + 1 :]
        result = await self.wrapped.bulk_write(kept, **kwargs)
        error = {"index": index, "code": 10334, "errmsg": "BSONObj size is invalid"}
        raise BulkWriteError({"writeErrors": [error], "nMatched": result.matched_count})


@pytest.mark.parametrize("quiet", [False, True], ids=["succeed", "record_success"])
async def test_a_write_the_server_refuses_in_a_batch_fails_alone(
    scheduler: ms.Scheduler, quiet: bool
):
    leases = await _claimed(scheduler, 4)
    refusing = _RefusesOneOfABulk(scheduler.collection, "t2")
    sched = ms.Scheduler(refusing, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    outcomes: dict[str, Any] = {}

    async def finish(lease: Lease) -> None:
        write = sched.store.tasks.record_success if quiet else sched.store.tasks.succeed
        try:
            await write(lease, lease.key)
            outcomes[lease.key] = "written"
        except StoreError as exc:
            outcomes[lease.key] = exc

    async with anyio.create_task_group() as group:
        for lease in leases:
            group.start_soon(finish, lease)
    assert refusing.bulks == 1
    assert isinstance(outcomes.pop("t2"), StoreError)
    assert outcomes == {"t0": "written", "t1": "written", "t3": "written"}
    stored = {t.key: t.state for t in await scheduler.store.get_many(["t0", "t1", "t2", "t3"])}
    assert stored == {"t0": S, "t1": S, "t2": ms.TaskState.RUNNING, "t3": S}


async def test_a_lone_finish_is_one_call(scheduler: ms.Scheduler):
    (lease,) = await _claimed(scheduler, 1)
    sched, counting = await _counting(scheduler)
    task = await sched.store.tasks.succeed(lease, 1)
    assert task.state is ms.TaskState.SUCCESS and counting.calls == 1, counting.counts


async def test_a_finish_returns_once_its_own_outcome_is_written_not_after_the_others(
    scheduler: ms.Scheduler,
):
    """Consumers of one store share the sends of their finishes; a stopping consumer waits on
    its own outcome, never on the outcomes others keep finishing meanwhile."""
    leases = await _claimed(scheduler, 3)
    sched, held = await _held(scheduler)
    returned: list[str] = []

    async def finish(lease: Lease) -> None:
        await sched.store.tasks.succeed(lease, lease.key)
        returned.append(lease.key)

    async with anyio.create_task_group() as group:
        group.start_soon(finish, leases[0])
        await until_idle()
        assert len(held.held) == 1  # t0's write is on its way
        group.start_soon(finish, leases[1])  # these two wait for it, then go together
        group.start_soon(finish, leases[2])
        await until_idle()
        held.held[0].set()
        await until_idle()
        assert returned == ["t0"], "the first finish waited on the others' write"
        assert len(held.held) == 2  # t1 and t2 in one bulk write, still on its way
        held.held[1].set()
    assert sorted(returned) == ["t0", "t1", "t2"]
    tasks = await scheduler.store.get_many(["t0", "t1", "t2"])
    assert [t.state for t in tasks] == [ms.TaskState.SUCCESS] * 3


async def _stored(sched: ms.Scheduler, key: str) -> dict[str, Any]:
    document = await sched.collection.find_one({"key": key}, {"_id": 0, "key": 0})
    assert document is not None
    for state in document["worker_states"]:
        state["run_id"] = "run"
    return document


async def test_a_quick_success_writes_what_the_success_pipeline_writes(
    scheduler: ms.Scheduler,
):
    """The consumer's success of a task one worker runs, without dependents, is a classic
    update of the fields it changes: the document it leaves is the one the success pipeline
    leaves (a `succeed`), a result that looks like a field path included."""
    leases = await _claimed(scheduler, 2)
    result = {"path": "$not.a.path", "n": [1, "$$ws"]}
    await scheduler.store.tasks.succeed(leases[0], result)
    sched, counting = await _counting(scheduler)
    assert await sched.store.tasks.record_success(leases[1], result) is None
    assert counting.counts == {"bulk_write": 1}, counting.counts
    assert await _stored(scheduler, "t1") == await _stored(scheduler, "t0")


async def test_a_quick_success_that_misses_on_new_options_is_written_in_full(
    scheduler: ms.Scheduler,
):
    """Options changed while it ran (now two workers): the quick form's conditions miss, and
    the success is written again by the success pipeline, as the new options want."""
    (lease,) = await _claimed(scheduler, 1)
    await scheduler.set_options("t0", ms.TaskOptions(concurrent_worker_cnt=2))
    await scheduler.store.tasks.record_success(lease, None)
    task = await scheduler.get("t0")
    assert task is not None and task.state is ms.TaskState.PENDING  # one success of two
    assert [ws.state for ws in task.worker_states] == [WorkerStateKind.SUCCESS]
