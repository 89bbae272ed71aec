"""Batched claims: up to k tasks in three round trips, in claim order, each one the
single claim's conditional write; races and lost replies handled as for one claim."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pymongo.errors import AutoReconnect

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.errors import BackendUnavailable, ClaimUncertain
from mscheduler.models import Lease, WorkerStateKind
from mscheduler.testing import ManualClock
from tests.faults import LosesClaimAndLookUp

pytestmark = pytest.mark.anyio


async def _publish(sched: ms.Scheduler, count: int) -> None:
    await sched.publish_many(
        ms.TaskSpec(key=f"t{n}", name="job", options=ms.TaskOptions(priority=n % 3))
        for n in range(count)
    )


async def _stored(sched: ms.Scheduler, key: str) -> dict[str, object]:
    document = await sched.collection.find_one({"key": key}, {"_id": 0, "key": 0})
    assert document is not None
    for state in document["worker_states"]:
        state["run_id"] = "run"
    return document


async def test_a_quick_claim_writes_what_the_claim_pipeline_writes(scheduler: ms.Scheduler):
    """The batched claim of a task nobody has claimed yet computes its document from the
    candidate it read: the same document the claim pipeline gives (that of a single claim)."""
    options = ms.TaskOptions(worker_timeout_ms=45_000, not_before=scheduler.store.clock.now())
    await scheduler.publish_many(
        ms.TaskSpec(key=key, name="job", options=options) for key in ("single", "batched")
    )
    single = await scheduler.store.tasks.claim("w1", key="single")
    assert single is not None
    leases = await scheduler.store.tasks.claim_many("w1", names=["job"], limit=3)
    assert [lease.key for lease in leases] == ["batched"]
    assert await _stored(scheduler, "batched") == await _stored(scheduler, "single")


async def test_a_batch_takes_the_best_in_claim_order_in_two_calls(scheduler: ms.Scheduler):
    await _publish(scheduler, 12)
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    counting.reset()
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=5)
    assert counting.calls == 2, counting.counts  # the candidates, their claims: no read back
    # priority 2 first (t2, t5, t8, t11), then priority 1 by age (t1)
    assert [lease.key for lease in leases] == ["t2", "t5", "t8", "t11", "t1"]
    assert len({lease.run_id for lease in leases}) == 5
    for lease in leases:
        task = await scheduler.get(lease.key)
        assert task is not None and task.state is ms.TaskState.RUNNING
        assert [ws.run_id for ws in task.worker_states] == [lease.run_id]
        assert lease.task == task  # the document computed for the lease is the stored one
    # The next batch goes on where this one stopped, never twice the same task.
    more = await sched.store.tasks.claim_many("w2", names=["job"], limit=10)
    assert {lease.key for lease in more}.isdisjoint(lease.key for lease in leases)
    assert len(more) == 7


async def test_a_batch_claims_by_the_worker_states_whatever_the_derived_fields_say(
    scheduler: ms.Scheduler,
):
    """The candidate read leaves the slot arithmetic over the worker states to the writes: a
    task held by another worker whose derived fields say otherwise (written by hand) is read
    and not claimed; the others are."""
    await _publish(scheduler, 4)
    held = await scheduler.store.tasks.claim("w2", key="t1")
    assert held is not None
    now = scheduler.store.clock.now()
    await scheduler.collection.update_one(
        {"key": "t1"}, {"$set": {"state": "pending", "next_claim_at": now}}
    )
    leases = await scheduler.store.tasks.claim_many("w1", names=["job"], limit=10)
    assert sorted(lease.key for lease in leases) == ["t0", "t2", "t3"]
    task = await scheduler.get("t1")
    assert task is not None and [ws.worker_id for ws in task.worker_states] == ["w2"]


async def test_a_task_with_no_try_left_is_not_due_while_its_last_attempt_runs(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Two workers may run it, but its tries are spent: no claim may take the free slot, so
    it is not due until its running lease may expire, and a batch neither reads nor writes
    it meanwhile (it would lose it at every round)."""
    options = ms.TaskOptions(concurrent_worker_cnt=2, max_tries=2)
    await scheduler.publish("t", None, name="job", options=options)
    first = await scheduler.store.tasks.claim("w1", key="t")
    assert first is not None
    await scheduler.store.tasks.fail(first, RuntimeError("broken"))
    clock.advance(3600)  # past the retry delay
    last = await scheduler.store.tasks.claim("w2", key="t")
    assert last is not None and last.ping_expire_at is not None
    task = await scheduler.get("t")
    assert task is not None and task.next_claim_at == last.ping_expire_at
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=clock)
    await sched.ensure_indexes()
    counting.reset()
    assert await sched.store.tasks.claim_many("w3", names=["job"], limit=5) == []
    assert counting.counts == {"find": 1}, counting.counts


async def test_dead_last_tries_at_the_head_do_not_starve_a_batch(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Tasks whose last try's worker died (max_tries spent, the lease expired, nothing swept
    them) are due by next_claim_at and refused by every claim filter; a batch must still
    claim the claimable task behind them, in a bounded number of round trips."""
    for n in range(3):
        await scheduler.publish(
            f"dead{n}", None, name="job", options=ms.TaskOptions(max_tries=1, priority=5)
        )
        assert await scheduler.store.tasks.claim("w1", key=f"dead{n}") is not None
    await scheduler.publish("ok", None, name="job")
    clock.advance(3600)  # w1 crashed: its leases expired long ago
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=clock)
    await sched.ensure_indexes()
    counting.reset()
    leases = await sched.store.tasks.claim_many("w2", names=["job"], limit=3)
    assert [lease.key for lease in leases] == ["ok"], counting.counts


async def test_a_claim_ends_a_task_whose_last_try_died(scheduler: ms.Scheduler, clock: ManualClock):
    """No try left, and the attempt that spent it died: a lease expires without a write, so
    a claim must end the task (as when timeouts exhaust its retries), not leave it running."""
    await scheduler.publish("dead", None, name="job", options=ms.TaskOptions(max_tries=1))
    lease = await scheduler.store.tasks.claim("w1", key="dead")
    assert lease is not None
    clock.advance(3600)
    assert await scheduler.store.tasks.claim("w2", names=["job"]) is None
    await scheduler.store.tasks.claim_many("w2", names=["job"], limit=5)
    task = await scheduler.get("dead")
    assert task is not None
    assert task.state is ms.TaskState.FAIL, task.state


async def test_a_sharded_single_claim_is_not_starved_by_one_dead_last_try(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Behind a mongos a single claim by names is a batch of one: one task whose only try's
    worker vanished, first in claim order, must not hide the claimable task behind it."""
    await scheduler.publish("dead", None, name="job", options=ms.TaskOptions(max_tries=1))
    assert await scheduler.store.tasks.claim("ghost", key="dead") is not None
    clock.advance(3600)
    await scheduler.publish("ok", None, name="job")
    await scheduler.ensure_indexes()
    scheduler.store.tasks._base.sharded = True  # as behind a mongos
    lease = await scheduler.store.tasks.claim("w2", names=["job"])
    assert lease is not None and lease.key == "ok"


async def test_a_batch_is_not_starved_by_tasks_whose_slots_were_cut_while_they_run(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """concurrent_worker_cnt cut from 2 to 1 while two workers run: once the first lease
    expires the other still fills the one slot, yet next_claim_at (the first expiry) says
    due. A batch must still claim the claimable task behind three such tasks."""
    two = ms.TaskOptions(concurrent_worker_cnt=2)
    for n in range(3):
        await scheduler.publish(f"x{n}", None, name="job", options=two)
        assert await scheduler.store.tasks.claim("a", key=f"x{n}") is not None
    clock.advance(30)
    for n in range(3):
        assert await scheduler.store.tasks.claim("b", key=f"x{n}") is not None
        assert await scheduler.set_options(f"x{n}", ms.TaskOptions(concurrent_worker_cnt=1))
    await scheduler.publish("ok", None, name="job")
    clock.advance(31)  # a's leases expired (a crashed), b's live (b pings every 30 s)
    leases = await scheduler.store.tasks.claim_many("w3", names=["job"], limit=3)
    assert [lease.key for lease in leases] == ["ok"]


class _TakesFirst(CountingCollection):
    """Another worker claims ``key`` between the batch's read and its write."""

    def __init__(self, collection: Any, scheduler: ms.Scheduler, key: str) -> None:
        super().__init__(collection)
        self.other, self.key = scheduler, key

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        assert await self.other.store.tasks.claim("rival", key=self.key) is not None
        return await self.wrapped.bulk_write(requests, **kwargs)


async def test_a_candidate_taken_meanwhile_is_not_claimed_twice(scheduler: ms.Scheduler):
    await _publish(scheduler, 6)
    racing = _TakesFirst(scheduler.collection, scheduler, "t2")
    sched = ms.Scheduler(racing, clock=scheduler.store.clock)
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=4)
    assert "t2" not in {lease.key for lease in leases} and len(leases) == 3
    task = await scheduler.get("t2")
    assert task is not None and [ws.worker_id for ws in task.worker_states] == ["rival"]


class _LosesReplies(CountingCollection):
    """The bulk write is applied and its reply lost; with ``reads_lost`` the look-up too."""

    def __init__(self, collection: Any, reads_lost: int) -> None:
        super().__init__(collection)
        self.reads_lost = reads_lost
        self.bulk_lost = True

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        await self.wrapped.bulk_write(requests, **kwargs)
        if self.bulk_lost:
            self.bulk_lost = False
            raise AutoReconnect("connection reset after the batch was applied")
        return None

    def find(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "worker_states.run_id" in query and self.reads_lost:
            self.reads_lost -= 1
            raise AutoReconnect("connection reset during the look-up")
        return self.wrapped.find(query, *args, **kwargs)


async def test_a_lost_reply_is_recovered_by_run_id(scheduler: ms.Scheduler):
    await _publish(scheduler, 5)
    sched = ms.Scheduler(_LosesReplies(scheduler.collection, 0), clock=scheduler.store.clock)
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=4)
    assert len(leases) == 4


async def test_a_lost_reply_and_look_up_leave_every_run_uncertain(scheduler: ms.Scheduler):
    await _publish(scheduler, 5)
    sched = ms.Scheduler(_LosesReplies(scheduler.collection, 1), clock=scheduler.store.clock)
    with pytest.raises(ClaimUncertain) as uncertain:
        await sched.store.tasks.claim_many("w1", names=["job"], limit=4)
    assert len(uncertain.value.run_ids) == 4
    found = await sched.store.tasks.find_claims("w1", uncertain.value.run_ids)
    assert len(found) == 4  # each one is recovered


class _BulkNeverArrives(CountingCollection):
    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        raise AutoReconnect("connection reset before the batch reached the server")


async def test_a_batch_that_never_arrived_is_a_network_error_not_nothing_to_claim(
    scheduler: ms.Scheduler,
):
    """No leases would tell the consumer nothing is claimable: it would drop its due keys, and
    the tasks would wait for a change that never comes."""
    await _publish(scheduler, 5)
    sched = ms.Scheduler(_BulkNeverArrives(scheduler.collection), clock=scheduler.store.clock)
    with pytest.raises(BackendUnavailable):
        await sched.store.tasks.claim_many("w1", names=["job"], limit=4)
    assert all(t.state is ms.TaskState.PENDING for t in await scheduler.store.get_many(["t0"]))


class _TakesAllFirst(CountingCollection):
    """Rivals claim every candidate of the first batch between its read and its write."""

    def __init__(self, collection: Any, scheduler: ms.Scheduler) -> None:
        super().__init__(collection)
        self.other, self.rounds = scheduler, 0

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        self.rounds += 1
        if self.rounds == 1:
            for request in requests:
                found = await self.wrapped.find_one({"_id": request._filter["_id"]})
                assert await self.other.store.tasks.claim("rival", key=found["key"]) is not None
        return await self.wrapped.bulk_write(requests, **kwargs)


async def test_a_batch_that_loses_every_candidate_reads_again(scheduler: ms.Scheduler):
    """A reply of no lease would make the consumer forget the tasks it thought due, while
    others are still claimable."""
    await _publish(scheduler, 8)
    racing = _TakesAllFirst(scheduler.collection, scheduler)
    sched = ms.Scheduler(racing, clock=scheduler.store.clock)
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=4)
    assert racing.rounds == 2 and len(leases) == 4
    # The lost round read its candidates and wrote; it had nothing of its own to read back,
    # and the round that won computed its documents: nothing to read back either.
    assert racing.counts["find"] == 2, racing.counts  # two reads of candidates


class _RivalTakesTheBest(CountingCollection):
    """Another process claims the best ``batch`` candidates between each read and write."""

    def __init__(self, collection: Any, rival: ms.Scheduler, batch: int) -> None:
        super().__init__(collection)
        self.rival, self.batch = rival, batch

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        taken = await self.rival.store.tasks.claim_many("rival", names=["job"], limit=self.batch)
        assert len(taken) == self.batch
        return await self.wrapped.bulk_write(requests, **kwargs)


async def test_a_process_that_others_beat_to_the_best_candidates_still_wins_tasks(
    scheduler: ms.Scheduler,
):
    """Processes that free their slots together read the same best candidates, and the first
    write takes them all. One that lost them reads a wider window of the best and claims
    among it, so it wins tasks while the other keeps taking the best; each task once."""
    batch = 16
    await scheduler.publish_many(ms.TaskSpec(key=f"t{n}", name="job") for n in range(12 * batch))
    rival = ms.Scheduler(scheduler.collection, clock=scheduler.store.clock)
    sched = ms.Scheduler(
        _RivalTakesTheBest(scheduler.collection, rival, batch), clock=scheduler.store.clock
    )
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=batch)
    assert leases
    window = sched.services.claim_turns.window
    assert window.lost_reads == 1 and window.reads == 2  # one round lost, the next won
    assert window.batches == 3  # wider after each round that lost a candidate
    for lease in leases:
        task = await scheduler.get(lease.key)
        assert task is not None and [ws.worker_id for ws in task.worker_states] == ["w1"]


async def test_a_process_alone_reads_only_the_batch_it_claims(scheduler: ms.Scheduler):
    await _publish(scheduler, 40)
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    for _ in range(3):
        assert len(await sched.store.tasks.claim_many("w1", names=["job"], limit=8)) == 8
    window = sched.services.claim_turns.window
    assert (window.batches, window.reads, window.lost_reads) == (1, 3, 0)


class _YieldsBeforeWriting(CountingCollection):
    """A server's round trip: other tasks of the process run while a write is in flight."""

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return await super().bulk_write(requests, **kwargs)


async def test_batches_of_one_store_take_turns_instead_of_splitting_the_same_candidates(
    scheduler: ms.Scheduler,
):
    """Consumers of one process, whose slots free together, would read the same best
    candidates at once, and all but one would lose them and read again."""
    await _publish(scheduler, 8)
    counting = _YieldsBeforeWriting(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    counting.reset()
    won: dict[str, list[Lease]] = {}

    async def claim(worker_id: str) -> None:
        won[worker_id] = await sched.store.tasks.claim_many(worker_id, names=["job"], limit=4)

    async with anyio.create_task_group() as group:
        group.start_soon(claim, "w1")
        group.start_soon(claim, "w2")
    assert [len(won["w1"]), len(won["w2"])] == [4, 4]
    assert {lease.key for lease in won["w1"]}.isdisjoint(lease.key for lease in won["w2"])
    assert counting.calls == 4, counting.counts  # two batches of two round trips, no loss


class _BrokenCursor:
    def __aiter__(self) -> _BrokenCursor:
        return self

    async def __anext__(self) -> Any:
        raise AutoReconnect("connection reset during a cursor read")


class _ReadsFail(CountingCollection):
    """Cursor reads matching ``field`` fail ``times`` times (the writes before them land)."""

    def __init__(self, collection: Any, field: str, times: int = 1) -> None:
        super().__init__(collection)
        self.field, self.times = field, times

    def find(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if self.field in query and self.times:
            self.times -= 1
            return _BrokenCursor()
        return super().find(query, *args, **kwargs)


class _ReplyLostAndReadsFail(_ReadsFail):
    """The first bulk write lands but its reply is lost; then reads fail as `_ReadsFail`."""

    lost = False

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        result = await super().bulk_write(requests, **kwargs)
        if not self.lost:
            self.lost = True
            raise AutoReconnect("connection reset before the reply")
        return result


async def test_a_batch_whose_read_back_fails_runs_every_task_it_won(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """The claims landed, their reply was lost and so was the read of their runs: each lease
    is looked up and run while it lives, none left to expire unrun."""
    await _publish(scheduler, 4)
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    failing = _ReplyLostAndReadsFail(scheduler.collection, "worker_states.run_id")
    sched = ms.Scheduler(failing, clock=clock)
    options = ms.WorkerOptions(worker_id="w1", max_running=4, poll_interval_ms=10)
    async with sched.consumer({"job": job}, options=options):
        await discover()
        assert failing.times == 0  # the read did fail
        clock.advance(1)  # the reconnect delay
        await discover()
        assert sorted(ran) == ["t0", "t1", "t2", "t3"]
    for task in await scheduler.store.get_many(["t0", "t1", "t2", "t3"]):
        assert task.state is ms.TaskState.SUCCESS
        assert [ws.state for ws in task.worker_states] == [WorkerStateKind.SUCCESS]


async def test_a_batch_keeps_its_leases_when_telling_dependents_fails(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """A candidate whose claim failed it (its retries exhausted by a timeout), whose dependents
    a read that fails was to tell: the other candidates' leases are still returned, the
    dependents owed."""
    options = ms.TaskOptions(
        max_unexpected_retries=0, ping_interval_ms=1_000, worker_timeout_ms=5_000
    )
    await scheduler.publish("dead", None, name="job", options=options)
    assert await scheduler.store.tasks.claim("ghost", key="dead") is not None  # then it died
    clock.advance(6)
    await scheduler.publish("after", None, name="next", depends_on=["dead"])
    await _publish(scheduler, 3)
    failing = _ReadsFail(scheduler.collection, "_id")
    sched = ms.Scheduler(failing, clock=clock)
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=4)
    assert failing.times == 0  # the settling read did fail
    assert sorted(lease.key for lease in leases) == ["t0", "t1", "t2"]
    dead = await scheduler.get("dead")
    assert dead is not None and dead.state is ms.TaskState.FAIL
    after = await scheduler.get("after")
    assert after is not None and after.state is ms.TaskState.BLOCKED
    assert sched.services.owed.keys  # told later, by `recover_dependents`
    await sched.store.tasks.recover_dependents()
    after = await scheduler.get("after")
    assert after is not None and after.state is ms.TaskState.CANCELLED


async def test_a_graceful_stop_leaves_no_uncertain_claim_behind(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Stopped while a claim's outcome is unknown: the lease it took is found and run within
    the grace period (or released), not left to expire unrun."""
    await scheduler.publish("t0", None, name="job")
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    lossy = LosesClaimAndLookUp(scheduler.collection)
    sched = ms.Scheduler(lossy, clock=clock)
    options = ms.WorkerOptions(worker_id="w1", poll_interval_ms=10, shutdown_grace_ms=1_000)
    consumer = sched.consumer({"job": job}, options=options)
    async with anyio.create_task_group() as group:
        await group.start(consumer.run)
        await discover()
        assert lossy.lost == 2 and ran == []
        consumer.stop()  # before the reconnect delay lets it look the claim up
        await discover()
    task = await scheduler.get("t0")
    assert task is not None and task.state is not ms.TaskState.RUNNING, task.worker_states
