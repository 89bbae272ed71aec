"""Group commit of finishes: outcomes written together go out as one bulk write and
one read; a lone finish is the single fenced write it always was; lease loss is per task."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.testing import CountingCollection
from tests.engines import settle
from tests.faults import HeldWrites

pytestmark = pytest.mark.anyio


async def _claimed(sched: ms.Scheduler, count: int) -> list[ms.Lease]:
    await sched.publish_many(ms.TaskSpec(key=f"t{n}", name="job") for n in range(count))
    leases = [await sched.store.claim("w1", key=f"t{n}") for n in range(count)]
    assert all(lease is not None for lease in leases)
    return [lease for lease in leases if lease is not None]


async def test_finishes_written_together_cost_two_calls(scheduler: ms.Scheduler):
    leases = await _claimed(scheduler, 5)
    await scheduler.cancel("t3")  # its holder's finish must be reported lost, the others not
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    counting.reset()
    outcomes: dict[str, Any] = {}

    async def finish(lease: ms.Lease) -> None:
        try:
            if lease.key == "t1":
                task = await sched.store.fail(lease, RuntimeError("bad input"))
            elif lease.key == "t2":
                task = await sched.store.retry_later(lease, 30, "busy")
            else:
                task = await sched.store.succeed(lease, {"key": lease.key})
            outcomes[lease.key] = task.state
        except ms.LeaseLost as exc:
            outcomes[lease.key] = exc

    async with anyio.create_task_group() as group:
        for lease in leases:
            group.start_soon(finish, lease)
    assert counting.counts["bulk_write"] == 1 and counting.counts["find"] == 1, counting.counts
    assert counting.counts["find_one_and_update"] == 0
    assert outcomes["t0"] is ms.TaskState.SUCCESS and outcomes["t4"] is ms.TaskState.SUCCESS
    assert outcomes["t1"] is ms.TaskState.PENDING  # retries left: pending again
    assert outcomes["t2"] is ms.TaskState.PENDING
    assert isinstance(outcomes["t3"], ms.LeaseLost) and "cancelled" in str(outcomes["t3"])
    stored = {t.key: t for t in await scheduler.store.get_many([f"t{n}" for n in range(5)])}
    assert stored["t0"].result == {"key": "t0"}
    assert stored["t1"].worker_states[-1].state is ms.WorkerStateKind.FAIL
    assert stored["t2"].retry_at is not None


async def test_a_lone_finish_is_one_call(scheduler: ms.Scheduler):
    (lease,) = await _claimed(scheduler, 1)
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    counting.reset()
    task = await sched.store.succeed(lease, 1)
    assert task.state is ms.TaskState.SUCCESS and counting.calls == 1, counting.counts


async def test_a_finish_returns_once_its_own_outcome_is_written_not_after_the_others(
    scheduler: ms.Scheduler,
):
    """Consumers of one store share the sends of their finishes; a stopping consumer waits on
    its own outcome, never on the outcomes others keep finishing meanwhile."""
    leases = await _claimed(scheduler, 3)
    held = HeldWrites(scheduler.collection)
    sched = ms.Scheduler(held, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    returned: list[str] = []

    async def finish(lease: ms.Lease) -> None:
        await sched.store.succeed(lease, lease.key)
        returned.append(lease.key)

    async with anyio.create_task_group() as group:
        group.start_soon(finish, leases[0])
        await settle()
        assert len(held.held) == 1  # t0's write is on its way
        group.start_soon(finish, leases[1])  # these two wait for it, then go together
        group.start_soon(finish, leases[2])
        await settle()
        held.held[0].set()
        await settle()
        assert returned == ["t0"], "the first finish waited on the others' write"
        assert len(held.held) == 2  # t1 and t2 in one bulk write, still on its way
        held.held[1].set()
    assert sorted(returned) == ["t0", "t1", "t2"]
    tasks = await scheduler.store.get_many(["t0", "t1", "t2"])
    assert [t.state for t in tasks] == [ms.TaskState.SUCCESS] * 3
