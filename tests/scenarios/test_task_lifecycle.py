"""A published task's life in the store: the claim's rules, leases and pings, finishing,
cancelling, statistics (publishing: test_publishing.py). On every engine."""

from __future__ import annotations

import datetime as dt

import pytest

import mscheduler as ms
from mscheduler.errors import LeaseLost, PayloadError
from mscheduler.models import Lease, WorkerStateKind
from mscheduler.testing import ManualClock
from tests.oracle import check_consistent

pytestmark = pytest.mark.anyio
K = WorkerStateKind
S = ms.TaskState

FAST = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=10_000)


async def claim(sched: ms.Scheduler, worker: str, name: str = "job") -> Lease | None:
    lease = await sched.store.tasks.claim(worker, names=[name])
    if lease is not None:
        check_consistent(lease.task)
    return lease


async def must_claim(sched: ms.Scheduler, worker: str, name: str = "job") -> Lease:
    lease = await claim(sched, worker, name)
    assert lease is not None, f"{worker} could not claim"
    return lease


async def current(sched: ms.Scheduler, key: str) -> ms.Task:
    task = await sched.get(key)
    assert task is not None
    check_consistent(task)
    return task


# ------------------------------------------------------------------------ claim rules


async def test_claim_takes_only_the_names_asked_for(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="email")
    assert await claim(scheduler, "w1", "sms") is None
    assert await claim(scheduler, "w1", "email") is not None


async def test_claim_waits_for_not_before(scheduler: ms.Scheduler, clock: ManualClock):
    later = clock.now() + dt.timedelta(minutes=5)
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(not_before=later))
    assert (await current(scheduler, "k")).next_claim_at == later
    clock.advance(299)
    assert await claim(scheduler, "w1") is None
    clock.advance(1)
    assert await claim(scheduler, "w1") is not None


async def test_claim_waits_for_pending_dependencies(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    # Flows set deps_pending; here we set it as they will, to check the claim honours it.
    await scheduler.collection.update_one({"key": "k"}, {"$set": {"deps_pending": ["x"]}})
    assert await claim(scheduler, "w1") is None
    await scheduler.collection.update_one({"key": "k"}, {"$set": {"deps_pending": []}})
    assert await claim(scheduler, "w1") is not None


async def test_specific_worker_ids_restrict_who_claims(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(specific_worker_ids=["w2"])
    await scheduler.publish("k", None, name="job", options=opts)
    assert await claim(scheduler, "w1") is None
    lease = await must_claim(scheduler, "w2")
    assert lease.worker_id == "w2"


async def test_a_worker_never_holds_two_states_of_one_task(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(concurrent_worker_cnt=3)
    await scheduler.publish("k", None, name="job", options=opts)
    await must_claim(scheduler, "w1")
    assert await claim(scheduler, "w1") is None
    await must_claim(scheduler, "w2")


async def test_claim_refused_when_every_slot_is_held(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(concurrent_worker_cnt=2)
    await scheduler.publish("k", None, name="job", options=opts)
    await must_claim(scheduler, "w1")
    await must_claim(scheduler, "w2")
    assert await claim(scheduler, "w3") is None
    task = await current(scheduler, "k")
    assert len(task.states(K.RUNNING)) == 2


async def test_claim_refused_once_retries_are_exhausted(scheduler: ms.Scheduler):
    opts = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    await scheduler.publish("k", None, name="job", options=opts)
    for _ in range(2):
        await scheduler.store.tasks.fail(await must_claim(scheduler, "w1"), ValueError("bad"))
    task = await current(scheduler, "k")
    assert task.state is S.FAIL
    assert task.error is not None and task.error.type == "ValueError"
    assert await claim(scheduler, "w2") is None


async def test_claim_order_is_priority_then_age(scheduler: ms.Scheduler, clock: ManualClock):
    for key, priority in [("old-low", 0), ("old-high", 5), ("new-high", 5), ("new-low", 0)]:
        await scheduler.publish(key, None, name="job", options=ms.TaskOptions(priority=priority))
        clock.advance(1)
    order = [(await must_claim(scheduler, f"w{i}")).key for i in range(4)]
    assert order == ["old-high", "new-high", "old-low", "new-low"]


async def test_equal_priority_in_one_batch_is_strict_fifo(scheduler: ms.Scheduler):
    """One batch shares created_at: the claim order falls back to _id, on every engine."""
    keys = [f"batch:{n:02d}" for n in range(20)]
    await scheduler.publish_many([ms.TaskSpec(key=key, name="job") for key in keys])
    order = [(await must_claim(scheduler, f"w{i}")).key for i in range(len(keys))]
    assert order == keys


async def test_claim_by_key(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job")
    lease = await scheduler.store.tasks.claim("w1", key="b")
    assert lease is not None and lease.key == "b"
    assert await scheduler.store.tasks.claim("w2", key="b") is None


# ------------------------------------------------------------------------ leases


async def test_takeover_after_expiry_and_not_before(scheduler: ms.Scheduler, clock):
    await scheduler.publish("k", None, name="job", options=FAST)
    first = await must_claim(scheduler, "w1")
    assert first.ping_expire_at == clock.now() + dt.timedelta(seconds=10)
    clock.advance(9.999)
    assert await claim(scheduler, "w2") is None, "taken over before the lease expired"
    clock.advance(0.001)
    second = await must_claim(scheduler, "w2")
    task = second.task
    assert [ws.state for ws in task.worker_states] == [K.TIMEOUT, K.RUNNING]
    assert task.worker_states[0].finished_at == first.ping_expire_at
    assert task.unexpected_failures == 1


async def test_a_dead_attempt_records_when_it_was_last_heard_and_when_its_lease_expired(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """A worker that died 8 s in: its attempt ended when its lease expired (its last ping
    plus the worker timeout), however much later a claim noticed; and it says when the worker
    was last heard, which is when it died as far as anyone can tell."""
    await scheduler.publish("k", None, name="job", options=FAST)
    lease = await must_claim(scheduler, "w1")
    started = clock.now()
    clock.advance(8)
    await scheduler.store.tasks.ping(lease)
    clock.advance(60)  # noticed long after the lease expired (at 18 s)
    task = (await must_claim(scheduler, "w2")).task
    dead = task.worker_states[0]
    assert dead.state is K.TIMEOUT
    assert dead.finished_at == started + dt.timedelta(seconds=18)
    assert dead.pinged_at == started + dt.timedelta(seconds=8)
    assert task.worker_states[1].pinged_at is None  # a claim is no ping
    # As `mscheduler show` and the dashboard's task page tell it: heard for 8 s, then silent.
    from mscheduler.cli.show import render
    from mscheduler.dashboard.app import _took

    [row] = [line for line in render(task, clock.now()).splitlines() if " timeout " in line]
    assert "8.000s, then silent" in row and "18.000s" not in row
    assert _took(dead) == "8.000s, then silent"


async def test_ping_extends_the_lease(scheduler: ms.Scheduler, clock: ManualClock):
    await scheduler.publish("k", None, name="job", options=FAST)
    lease = await must_claim(scheduler, "w1")
    clock.advance(8)
    task = await scheduler.store.tasks.ping(lease)
    check_consistent(task)
    assert task.worker_states[0].ping_expire_at == clock.now() + dt.timedelta(seconds=10)
    clock.advance(8)
    assert await claim(scheduler, "w2") is None, "a pinged lease was taken over"


@pytest.mark.parametrize("write", ["ping", "succeed", "fail", "release"])
async def test_late_worker_gets_lease_lost(scheduler: ms.Scheduler, clock, write: str):
    await scheduler.publish("k", None, name="job", options=FAST)
    late = await must_claim(scheduler, "w1")
    clock.advance(11)
    await must_claim(scheduler, "w2")
    before = await current(scheduler, "k")
    calls = {
        "ping": lambda: scheduler.store.tasks.ping(late),
        "succeed": lambda: scheduler.store.tasks.succeed(late, "late result"),
        "fail": lambda: scheduler.store.tasks.fail(late, RuntimeError("late")),
        "release": lambda: scheduler.store.tasks.release(late),
    }
    with pytest.raises(LeaseLost, match="w1"):
        await calls[write]()
    after = await current(scheduler, "k")
    assert after.version == before.version, "a late worker's write changed the task"


async def test_expired_lease_is_dead_even_before_takeover(scheduler: ms.Scheduler, clock):
    await scheduler.publish("k", None, name="job", options=FAST)
    lease = await must_claim(scheduler, "w1")
    clock.advance(10)
    with pytest.raises(LeaseLost, match="expired"):
        await scheduler.store.tasks.succeed(lease, 1)


async def test_success_stores_the_result(scheduler: ms.Scheduler, clock: ManualClock):
    await scheduler.publish("k", None, name="job")
    lease = await must_claim(scheduler, "w1")
    clock.advance(2)
    task = await scheduler.store.tasks.succeed(lease, {"rows": 3, "path": "$not.a.path"})
    check_consistent(task)
    assert task.state is S.SUCCESS
    assert task.result == {"rows": 3, "path": "$not.a.path"}
    assert task.worker_states[0].finished_at == clock.now()


async def test_fail_stores_a_bounded_error_summary(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(max_unexpected_retries=0))
    lease = await must_claim(scheduler, "w1")

    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("x" * 100_000)
        deep(n - 1)

    try:
        deep(200)
    except KeyError as exc:
        task = await scheduler.store.tasks.fail(lease, exc)
    assert task.state is S.FAIL and task.error is not None
    assert task.error.type == "KeyError"
    assert len(task.error.message) <= 4_000
    assert "deep" in task.error.traceback and len(task.error.traceback) <= 8_000


async def test_concurrency_two_needs_two_distinct_workers(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(concurrent_worker_cnt=2))
    one = await must_claim(scheduler, "w1")
    await scheduler.store.tasks.succeed(one, "a")
    assert (await current(scheduler, "k")).state is S.PENDING
    assert await claim(scheduler, "w1") is None, "the same worker succeeded twice"
    two = await must_claim(scheduler, "w2")
    task = await scheduler.store.tasks.succeed(two, "b")
    assert task.state is S.SUCCESS
    assert {ws.worker_id for ws in task.states(K.SUCCESS)} == {"w1", "w2"}


async def test_retries_exhausted_by_timeouts_end_in_fail(scheduler: ms.Scheduler, clock):
    opts = ms.TaskOptions(max_unexpected_retries=2, ping_interval_ms=1_000, worker_timeout_ms=5_000)
    await scheduler.publish("k", None, name="job", options=opts)
    for attempt in range(3):
        await must_claim(scheduler, f"w{attempt}")
        clock.advance(5)
    # The next claim records the third timeout, finds the retries exhausted and takes nothing.
    assert await claim(scheduler, "w9") is None
    task = await current(scheduler, "k")
    assert task.state is S.FAIL
    assert [ws.state for ws in task.worker_states] == [K.TIMEOUT] * 3
    assert task.error is not None and task.error.type == "WorkerTimeout"


async def test_a_task_s_error_is_the_error_of_its_outcome(scheduler: ms.Scheduler, clock):
    """An attempt's error stays with that attempt: the task carries one only when it ended
    in it (fail, cancelled), never while it waits to run again nor once it succeeded."""
    opts = ms.TaskOptions(max_unexpected_retries=2, ping_interval_ms=1_000, worker_timeout_ms=5_000)
    await scheduler.publish("k", None, name="job", options=opts)
    await scheduler.store.tasks.fail(await must_claim(scheduler, "w1"), RuntimeError("first"))
    waiting = await current(scheduler, "k")
    assert waiting.state is S.PENDING and waiting.error is None
    clock.advance(60)
    await must_claim(scheduler, "w2")
    clock.advance(5)  # its lease expires
    lease = await must_claim(scheduler, "w3")
    task = await scheduler.store.tasks.succeed(lease, "done")
    check_consistent(task)
    assert task.state is S.SUCCESS and task.error is None
    errors = [ws.error.type if ws.error else None for ws in task.worker_states]
    assert errors == ["RuntimeError", "WorkerTimeout", None]


async def test_failure_delays_the_next_claim(scheduler: ms.Scheduler, clock: ManualClock):
    opts = ms.TaskOptions(unexpected_retry_delay_ms=3_000)
    await scheduler.publish("k", None, name="job", options=opts)
    await scheduler.store.tasks.fail(await must_claim(scheduler, "w1"), RuntimeError("x"))
    clock.advance(2.999)
    assert await claim(scheduler, "w1") is None
    clock.advance(0.001)
    assert await claim(scheduler, "w1") is not None, "the same worker may retry its failure"


async def test_release_frees_the_slot_without_counting_a_failure(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    lease = await must_claim(scheduler, "w1")
    task = await scheduler.store.tasks.release(lease, "shutting down")
    assert task.state is S.PENDING and task.unexpected_failures == 0
    assert await claim(scheduler, "w2") is not None


async def test_cancel_ends_the_task_and_fences_its_workers(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    lease = await must_claim(scheduler, "w1")
    assert await scheduler.cancel("k", "no longer needed")
    task = await current(scheduler, "k")
    assert task.state is S.CANCELLED
    assert task.error is not None and task.error.message == "no longer needed"
    assert [ws.state for ws in task.worker_states] == [K.RELEASED]
    with pytest.raises(LeaseLost, match="cancelled"):
        await scheduler.store.tasks.ping(lease)
    assert not await scheduler.cancel("k"), "cancelling twice reports nothing done"
    assert await claim(scheduler, "w2") is None


async def test_ping_many_reports_only_lost_leases(scheduler: ms.Scheduler, clock):
    opts = ms.TaskOptions(concurrent_worker_cnt=1, ping_interval_ms=1_000, worker_timeout_ms=5_000)
    for key in ("a", "b", "c"):
        await scheduler.publish(key, None, name="job", options=opts)
    leases = [await must_claim(scheduler, "w1") for _ in range(3)]
    await scheduler.cancel("b")
    assert await scheduler.store.tasks.ping_many(leases) == [leases[1]]
    clock.advance(4)
    assert await scheduler.store.tasks.ping_many([leases[0], leases[2]]) == []


async def test_result_that_cannot_be_stored_keeps_the_lease(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    lease = await must_claim(scheduler, "w1")
    with pytest.raises(PayloadError, match="result"):
        await scheduler.store.tasks.succeed(lease, {"blob": "x" * (2 * 1024 * 1024)})
    with pytest.raises(PayloadError, match="result"):
        await scheduler.store.tasks.succeed(lease, object())
    task = await scheduler.store.tasks.succeed(lease, "small")
    assert task.state is S.SUCCESS


# ------------------------------------------------------------------------ statistics


async def test_stats_count_by_name_and_state(scheduler: ms.Scheduler, clock: ManualClock):
    await scheduler.publish("old", None, name="email")
    clock.advance(30)
    await scheduler.publish("new", None, name="email")
    await scheduler.publish("s1", None, name="sms", options=ms.TaskOptions(concurrent_worker_cnt=2))
    await must_claim(scheduler, "w1", "sms")
    await must_claim(scheduler, "w2", "sms")
    await scheduler.publish("gone", None, name="sms")
    await scheduler.cancel("gone")
    clock.advance(10)
    rows = {(row.name, row.state): row for row in await scheduler.stats()}
    assert set(rows) == {("email", S.PENDING), ("sms", S.RUNNING), ("sms", S.CANCELLED)}
    assert rows["email", S.PENDING].count == 2
    assert rows["email", S.PENDING].oldest_age_s == 40
    assert rows["sms", S.RUNNING].running_workers == 2
    assert rows["sms", S.CANCELLED].count == 1


async def test_a_task_written_without_worker_states_does_not_break_claims(
    scheduler: ms.Scheduler,
):
    """A task inserted by hand without ``worker_states``: ``$size`` of a missing array would
    fail every claim of its name; it counts no states, and its claim stores the array."""
    await scheduler.publish("normal", None, name="job")
    document = await scheduler.collection.find_one({"key": "normal"})
    assert document is not None
    del document["_id"], document["worker_states"]
    await scheduler.collection.insert_one({**document, "key": "by-hand"})
    claimed = {
        lease.key for lease in await scheduler.store.tasks.claim_many("w", names=["job"], limit=5)
    }
    assert claimed == {"normal", "by-hand"}
    task = await scheduler.get("by-hand")
    assert task is not None and [ws.worker_id for ws in task.worker_states] == ["w"]
