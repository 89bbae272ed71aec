"""The pull API: `Scheduler.own`, ``extend``, ``succeed``, ``fail``, ``release``. A worker that
drives its own loop claims under every rule a consumer's claim follows, and each write of a
lease is fenced by its run_id. Every engine, the manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.errors import ConfigurationError, LeaseLost
from mscheduler.models import Lease
from mscheduler.testing import ManualClock
from tests.engines import until_idle

pytestmark = pytest.mark.anyio
SECONDS = dt.timedelta(seconds=1)


async def _publish(sched: ms.Scheduler, count: int, **options: object) -> None:
    await sched.publish_many(
        ms.TaskSpec(key=f"t{n}", name="job", options=ms.TaskOptions(**options))  # type: ignore[arg-type]
        for n in range(count)
    )


async def test_own_takes_the_best_first_and_succeed_ends_the_task(scheduler: ms.Scheduler):
    await scheduler.publish_many(
        ms.TaskSpec(key=f"t{n}", name="job", options=ms.TaskOptions(priority=n % 3))
        for n in range(6)
    )
    leases = await scheduler.own(["job"], worker_id="w1", max_tasks=3)
    assert [lease.key for lease in leases] == ["t2", "t5", "t1"]  # priority, then age
    assert all(lease.worker_id == "w1" for lease in leases)
    done = await scheduler.succeed(leases[0], {"ok": 1})
    assert done.state is ms.TaskState.SUCCESS and done.result == {"ok": 1}
    others = await scheduler.own(["job"], worker_id="w2", max_tasks=10)
    assert {lease.key for lease in others} == {"t0", "t3", "t4"}


async def test_one_or_two_tasks_are_owned_as_asked(scheduler: ms.Scheduler):
    await _publish(scheduler, 3)
    assert len(await scheduler.own(["job"], worker_id="w", max_tasks=2)) == 2
    assert len(await scheduler.own(["job"], worker_id="w", max_tasks=2)) == 1
    assert await scheduler.own(["job"], worker_id="w", max_tasks=2) == []


async def test_a_lease_is_fenced_after_its_expiry(scheduler: ms.Scheduler, clock: ManualClock):
    await _publish(scheduler, 1)
    [lease] = await scheduler.own(["job"], worker_id="w1", lease=10 * SECONDS)
    assert lease.ping_expire_at == clock.now() + 10 * SECONDS
    clock.advance(11)
    with pytest.raises(LeaseLost):
        await scheduler.succeed(lease)
    with pytest.raises(LeaseLost):
        await scheduler.extend(lease, 10 * SECONDS)
    [taken] = await scheduler.own(["job"], worker_id="w2")
    assert taken.key == lease.key and taken.run_id != lease.run_id
    with pytest.raises(LeaseLost):
        await scheduler.fail(lease, "late")
    assert (await scheduler.succeed(taken)).state is ms.TaskState.SUCCESS


async def test_extend_keeps_a_lease_past_its_first_end(scheduler: ms.Scheduler, clock: ManualClock):
    await _publish(scheduler, 1)
    [lease] = await scheduler.own(["job"], worker_id="w1", lease=10 * SECONDS)
    clock.advance(8)
    lease = await scheduler.extend(lease, 10 * SECONDS)
    assert lease.ping_expire_at == clock.now() + 10 * SECONDS
    clock.advance(8)
    assert await scheduler.own(["job"], worker_id="w2") == []
    assert (await scheduler.succeed(lease)).state is ms.TaskState.SUCCESS


async def test_release_hands_the_task_back_without_counting_an_attempt(scheduler: ms.Scheduler):
    await _publish(scheduler, 1, max_unexpected_retries=0)
    [lease] = await scheduler.own(["job"], worker_id="w1")
    released = await scheduler.release(lease)
    assert released.state is ms.TaskState.PENDING
    [again] = await scheduler.own(["job"], worker_id="w2")  # claimable at once
    assert again.key == "t0"
    # No retry was left, yet the release used none: this attempt's failure is the first.
    failed = await scheduler.fail(again, RuntimeError("broken"))
    assert failed.state is ms.TaskState.FAIL


async def test_fail_retries_by_the_tasks_rules(scheduler: ms.Scheduler, clock: ManualClock):
    await _publish(scheduler, 1, max_unexpected_retries=1, unexpected_retry_delay_ms=5_000)
    [lease] = await scheduler.own(["job"], worker_id="w1")
    retried = await scheduler.fail(lease, "first try broke")
    assert retried.state is ms.TaskState.PENDING
    assert await scheduler.own(["job"], worker_id="w1") == []  # the retry delay
    clock.advance(5)
    [lease] = await scheduler.own(["job"], worker_id="w1")
    failed = await scheduler.fail(lease, ValueError("second try broke"))
    assert failed.state is ms.TaskState.FAIL
    assert failed.error is not None


async def test_own_honours_specific_worker_ids(scheduler: ms.Scheduler):
    await _publish(scheduler, 1, specific_worker_ids=["w2"])
    assert await scheduler.own(["job"], worker_id="w1") == []
    [lease] = await scheduler.own(["job"], worker_id="w2")
    assert lease.key == "t0"


async def test_own_takes_nothing_of_a_paused_name(scheduler: ms.Scheduler):
    await _publish(scheduler, 2)
    await scheduler.publish("other", None, name="other")
    await scheduler.pause("job")
    leases = await scheduler.own(["job", "other"], worker_id="w", max_tasks=5)
    assert [lease.key for lease in leases] == ["other"]
    await scheduler.resume("job")
    assert len(await scheduler.own(["job"], worker_id="w", max_tasks=5)) == 2


async def test_an_owned_lease_holds_its_max_running_slot_until_it_ends_or_expires(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.set_limit("job", max_running=2)
    await _publish(scheduler, 5)
    first = await scheduler.own(["job"], worker_id="w1", max_tasks=5, lease=30 * SECONDS)
    assert len(first) == 2
    assert await scheduler.own(["job"], worker_id="w2", max_tasks=5) == []
    clock.advance(20)
    first[0] = await scheduler.extend(first[0], 30 * SECONDS)  # its slot is extended too
    await scheduler.succeed(first[1])  # frees its slot at once
    [second] = await scheduler.own(["job"], worker_id="w2", max_tasks=5, lease=30 * SECONDS)
    assert await scheduler.own(["job"], worker_id="w3", max_tasks=5) == []
    clock.advance(20)  # past the first lease's first end, not its extension
    assert await scheduler.own(["job"], worker_id="w3", max_tasks=5) == []
    clock.advance(11)  # both leases expired: their slots lapse with them
    assert len(await scheduler.own(["job"], worker_id="w3", max_tasks=5)) == 2
    with pytest.raises(LeaseLost):
        await scheduler.succeed(second)


async def test_an_owned_lease_counts_against_the_rate(scheduler: ms.Scheduler, clock: ManualClock):
    await scheduler.set_limit("job", rate=2, per=dt.timedelta(minutes=1))
    await _publish(scheduler, 4)
    leases = await scheduler.own(["job"], worker_id="w1", max_tasks=4)
    assert len(leases) == 2
    for lease in leases:
        await scheduler.succeed(lease)
    assert await scheduler.own(["job"], worker_id="w1", max_tasks=4) == []
    clock.advance(61)
    assert len(await scheduler.own(["job"], worker_id="w1", max_tasks=4)) == 2


async def test_own_waits_for_a_task_through_the_hub(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """On a change stream the publish wakes the waiting owner with no time passing (no sleep
    loop); a server without streams is polled, once per interval for the whole process."""
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await scheduler.own(["job"], worker_id="w", wait=60 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        assert not found
        await scheduler.publish("late", None, name="job")
        with anyio.fail_after(10):
            while not found:
                await until_idle()
                if engine != "memory":
                    clock.advance(1)  # the hub polls: its interval passes
    assert [lease.key for lease in found] == ["late"]
    if engine == "memory":
        assert clock.now() == found[0].task.created_at


async def test_own_waits_for_a_not_before_that_no_write_announces(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("soon", None, name="job", delay=30)
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await scheduler.own(["job"], worker_id="w", wait=60 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        clock.advance(29)
        await until_idle()
        assert not found
        clock.advance(1)
        with anyio.fail_after(10):
            while not found:
                await until_idle()
    assert [lease.key for lease in found] == ["soon"]


async def test_own_returns_nothing_once_its_wait_is_over(
    scheduler: ms.Scheduler, clock: ManualClock
):
    result: list[list[Lease]] = []

    async def owner() -> None:
        result.append(await scheduler.own(["job"], worker_id="w", wait=5 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        clock.advance(5)
        with anyio.fail_after(10):
            while not result:
                await until_idle()
    assert result == [[]]


async def test_find_lease_rebuilds_a_live_lease_from_its_three_fields(scheduler: ms.Scheduler):
    await _publish(scheduler, 1)
    [lease] = await scheduler.own(["job"], worker_id="w")
    found = await scheduler.find_lease(lease.key, worker_id="w", run_id=lease.run_id)
    assert found.run_id == lease.run_id and found.task.key == "t0"
    with pytest.raises(LeaseLost):
        await scheduler.find_lease(lease.key, worker_id="w", run_id="not-a-run")
    await scheduler.succeed(found)
    with pytest.raises(LeaseLost):
        await scheduler.find_lease(lease.key, worker_id="w", run_id=lease.run_id)


@pytest.mark.parametrize("bad", [{"max_tasks": 0}, {"max_tasks": True}, {"lease": -1}])
async def test_own_refuses_bad_arguments_naming_the_field(
    scheduler: ms.Scheduler, bad: dict[str, object]
):
    with pytest.raises(ConfigurationError, match=next(iter(bad))):
        await scheduler.own(["job"], worker_id="w", **bad)  # type: ignore[arg-type]


async def test_owning_n_costs_the_round_trips_of_the_consumers_batched_claim(
    scheduler: ms.Scheduler,
):
    """Two calls on the tasks collection for any N >= 3 of unclaimed tasks (the batched
    claim: one read of the candidates, one bulk of compare-and-sets), one for one task; the
    controls (paused names, limits) are read on the side, once per call while no
    hub watches them, as a consumer reads them once per change."""
    await _publish(scheduler, 100)
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    for n in (1, 10, 20):
        counting.reset()
        baseline = await sched.store.tasks.claim_many("consumer", names=["job"], limit=n)
        claim_calls = counting.calls
        counting.reset()
        owned = await sched.own(["job"], worker_id="owner", max_tasks=n)
        assert len(owned) == len(baseline) == n
        assert counting.calls == claim_calls == (1 if n == 1 else 2), counting.counts


def _count_control_reads(sched: ms.Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The reads of the paused names (``paused``) and the limits (``of``) from now on."""
    reads: list[str] = []
    for part, method in ((sched.store.pauses, "paused"), (sched.store.limits, "of")):
        original = getattr(part, method)

        async def counted(*args: Any, _original: Any = original, _name: str = method) -> Any:
            reads.append(_name)
            return await _original(*args)

        monkeypatch.setattr(part, method, counted)
    return reads


async def test_while_the_control_hub_watches_own_reads_no_controls(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]],
    discover: Callable[[], Awaitable[None]],
    monkeypatch: pytest.MonkeyPatch,
):
    """A consumer of the process runs the control hub: `own` then takes the paused names and
    limits it keeps, as the consumer does, and reads them again after a change (one made
    here at once, one made elsewhere once the hub sees it)."""
    sched = await open_scheduler(collection="shared")
    elsewhere = await open_scheduler(collection="shared")
    await _publish(sched, 10)

    async def other(task: ms.Task) -> None: ...

    async with sched.consumer({"other": other}, options=ms.WorkerOptions(worker_id="c")):
        await discover()  # the consumer has read its controls: what is read now is own's
        reads = _count_control_reads(sched, monkeypatch)
        assert len(await sched.own(["job"], worker_id="w")) == 1
        assert reads == ["paused", "of"]
        reads.clear()
        assert len(await sched.own(["job"], worker_id="w")) == 1
        assert reads == []  # kept: the hub saw no change
        await sched.pause("job")  # a change made here: read again at once
        assert await sched.own(["job"], worker_id="w") == []
        await sched.resume("job")
        await elsewhere.pause("job")  # made elsewhere: seen once the hub hears of it
        await discover()
        assert await sched.own(["job"], worker_id="w") == []


async def test_a_process_following_the_controls_owns_without_reading_them(
    scheduler: ms.Scheduler,
    discover: Callable[[], Awaitable[None]],
    monkeypatch: pytest.MonkeyPatch,
):
    """With no consumer, each `own` reads the paused names and the limits; inside
    `following_controls` (what `mscheduler serve` holds) the process's control hub keeps
    them, so after the first claim `own` reads none, until a change."""
    sched = scheduler
    await _publish(sched, 10)
    reads = _count_control_reads(sched, monkeypatch)
    for _ in range(2):
        assert len(await sched.own(["job"], worker_id="w")) == 1
    assert reads == ["paused", "of"] * 2  # no hub: read on every claim
    async with sched.following_controls():
        await discover()
        reads.clear()
        for _ in range(2):
            assert len(await sched.own(["job"], worker_id="w")) == 1
        assert reads == ["paused", "of"]  # the first claim's; the second took the hub's
        await sched.pause("job")
        assert await sched.own(["job"], worker_id="w") == []


async def test_extending_and_ending_a_lease_is_one_fenced_write_each(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch
):
    """On the tasks, one fenced write each, and never a read of the limits: a slot the lease
    may hold is extended or freed by its run_id, not looked up."""
    await _publish(scheduler, 2)
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    first, second = await sched.own(["job"], worker_id="w", max_tasks=2)

    async def no_read(*args: Any) -> Any:
        raise AssertionError("the limits were read")

    monkeypatch.setattr(sched.store.limits, "of", no_read)
    counting.reset()
    first = await sched.extend(first, 30 * SECONDS)
    assert counting.calls == 1, counting.counts
    for end in (sched.succeed(first), sched.release(second)):
        counting.reset()
        await end
        assert counting.calls == 1, counting.counts


async def test_a_waiting_owner_wakes_when_its_name_is_resumed(
    scheduler: ms.Scheduler, discover: Callable[[], Awaitable[None]], clock: ManualClock
):
    """A resume writes no task: a consumer of the process runs the control hub, whose change
    wakes the owner."""
    await _publish(scheduler, 1)
    await scheduler.pause("job")
    found: list[Lease] = []

    async def other(task: ms.Task) -> None: ...

    async def owner() -> None:
        found.extend(await scheduler.own(["job"], worker_id="w", wait=60 * SECONDS))

    async with (
        scheduler.consumer({"other": other}, options=ms.WorkerOptions(worker_id="c")),
        anyio.create_task_group() as task_group,
    ):
        task_group.start_soon(owner)
        await discover()
        assert not found
        await scheduler.resume("job")
        with anyio.fail_after(10):
            while not found:
                await discover()
    assert [lease.key for lease in found] == ["t0"]
    assert clock.now() < found[0].task.created_at + 30 * SECONDS


async def test_a_waiting_owner_wakes_for_a_later_task_when_the_soonest_is_of_a_paused_name(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """The soonest task of the names asked for cannot be claimed (its name is paused): the
    owner wakes when the first task it may claim is due, not at the end of its wait."""
    await scheduler.publish("held", None, name="paused")
    await scheduler.pause("paused")
    await scheduler.publish("later", None, name="job", delay=1)
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await scheduler.own(["paused", "job"], worker_id="w", wait=10 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        assert not found
        clock.advance(1)
        with anyio.fail_after(10):
            while not found:
                await until_idle()
    assert [lease.key for lease in found] == ["later"]
    assert clock.now() < found[0].task.created_at + 2 * SECONDS


async def test_a_waiting_owner_wakes_for_a_task_of_a_free_name_when_another_is_at_its_limit(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """The soonest task is of a name at its rate for the hour: a later task of another name
    is owned when it is due."""
    await scheduler.set_limit("full", rate=1, per=dt.timedelta(hours=1))
    await scheduler.publish("f0", None, name="full")
    await scheduler.publish("f1", None, name="full")
    [running] = await scheduler.own(["full"], worker_id="other")
    await scheduler.publish("later", None, name="job", delay=2)
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await scheduler.own(["full", "job"], worker_id="w", wait=30 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        with anyio.fail_after(10):
            while not found:
                await until_idle()
                clock.advance(0.5)
    assert [lease.key for lease in found] == ["later"]
    assert clock.now() < found[0].task.created_at + 4 * SECONDS
    assert running.key == "f0"


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_waiting_owner_in_a_process_without_consumers_hears_a_resume(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]],
    clock: ManualClock,
    engine: str,
    where: str,
):
    """No consumer and no HTTP server run in the owner's process: a resume made through the
    same scheduler, or by another process, still wakes the waiting owner well before its
    wait is over."""
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await _publish(sched, 1)
    await sched.pause("job")
    found: list[Lease] = []

    async def owner() -> None:
        found.extend(await sched.own(["job"], worker_id="w", wait=60 * SECONDS))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(owner)
        await until_idle()
        assert not found
        await (sched if where == "here" else other).resume("job")
        with anyio.fail_after(10):
            while not found:
                await until_idle()
                if engine != "memory":
                    clock.advance(1)  # the hub polls: its interval passes
    assert [lease.key for lease in found] == ["t0"]
    assert clock.now() < found[0].task.created_at + 30 * SECONDS


async def test_a_slot_is_freed_at_the_end_of_its_lease_whatever_the_limits_say_then(
    scheduler: ms.Scheduler,
):
    """A lease owned under ``max_running=1`` ends (through `find_lease`, as another server
    would end it) while its limit is removed; the limit set again finds the slot free."""
    await scheduler.set_limit("job", max_running=1)
    await _publish(scheduler, 2)
    [lease] = await scheduler.own(["job"], worker_id="w", lease=3600 * SECONDS)
    assert await scheduler.remove_limit("job")
    found = await scheduler.find_lease(lease.key, worker_id="w", run_id=lease.run_id)
    await scheduler.succeed(found)
    await scheduler.set_limit("job", max_running=1)
    [second] = await scheduler.own(["job"], worker_id="w")
    assert second.key == "t1"


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_limit_set_while_owned_leases_run_counts_them(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]], where: str
):
    """Three leases run; ``max_running=1`` is set (by their process, or another): none more
    starts until two of them have ended, and one once all three have."""
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await _publish(sched, 5)
    leases = await sched.own(["job"], worker_id="w", max_tasks=3, lease=3600 * SECONDS)
    assert len(leases) == 3
    setter = sched if where == "here" else other
    await setter.set_limit("job", max_running=1)
    assert await other.own(["job"], worker_id="w2") == []
    assert await sched.own(["job"], worker_id="w3") == []
    for lease in leases[:2]:
        await sched.succeed(lease)
        assert await other.own(["job"], worker_id="w2") == []
    await sched.succeed(leases[2])
    assert len(await other.own(["job"], worker_id="w2", max_tasks=2)) == 1


@pytest.mark.parametrize("lease", [None, 2 * SECONDS], ids=["task_timeout", "lease_given"])
async def test_the_slot_of_a_vanished_owner_frees_with_its_lease(
    scheduler: ms.Scheduler, clock: ManualClock, lease: dt.timedelta | None
):
    """An owner takes a task under ``max_running=1`` and vanishes: as soon as its lease
    expires (``worker_timeout_ms``, or the ``lease`` it asked for), the task and the slot are
    free for another owner."""
    await scheduler.set_limit("job", max_running=1)
    await _publish(scheduler, 2, worker_timeout_ms=2_000, ping_interval_ms=500)
    [gone] = await scheduler.own(["job"], worker_id="gone", lease=lease)
    assert gone.ping_expire_at == clock.now() + 2 * SECONDS
    clock.advance(1.9)
    assert await scheduler.own(["job"], worker_id="w") == []
    clock.advance(0.2)
    [taken] = await scheduler.own(["job"], worker_id="w")
    assert taken.key == "t0"


async def test_a_lease_lost_to_a_cancel_frees_its_slot_when_its_worker_learns_of_it(
    scheduler: ms.Scheduler,
):
    """A task owned under ``max_running=1`` is cancelled: the worker's next extend finds the
    lease gone, and the name's slot is free at once, not at the end of the lease."""
    await scheduler.set_limit("job", max_running=1)
    await _publish(scheduler, 2)
    [lease] = await scheduler.own(["job"], worker_id="w", lease=3600 * SECONDS)
    assert await scheduler.cancel(lease.key)
    with pytest.raises(LeaseLost):
        await scheduler.extend(lease, 3600 * SECONDS)
    [second] = await scheduler.own(["job"], worker_id="w")
    assert second.key == "t1"


async def test_a_lease_ended_before_its_process_hears_of_a_new_limit_frees_its_slot(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]],
    discover: Callable[[], Awaitable[None]],
):
    """A consumer runs the control hub of the owner's process. Another process sets
    ``max_running=1`` while a pull lease of the name runs (the limit counts it), and the
    lease ends before the owner's process has heard of the limit: the name is free at once,
    not blocked until the end the ended lease had."""
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await _publish(sched, 2)

    async def idle(task: ms.Task) -> None: ...

    async with sched.consumer({"other": idle}, options=ms.WorkerOptions(worker_id="c")):
        await discover()
        [lease] = await sched.own(["job"], worker_id="w", lease=3600 * SECONDS)
        await other.set_limit("job", max_running=1)
        await sched.succeed(lease)
        [second] = await other.own(["job"], worker_id="w2")
    assert second.key == "t1"
    assert await _live_slots(sched, "job") == 1


async def test_a_lease_extended_before_its_process_hears_of_a_new_limit_keeps_its_slot(
    open_scheduler: Callable[..., Awaitable[ms.Scheduler]],
    discover: Callable[[], Awaitable[None]],
    clock: ManualClock,
):
    """Another process sets ``max_running=1`` while a pull lease of the name runs, and the
    lease is extended before the owner's process has heard of the limit: its slot lives as
    long as the extended lease, so no second task of the name starts beside it."""
    sched = await open_scheduler(collection="shared")
    other = await open_scheduler(collection="shared")
    await _publish(sched, 2)

    async def idle(task: ms.Task) -> None: ...

    async with sched.consumer({"other": idle}, options=ms.WorkerOptions(worker_id="c")):
        await discover()
        [lease] = await sched.own(["job"], worker_id="w", lease=10 * SECONDS)
        await other.set_limit("job", max_running=1)
        lease = await sched.extend(lease, 3600 * SECONDS)
    clock.advance(11)
    assert await other.own(["job"], worker_id="w2") == []
    await sched.succeed(lease)
    assert len(await other.own(["job"], worker_id="w2")) == 1


async def _live_slots(sched: ms.Scheduler, name: str) -> int:
    limit = (await sched.limits()).get(name)
    now = sched.store.clock.now()
    return 0 if limit is None else len([s for s in limit.slots if s.until and s.until > now])
