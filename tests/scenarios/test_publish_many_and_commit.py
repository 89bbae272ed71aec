"""Publishing many at once: flow structures (chain, group, chord), all-or-nothing
publish_many, replace, and commit (finish, publish and delete together)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.errors import (
    ConfigurationError,
    DependencyError,
    LeaseLost,
    PayloadError,
    PreconditionFailed,
    TaskRunning,
)
from mscheduler.models import Lease
from mscheduler.store.transactions import SessionCollection
from tests.scenarios.test_dependencies import finish, run_all, state_of

pytestmark = pytest.mark.anyio
S = ms.TaskState


def spec(key: str, **fields: Any) -> ms.TaskSpec:
    return ms.TaskSpec(key=key, name="job", **fields)


async def snapshot(sched: ms.Scheduler) -> list[tuple[str, int]]:
    cursor = sched.collection.find({}, sort=[("_id", 1)])
    return [(doc["key"], doc["version"]) async for doc in cursor]


def test_chain_group_and_chord_fill_in_the_edges():
    flow = ms.chain(spec("a"), ms.group(spec("b1"), spec("b2")), spec("c"))
    edges = {s.key: s.depends_on for s in flow.specs}
    assert edges == {"a": (), "b1": ("a",), "b2": ("a",), "c": ("b1", "b2")}
    assert (flow.heads, flow.tails) == (("a",), ("c",))
    fan_in = ms.chord([spec("x"), spec("y")], spec("z"))
    assert {s.key: s.depends_on for s in fan_in.specs}["z"] == ("x", "y")


def test_an_empty_chord_is_its_body_alone():
    body = spec("join", depends_on=("earlier",))
    for header in ([], (), iter([])):
        flow = ms.chord(header, body)
        assert flow.specs == (body,) and flow.heads == ("join",) and flow.tails == ("join",)
    with pytest.raises(ValueError, match="at least one step"):
        ms.group()  # a group or a chain of nothing is still refused


async def test_an_empty_chord_runs_its_body_at_once(scheduler: ms.Scheduler):
    parts: list[ms.TaskSpec] = []  # a fan-out over a list that turned out empty
    flow = ms.chain(spec("start"), ms.chord(parts, spec("join")))
    results = await scheduler.publish_many(flow)
    assert [r.task.key for r in results] == ["start", "join"]
    join = results[1].task
    assert join.depends_on == ["start"], "the join waits for what came before, nothing more"
    assert await run_all(scheduler) == ["start", "join"]
    [alone] = await scheduler.publish_many(ms.chord([], spec("alone")))
    assert alone.task.state is S.PENDING and alone.task.depends_on == []


async def test_chord_of_fifty_runs_the_join_last(scheduler: ms.Scheduler):
    parts = [spec(f"part:{n}") for n in range(50)]
    results = await scheduler.publish_many(ms.chord(parts, spec("join")))
    assert len(results) == 51 and all(r.created for r in results)
    order = await run_all(scheduler)
    assert order[-1] == "join" and len(order) == 51


async def test_publish_many_is_idempotent(scheduler: ms.Scheduler):
    flow = ms.chain(spec("a"), spec("b"))
    await scheduler.publish_many(flow)
    again = await scheduler.publish_many(flow)
    assert [r.created for r in again] == [False, False]
    assert len(await snapshot(scheduler)) == 2


@pytest.mark.parametrize(
    ("specs", "error", "message"),
    [
        ([spec("a"), spec("b", payload={1, 2})], PayloadError, "cannot be stored"),
        ([spec("a"), spec("", payload=None)], ConfigurationError, "key: must be"),
        ([spec("a", depends_on=("b",)), spec("b", depends_on=("a",))], DependencyError, "cycle"),
        ([spec("a"), spec("a", payload=2)], DependencyError, "given twice"),
        ([spec("a"), spec("b", depends_on=("ghost",))], DependencyError, "ghost"),
    ],
)
async def test_one_bad_spec_writes_nothing(
    scheduler: ms.Scheduler, specs: list[ms.TaskSpec], error: type[Exception], message: str
):
    await scheduler.publish("existing", None, name="job")
    before = await snapshot(scheduler)
    with pytest.raises(error, match=message):
        await scheduler.publish_many(specs)
    assert await snapshot(scheduler) == before


async def test_replace_a_waiting_task(scheduler: ms.Scheduler):
    """lakeFS's next-export: replaced while it waits, its dependents keep waiting for it."""
    await scheduler.publish("done-export", None, name="job")
    await scheduler.publish("next-export", {"commit": 1}, name="job", depends_on=["done-export"])
    await scheduler.publish("after", None, name="job", depends_on=["next-export"])
    result = await scheduler.replace(
        "next-export", {"commit": 2}, name="job", depends_on=["done-export"]
    )
    assert result.replaced and result.task.payload == {"commit": 2}
    assert result.task.state is S.BLOCKED
    await finish(scheduler, "done-export")
    await finish(scheduler, "next-export")
    assert await state_of(scheduler, "after") is S.PENDING


async def test_replace_refuses_a_running_task_and_creates_a_missing_one(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    assert await scheduler.store.tasks.claim("w", key="k") is not None
    with pytest.raises(TaskRunning):
        await scheduler.replace("k", 2, name="job")
    assert (await scheduler.replace("new", 1, name="job")).created


async def test_commit_finishes_publishes_and_deletes_together(scheduler: ms.Scheduler):
    await scheduler.publish("mine", None, name="job")
    await scheduler.publish("consumed", None, name="job")
    config = (await scheduler.publish("config", {"v": 1}, name="config")).task
    lease = await scheduler.store.tasks.claim("w", key="mine")
    assert lease is not None
    published = await scheduler.commit(
        complete=[(lease, {"rows": 3})],
        publish=[spec("follow-up")],
        delete=["consumed"],
        require={"config": config.version},
    )
    assert [r.task.key for r in published] == ["follow-up"]
    mine = await scheduler.get("mine")
    assert mine is not None and mine.state is S.SUCCESS and mine.result == {"rows": 3}
    assert await scheduler.get("consumed") is None
    assert await state_of(scheduler, "follow-up") is S.PENDING


async def test_commit_refuses_to_delete_a_running_task_and_writes_nothing(
    scheduler: ms.Scheduler, clock: ms.testing.ManualClock, discover: Any
):
    """A task a handler runs is neither deleted nor replaced by a commit (as `replace` and
    ``update_payload`` refuse it): the whole commit is refused, and the handler finishes."""
    gate = anyio.Event()

    async def slow(task: ms.Task) -> str:
        await gate.wait()
        return "done"

    await scheduler.publish("mine", None, name="job")
    lease = await scheduler.store.tasks.claim("w", key="mine")
    assert lease is not None
    options = ms.WorkerOptions(worker_id="w1", poll_interval_ms=10)
    async with scheduler.consumer({"busy": slow}, options=options):
        try:
            await scheduler.publish("busy", None, name="busy")
            await discover()
            assert await state_of(scheduler, "busy") is S.RUNNING
            before = await snapshot(scheduler)
            replacement = ms.TaskSpec(key="busy", name="busy")
            for publish in ([spec("next")], [replacement]):  # deleted; deleted, published again
                with pytest.raises(TaskRunning, match="busy"):
                    await scheduler.commit(complete=[lease], publish=publish, delete=["busy"])
                assert await snapshot(scheduler) == before
            for _ in range(3):  # past its pings
                clock.advance(1)
                await discover()
        finally:
            gate.set()
        await discover()
    busy = await scheduler.get("busy")
    assert busy is not None and busy.state is S.SUCCESS and busy.result == "done"
    mine = await scheduler.get("mine")
    assert mine is not None and mine.state is S.RUNNING, "the refused commit completed it"


async def test_commit_deletes_a_task_it_completes_itself(scheduler: ms.Scheduler):
    """Running only by the leases the commit completes, a task is no longer running when the
    commit deletes it."""
    await scheduler.publish("mine", None, name="job")
    lease = await scheduler.store.tasks.claim("w", key="mine")
    assert lease is not None
    await scheduler.commit(complete=[lease], delete=["mine"], publish=[spec("next")])
    assert await scheduler.get("mine") is None
    assert await state_of(scheduler, "next") is S.PENDING


async def test_commit_with_a_stale_requirement_writes_nothing(scheduler: ms.Scheduler):
    await scheduler.publish("mine", None, name="job")
    config = (await scheduler.publish("config", {"v": 1}, name="config")).task
    await scheduler.publish("config", {"v": 2}, name="config", update_payload=True)
    lease = await scheduler.store.tasks.claim("w", key="mine")
    assert lease is not None
    before = await snapshot(scheduler)
    with pytest.raises(PreconditionFailed, match="config") as info:
        await scheduler.commit(
            complete=[lease], publish=[spec("x")], require={"config": config.version}
        )
    assert info.value.keys == ["config"]
    assert await snapshot(scheduler) == before


async def test_commit_with_a_lost_lease_writes_nothing(scheduler: ms.Scheduler, clock):
    opts = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=5_000)
    await scheduler.publish("a", None, name="job", options=opts)
    await scheduler.publish("b", None, name="job")
    lease_b = await scheduler.store.tasks.claim("w", key="b")
    lease_a = await scheduler.store.tasks.claim("w", key="a")
    assert lease_a is not None and lease_b is not None
    clock.advance(5)  # a's lease expires; b's (60 s) does not
    before = await snapshot(scheduler)
    with pytest.raises(LeaseLost, match="'a'"):
        await scheduler.commit(complete=[lease_b, lease_a], publish=[spec("x")])
    assert await snapshot(scheduler) == before


async def test_replacing_in_a_commit_continues_the_version(scheduler: ms.Scheduler):
    """ABA: a barrier deleted and published again must not match a require made against the
    old one, even though both were 'freshly published'."""
    old = (await scheduler.publish("barrier", {"done": []}, name="barrier")).task
    for n in range(2):
        await scheduler.publish(f"r{n}", None, name="job")
    first = await scheduler.store.tasks.claim("w1", key="r0")
    second = await scheduler.store.tasks.claim("w2", key="r1")
    assert first is not None and second is not None
    replaced = await scheduler.commit(
        complete=[first],
        delete=["barrier"],
        publish=[ms.TaskSpec(key="barrier", name="barrier", payload={"done": ["r0"]})],
        require={"barrier": old.version},
    )
    assert replaced[0].replaced and replaced[0].task.version == old.version + 1
    with pytest.raises(PreconditionFailed):
        await scheduler.commit(
            complete=[second],
            delete=["barrier"],
            publish=[ms.TaskSpec(key="barrier", name="barrier", payload={"done": ["r1"]})],
            require={"barrier": old.version},  # read before the first commit: stale
        )
    barrier = await scheduler.get("barrier")
    assert barrier is not None and barrier.payload == {"done": ["r0"]}


async def test_concurrent_commits_on_one_barrier_one_wins_the_other_is_told(
    scheduler: ms.Scheduler,
):
    """Racing commits against one version: one wins, each loser gets PreconditionFailed and
    writes nothing. A write conflict at transaction commit is run again, whether or not the
    engine labels it transient (mongoeco does not; MongoDB does)."""
    await scheduler.publish("barrier", {"done": []}, name="barrier")
    keys = [f"part:{n}" for n in range(6)]
    leases = []
    for key in keys:
        await scheduler.publish(key, None, name="part")
        lease = await scheduler.store.tasks.claim(f"w-{key}", key=key)
        assert lease is not None
        leases.append(lease)
    barrier = await scheduler.get("barrier")
    assert barrier is not None
    outcomes: dict[str, str] = {}

    async def commit(lease: Lease) -> None:
        try:
            await scheduler.commit(
                complete=[(lease, "out")],
                delete=["barrier"],
                publish=[spec("barrier", payload={"done": [lease.key]})],
                require={"barrier": barrier.version},
            )
            outcomes[lease.key] = "committed"
        except PreconditionFailed:
            outcomes[lease.key] = "stale"

    async with anyio.create_task_group() as tg:
        for lease in leases:
            tg.start_soon(commit, lease)
    assert sorted(outcomes.values()).count("committed") == 1, outcomes
    winner = next(key for key, outcome in outcomes.items() if outcome == "committed")
    after = await scheduler.get("barrier")
    assert after is not None and after.payload == {"done": [winner]}
    for key in keys:
        assert await state_of(scheduler, key) is (S.SUCCESS if key == winner else S.RUNNING)


def test_only_conflicts_the_driver_does_not_retry_are_retried_again():
    from pymongo.errors import OperationFailure

    from mscheduler.store.transactions import _unlabelled_write_conflict

    labelled = OperationFailure(
        "WriteConflict", 112, {"errorLabels": ["TransientTransactionError"]}
    )
    assert not _unlabelled_write_conflict(labelled)  # with_transaction already retried it
    assert _unlabelled_write_conflict(OperationFailure("Write conflict during transaction commit"))
    assert _unlabelled_write_conflict(OperationFailure("WriteConflict", 112))
    assert not _unlabelled_write_conflict(OperationFailure("duplicate key", 11000))


async def test_publish_many_without_dependencies_costs_two_calls_whatever_its_size(
    scheduler: ms.Scheduler,
):
    """One read (keys that exist, names that clash) and one bulk write of upserts, for 3 tasks
    or 300; keys that existed are returned as they are, not written."""
    await scheduler.publish("k1", {"old": True}, name="job")
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    for size in (3, 300):
        counting.reset()
        results = await sched.publish_many(
            ms.TaskSpec(key=f"k{n}", name="job", payload={"n": n}) for n in range(size)
        )
        assert counting.calls == 2, counting.counts
        assert counting.counts["bulk_write"] == 1
        assert [r.task.key for r in results] == [f"k{n}" for n in range(size)]
        assert results[1].created is False and results[1].task.payload == {"old": True}
    stored = {
        task.key: task for task in await scheduler.store.get_many([r.task.key for r in results])
    }
    assert len(stored) == 300 and stored["k7"].payload == {"n": 7}
    assert stored["k7"].state is ms.TaskState.PENDING
    assert results[7].task.id == stored["k7"].id


async def test_publish_many_returns_each_new_task_as_it_is_stored(scheduler: ms.Scheduler, clock):
    """Tasks of a batch share the options they have in common, never those they do not: runs
    of equal options, a different one between them, and a start or an expiry of their own."""
    later = clock.now() + dt.timedelta(minutes=5, microseconds=1234)
    default, specific = ms.TaskOptions(), ms.TaskOptions(priority=7, specific_worker_ids=["w1"])
    options = [default, default, specific, default, ms.TaskOptions(not_before=later), specific]
    options += [ms.TaskOptions(expires_at=later), ms.TaskOptions(expires_at=later), default]
    results = await scheduler.publish_many(
        spec(f"k{n}", payload={"n": n}, options=one) for n, one in enumerate(options)
    )
    stored = {
        task.key: task for task in await scheduler.store.get_many([f"k{n}" for n in range(9)])
    }
    assert [r.task for r in results] == [stored[f"k{n}"] for n in range(9)]
    assert results[4].task.options.not_before == stored["k4"].not_before
    assert results[2].task.options.specific_worker_ids == ["w1"]
    assert results[3].task.options.priority == ms.TaskOptions().priority


async def test_publish_many_counts_a_key_published_meanwhile_as_existing(scheduler: ms.Scheduler):
    """A concurrent publish between the batch's read and its write: the upsert matches it."""
    racer = _PublishesFirst(scheduler.collection, "k2")
    sched = ms.Scheduler(racer, clock=scheduler.store.clock)
    results = await sched.publish_many(ms.TaskSpec(key=f"k{n}", name="job") for n in range(4))
    assert [r.created for r in results] == [True, True, False, True]
    assert results[2].task.payload == "first"
    assert len(await scheduler.store.get_many([f"k{n}" for n in range(4)])) == 4


class _PublishesFirst(CountingCollection):
    def __init__(self, collection: Any, key: str) -> None:
        super().__init__(collection)
        self.key = key

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        other = ms.Scheduler(self.wrapped)
        await other.publish(self.key, "first", name="job")
        return await self.wrapped.bulk_write(requests, **kwargs)


def _flow(shape: str, size: int, prefix: str = "") -> ms.Step:
    """A chain of ``size`` tasks, or a chord: ``size - 1`` tasks in parallel, then one."""
    steps = [spec(f"{prefix}t{n}", payload={"n": n}) for n in range(size)]
    if shape == "chain":
        return ms.chain(*steps)
    return ms.chain(ms.group(*steps[:-1]), steps[-1])


@pytest.mark.parametrize("shape", ["chain", "chord"])
async def test_publish_many_of_a_flow_costs_the_same_calls_for_5_tasks_or_5000(
    scheduler: ms.Scheduler, shape: str
):
    """A flow with dependencies costs no round trips per task (a few per task would keep a
    transaction open past MongoDB's 60 s for a flow of thousands): the count of database
    calls is the same for 5 tasks and 5,000, and the 5,000 are written and wired up."""
    await scheduler.publish("t1", {"old": True}, name="job")  # one key of the flow exists
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    calls = {}
    for size in (5, 5000):
        await scheduler.collection.delete_many({"key": {"$ne": "t1"}})
        counting.reset()
        results = await sched.publish_many(_flow(shape, size))
        calls[size] = counting.calls
        assert [r.created for r in results[:3]] == [True, False, True]
    assert calls[5] == calls[5000], calls
    assert len(results) == 5000 and results[1].task.payload == {"old": True}
    last = results[-1].task
    assert last.state is ms.TaskState.BLOCKED
    assert last.deps_pending == (["t4998"] if shape == "chain" else [f"t{n}" for n in range(4999)])
    counted = await scheduler.get("t2")  # its one dependent was created: counted in once
    assert counted is not None and counted.dependent_count == 1
    assert await state_of(scheduler, "t0") is S.PENDING


async def test_a_flow_published_at_once_writes_what_publishing_it_task_by_task_writes(
    scheduler: ms.Scheduler,
):
    """The batched path against the one-task-at-a-time path it replaced (`publish` in
    dependency order): the same documents, dependencies that exist (succeeded, failed,
    pending) and one that is missing included."""
    await scheduler.publish("done", name="job")
    await finish(scheduler, "done")
    await scheduler.publish("broke", name="job")
    assert await scheduler.cancel("broke")
    await scheduler.publish("waits", name="job")

    def flow(prefix: str) -> ms.Step:
        def s(key: str, *deps: str, **fields: Any) -> ms.TaskSpec:
            return spec(f"{prefix}{key}", depends_on=deps, payload={"k": key}, **fields)

        runs = ms.TaskOptions(on_dependency_failure="run")
        return ms.chain(
            ms.group(s("a", "done", "waits"), s("b", "broke"), s("c", "broke", options=runs)),
            ms.group(s("d", "nowhere"), s("e")),
            s("f"),
        )

    batch = await scheduler.publish_many(flow("new:"), allow_missing=True)
    for one in ms.chain(flow("old:")).specs:
        await scheduler.publish(
            one.key,
            one.payload,
            name=one.name,
            options=one.options,
            depends_on=one.depends_on,
            allow_missing=True,
        )

    async def documents(prefix: str) -> dict[str, dict[str, Any]]:
        keys = [f"{prefix}{key}" for key in "abcdef"]
        cursor = scheduler.collection.find({"key": {"$in": keys}})
        found = {}
        async for document in cursor:
            text = repr({k: v for k, v in document.items() if k not in ("_id", "trace_context")})
            found[document["key"]] = text.replace(prefix, "")
        return found

    old, new = await documents("old:"), await documents("new:")
    assert len(new) == 6 and new == {k.replace("old:", "new:"): v for k, v in old.items()}
    states = {r.task.key: r.task.state for r in batch}
    assert (states["new:a"], states["new:b"], states["new:c"]) == (
        S.BLOCKED,
        S.CANCELLED,
        S.PENDING,
    )
    # b's failure reaches the later steps at once, as it did task by task
    assert [states[f"new:{key}"] for key in "def"] == [S.CANCELLED] * 3
    assert batch[3].task.depends_on == ["new:a", "new:b", "new:c"]
    counts = {
        task.key: task.dependent_count
        for task in await scheduler.store.get_many(["done", "broke", "waits"])
    }
    assert counts == {"done": 2, "broke": 4, "waits": 2}  # each path counted itself in


async def test_a_flow_catches_up_with_a_dependency_that_ended_while_it_was_written(
    scheduler: ms.Scheduler,
):
    """The dependency succeeds after the flow read it (running) and before the flow counted
    itself in on it, so its finisher saw no dependent to tell: the flow tells its task itself,
    which would otherwise stay blocked for ever."""
    await scheduler.publish("ext", name="job")
    lease = await scheduler.store.tasks.claim("w", key="ext")
    assert lease is not None
    racer = _FinishesFirst(scheduler, lease)
    sched = ms.Scheduler(racer, clock=scheduler.store.clock)
    results = await sched.publish_many(ms.chain(spec("first", depends_on=["ext"]), spec("then")))
    assert racer.finished
    assert [r.created for r in results] == [True, True]
    assert await state_of(scheduler, "first") is S.PENDING
    assert results[0].task.state is S.PENDING and results[0].task.deps_pending == []
    assert await state_of(scheduler, "then") is S.BLOCKED


class _FinishesFirst:
    """Ends a running task just before the first bulk write (the flow's upserts). It keeps
    the collection as ``inner``, not ``wrapped``: taken for a collection without transactions
    (`transactions.supports_transactions`), as a standalone server is, where the race is
    possible; inside a transaction it is a write conflict, and the transaction runs again."""

    def __init__(self, scheduler: ms.Scheduler, lease: Lease) -> None:
        self.inner = scheduler.collection
        self.scheduler, self.lease, self.finished = scheduler, lease, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def bulk_write(self, requests: Any, **kwargs: Any) -> Any:
        if not self.finished:
            self.finished = True
            await self.scheduler.store.tasks.succeed(self.lease, None)
        return await self.inner.bulk_write(requests, **kwargs)


async def test_a_flow_larger_than_one_read_is_read_in_parts(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch
):
    """The keys of a large flow are read a bounded number at a time (a single filter of every
    key could pass MongoDB's 16 MiB command limit), and none is lost between the parts."""
    from mscheduler.store import base

    monkeypatch.setattr(base, "KEYS_PER_READ", 2)
    await scheduler.publish("k3", {"old": True}, name="job")
    results = await scheduler.publish_many(ms.chain(*(spec(f"k{n}") for n in range(7))))
    assert [r.created for r in results] == [True, True, True, False, True, True, True]
    assert results[4].task.deps_pending == ["k3"] and results[6].task.state is S.BLOCKED
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    counting.reset()
    assert len(await sched.store.get_many([f"k{n}" for n in range(7)])) == 7
    assert counting.counts["find"] == 4  # 2 + 2 + 2 + 1


async def test_a_batch_with_a_key_of_another_name_writes_nothing(scheduler: ms.Scheduler):
    await scheduler.publish("taken", None, name="other")
    specs = [ms.TaskSpec(key=f"new:{n}", name="job") for n in range(3)]
    with pytest.raises(ConfigurationError, match="'taken' names a task of name 'other'"):
        await scheduler.publish_many([*specs, ms.TaskSpec(key="taken", name="job")])
    assert await scheduler.store.get_many([spec.key for spec in specs]) == []


async def test_a_commit_with_a_key_of_another_name_records_nothing(
    scheduler: ms.Scheduler,
):
    await scheduler.publish("taken", None, name="other")
    await scheduler.publish("mine", None, name="job")
    lease = await scheduler.store.tasks.claim("w0", key="mine")
    assert lease is not None
    with pytest.raises(ConfigurationError, match="nothing written"):
        await scheduler.commit(
            complete=[(lease, "done")],
            delete=["gone"],
            publish=[ms.TaskSpec(key="next", name="job"), ms.TaskSpec(key="taken", name="job")],
        )
    mine = await scheduler.get("mine")
    assert mine is not None and mine.state is S.RUNNING, "the completion was recorded"
    assert await scheduler.get("next") is None


async def test_a_batch_binds_its_session_for_its_own_task_only(scheduler: ms.Scheduler):
    """Inside a batch the store writes through the session's view of the collection, in the
    batch's task alone: a consumer's task running meanwhile writes outside the transaction
    (its finishes batched as usual), and no part of the store is built again for the batch."""
    store = scheduler.store
    parts = (store.tasks, store.publisher, store.flows, store.signal, store.control_version)
    view = SessionCollection(scheduler.collection, session=None)
    seen: list[tuple[bool, bool, bool]] = []
    asked, answered = anyio.Event(), anyio.Event()

    async def meanwhile() -> None:
        await asked.wait()
        seen.append(
            (store.collection is scheduler.collection, store.in_batch, store.in_transaction)
        )
        answered.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(meanwhile)
        with store.bound(view):
            assert store.collection is view and store.in_batch and store.in_transaction
            asked.set()
            await answered.wait()
        assert store.collection is scheduler.collection and not store.in_batch
    assert seen == [(True, False, False)]
    assert (store.tasks, store.publisher, store.flows, store.signal, store.control_version) == parts
