"""A claim examines what it takes, whatever the backlog, as a server's index scan does.

The memory backend counts the documents each query tests against its filter, as ``explain``'s
``totalDocsExamined`` does (`MemoryCollection.docs_examined`). A claim walks the claim index in
claim order and stops at its first matches: it examines the tasks it claims, plus those in
front of them that it skips for a reason the index cannot see (pinned to another worker, or
already held by this one). Memory only: the count is the memory backend's.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

import mscheduler as ms
from mscheduler.backends.memory import MemoryCollection, memory_server
from mscheduler.models import new_run_id
from mscheduler.testing import ManualClock

pytestmark = pytest.mark.anyio

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
PINNED = 7  # in front of the backlog (higher priority), pinned to another worker
HELD = 5  # in front too: two slots each, one of them held by the claiming worker
SKIPPED = PINNED + HELD


async def _backlog(pending: int) -> tuple[ms.Scheduler, MemoryCollection]:
    collection = memory_server("").collection("db", uuid.uuid4().hex, notablescan=True)
    sched = ms.Scheduler(collection, clock=ManualClock(T0))
    pinned = ms.TaskOptions(priority=5, specific_worker_ids=["elsewhere"])
    await sched.publish_many(
        ms.TaskSpec(key=f"pinned:{n}", name="job", options=pinned) for n in range(PINNED)
    )
    two = ms.TaskOptions(priority=5, concurrent_worker_cnt=2)
    await sched.publish_many(
        ms.TaskSpec(key=f"held:{n}", name="job", options=two) for n in range(HELD)
    )
    for n in range(HELD):
        assert await sched.store.tasks.claim("w1", key=f"held:{n}") is not None
    await sched.publish_many(ms.TaskSpec(key=f"job:{n}", name="job") for n in range(pending))
    return sched, collection


@pytest.mark.parametrize("pending", [50, 3_000])
async def test_a_single_claim_examines_the_task_it_takes_and_those_it_skips(pending: int):
    sched, collection = await _backlog(pending)
    for n in range(3):
        before = collection.docs_examined
        lease = await sched.store.tasks.claim("w1", names=["job"])
        assert lease is not None and lease.key == f"job:{n}"
        assert collection.docs_examined - before <= 1 + SKIPPED


@pytest.mark.parametrize("pending", [50, 3_000])
async def test_a_batched_claim_examines_its_batch_and_those_it_skips(pending: int):
    """Its two steps each examine at most the batch: the candidate read (plus the tasks it
    skips) and one document per conditional write; tasks nobody claimed yet are not read
    back, so a claimed task costs two documents examined."""
    sched, collection = await _backlog(pending)
    batch = 16
    for round_ in range(3):
        before = collection.docs_examined
        leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=batch)
        assert [lease.key for lease in leases] == [
            f"job:{n}" for n in range(round_ * batch, (round_ + 1) * batch)
        ]
        assert collection.docs_examined - before <= 2 * batch + SKIPPED


async def test_the_candidate_read_stops_at_the_batch():
    """The read of a batched claim, alone: the batch plus what it skips."""
    from mscheduler.queries import tasks as q

    _, collection = await _backlog(3_000)
    before = collection.docs_examined
    claim = q.claim_filter("w1", T0, names=["job"])
    cursor = collection.find(claim, q.CANDIDATE_PROJECTION, sort=q.CLAIM_SORT, limit=16)
    assert len([document async for document in cursor]) == 16
    assert collection.docs_examined - before <= 16 + SKIPPED


async def test_a_batched_claim_of_tasks_nobody_claimed_evaluates_no_expression(
    monkeypatch: pytest.MonkeyPatch,
):
    """An engine that evaluates a filter in its order (the memory backend, the wire engine)
    matches a task nobody claimed yet by its plain fields (`stages.UNTOUCHED`): the claim
    filter's ``$expr`` over the worker states, costly per candidate, is for tasks with a
    history. Counted by wrapping the memory backend's ``$expr`` evaluator."""
    from mscheduler.backends.memory import engine

    evaluated = 0
    original = engine.filtering._Filterer.parse_expression[0]

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal evaluated
        evaluated += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.filtering._Filterer, "parse_expression", [counting])
    collection = memory_server("").collection("db", uuid.uuid4().hex, notablescan=True)
    sched = ms.Scheduler(collection, clock=ManualClock(T0))
    await sched.publish_many(ms.TaskSpec(key=f"job:{n}", name="job") for n in range(50))
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=16)
    assert [lease.key for lease in leases] == [f"job:{n}" for n in range(16)]
    assert evaluated == 0


def test_a_quick_claim_and_a_quick_success_send_at_most_950_bytes():
    """What the server parses per task in the common case, besides its share of one
    candidate read per batch: the claim's statement and the success's (BSON, as a bulk write
    sends them; the claim's new state carries ``pinged_at``, its attempt's last ping, which
    `mscheduler show` reports for a dead attempt), for a consumer's worker id and a claim's
    run id (`models.new_run_id`) of the usual lengths. The bound is their size now: a
    statement that grows is a decision, taken here."""
    import bson

    from mscheduler.queries import lease as lq
    from mscheduler.queries import tasks as q

    task = q.new_task_document(
        key="job:123",
        name="job",
        payload=None,
        options=ms.TaskOptions(),
        now=T0,
        task_id=bson.ObjectId(),
    )
    worker_id, run_id = "build-host-12345-a1b2c3", new_run_id()  # host-pid-random
    query, update, _ = q.quick_claim(task, worker_id, run_id, T0)
    claim = {"q": query, "u": update, "multi": False, "upsert": False}
    fence = lq.quick_success_filter(task["key"], worker_id, run_id, T0)
    success = {"q": fence, "u": lq.quick_success(None, T0), "multi": False, "upsert": False}
    assert len(bson.encode(claim)) + len(bson.encode(success)) <= 950


def test_a_batchs_candidate_read_sends_at_most_760_bytes():
    """The filter of the candidate read, sent once per batch: the claim filter less the
    arithmetic over the worker states, which each write keeps (`candidate_filter`)."""
    import bson

    from mscheduler.queries import tasks as q

    worker_id = "build-host-12345-a1b2c3"
    wanted = q.candidate_filter(worker_id, T0, names=["job"], exclude_keys=["job:1"])
    assert len(bson.encode(wanted)) <= 760  # the claim filter whole: 1,841


async def test_a_claim_examines_at_most_two_documents_in_a_backlog_of_many_partitions():
    """10,000 tasks in 1,000 partitions: the partitions' turns are the claim index's order, so
    a claim takes the head and examines what it did without partitions, and consecutive
    claims take different partitions."""
    collection = memory_server("").collection("db", uuid.uuid4().hex, notablescan=True)
    # Now, not T0: the partitions' TTL index counts from the real time on the memory engine.
    sched = ms.Scheduler(collection, clock=ManualClock())
    await sched.publish_many(
        ms.TaskSpec(key=f"t{p}:{n}", name="job", options=ms.TaskOptions(partition=f"t{p}"))
        for n in range(10)
        for p in range(1_000)
    )
    before = collection.docs_examined
    late = ms.TaskOptions(partition="late")
    await sched.publish("late", None, name="job", options=late)  # the head's read: one task
    assert collection.docs_examined - before <= 1
    partitions = []
    for _ in range(50):
        before = collection.docs_examined
        lease = await sched.store.tasks.claim("w1", names=["job"])
        assert lease is not None
        assert collection.docs_examined - before <= 2
        partitions.append(lease.task.options.partition)
    assert len(set(partitions)) == 50
    before = collection.docs_examined
    leases = await sched.store.tasks.claim_many("w1", names=["job"], limit=16)
    assert len({lease.task.options.partition for lease in leases}) == 16
    assert collection.docs_examined - before <= 2 * 16
