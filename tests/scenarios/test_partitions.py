"""Partitions (``TaskOptions(partition=...)``): among claimable tasks of one name and
priority, claims take partitions in turn, so one tenant's burst does not make another's few
tasks wait behind it; priority still comes first, and tasks without a partition keep their
FIFO order and pay nothing for the feature. On every engine, with a manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.errors import ConfigurationError
from mscheduler.handlers import Consumer
from mscheduler.store import limits as store_limits
from mscheduler.store.partitions import Partitions
from tests.engines import worker

pytestmark = pytest.mark.anyio
Discover = Callable[[], Awaitable[None]]


def part(partition: str | None, **fields: Any) -> ms.TaskOptions:
    return ms.TaskOptions(partition=partition, **fields)


class Starts:
    """A handler that records the keys it started, in order."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def __call__(self, task: ms.Task) -> None:
        self.keys.append(task.key)


async def drain(scheduler: ms.Scheduler, discover: Discover, *names: str) -> list[str]:
    """The keys of ``names`` in the order one worker running one task at a time starts them."""
    starts = Starts()
    options = worker(burst=True, max_running=1)
    consumer = scheduler.consumer(dict.fromkeys(names, starts), options=options)
    assert await run_burst(consumer, discover, 100), "the burst worker ran out of work"
    return starts.keys


async def run_burst(consumer: Consumer, discover: Discover, rounds: int) -> bool:
    """Run a burst consumer until it stops by itself (True), or ``rounds`` discoveries
    pass (False: it is stopped then)."""
    async with anyio.create_task_group() as task_group:
        await task_group.start(consumer.run)
        for _ in range(rounds):
            await discover()
            if consumer.stop_requested:
                break
        stopped = consumer.stop_requested
        consumer.stop()
    return stopped


async def test_a_partitions_few_tasks_are_not_kept_behind_anothers_burst(
    scheduler: ms.Scheduler, discover: Discover
):
    """BullMQ Pro's groups test: 200 tasks of A published first, then 3 of B; one worker
    running one task at a time starts all of B's among its first 8 starts."""
    await scheduler.publish_many(
        ms.TaskSpec(key=f"a{n}", name="job", options=part("A")) for n in range(200)
    )
    for n in range(3):
        await scheduler.publish(f"b{n}", None, name="job", options=part("B"))
    started = await drain(scheduler, discover, "job")
    assert len(started) == 203
    assert {"b0", "b1", "b2"} <= set(started[:8]), started[:8]
    assert [key for key in started if key.startswith("b")] == ["b0", "b1", "b2"]
    assert [key for key in started if key.startswith("a")] == [f"a{n}" for n in range(200)]


async def test_partitions_published_in_bursts_take_turns(
    scheduler: ms.Scheduler, clock: Any, discover: Discover
):
    """Three partitions publish bursts of different sizes at different times: while each has
    tasks waiting, the starts go round the three."""
    await scheduler.publish_many(
        ms.TaskSpec(key=f"x{n}", name="job", options=part("x")) for n in range(30)
    )
    clock.advance(1)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"y{n}", name="job", options=part("y")) for n in range(10)
    )
    clock.advance(1)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"z{n}", name="job", options=part("z")) for n in range(5)
    )
    started = await drain(scheduler, discover, "job")
    assert len(started) == 45
    # The first 15 starts are 5 of each partition, in turn.
    assert sorted(key[0] for key in started[:15]) == ["x"] * 5 + ["y"] * 5 + ["z"] * 5
    for window in range(0, 15, 3):
        assert sorted(key[0] for key in started[window : window + 3]) == ["x", "y", "z"]
    # Then y and x in turn, then x alone; within a partition, in publish order.
    assert sorted(key[0] for key in started[15:25]) == ["x"] * 5 + ["y"] * 5
    assert [key[0] for key in started[25:]] == ["x"] * 20
    for name, count in (("x", 30), ("y", 10), ("z", 5)):
        assert [key for key in started if key[0] == name] == [f"{name}{n}" for n in range(count)]


async def test_a_partition_publishing_later_starts_at_the_head_of_the_backlog(
    scheduler: ms.Scheduler, clock: Any, discover: Discover
):
    """A partition that publishes long after another's backlog was published takes its turns
    from the head of that backlog, not behind all of it."""
    await scheduler.publish_many(
        ms.TaskSpec(key=f"a{n}", name="job", options=part("A")) for n in range(50)
    )
    clock.advance(3_600)
    await scheduler.publish("late", None, name="job", options=part("B"))
    started = await drain(scheduler, discover, "job")
    assert "late" in started[:2], started[:2]


async def test_priority_comes_before_turns(scheduler: ms.Scheduler, discover: Discover):
    await scheduler.publish_many(
        ms.TaskSpec(key=f"a{n}", name="job", options=part("A")) for n in range(10)
    )
    await scheduler.publish_many(
        ms.TaskSpec(key=f"b{n}", name="job", options=part("B", priority=5)) for n in range(3)
    )
    await scheduler.publish("urgent", None, name="job", options=ms.TaskOptions(priority=9))
    started = await drain(scheduler, discover, "job")
    assert started[:4] == ["urgent", "b0", "b1", "b2"]
    assert started[4:] == [f"a{n}" for n in range(10)]


async def test_tasks_without_a_partition_keep_fifo_among_the_turns(
    scheduler: ms.Scheduler, clock: Any, discover: Discover
):
    """Tasks without a partition take their place by their publish time, in publish order; a
    partition's tasks take turns from the head of the claim order, one millisecond apart, so
    they go among them as a tenant not served yet."""
    for n in range(3):
        await scheduler.publish(f"plain{n}", None, name="job")
        clock.advance(1)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"a{n}", name="job", options=part("A")) for n in range(3)
    )
    clock.advance(1)
    await scheduler.publish("plain3", None, name="job")
    started = await drain(scheduler, discover, "job")
    assert [key for key in started if key.startswith("plain")] == [f"plain{n}" for n in range(4)]
    assert started == ["plain0", "a0", "a1", "a2", "plain1", "plain2", "plain3"]


async def test_a_partitioned_task_shows_its_partition_and_publish_time(
    scheduler: ms.Scheduler, clock: Any
):
    await scheduler.publish_many(
        ms.TaskSpec(key=f"a{n}", name="job", options=part("A")) for n in range(5)
    )
    published = clock.now()
    clock.advance(10)
    await scheduler.publish("b", None, name="job", options=part("tenant-7"))
    task = await scheduler.get("a4")
    assert task is not None
    assert task.options.partition == "A"
    assert task.created_at == published  # its publish time, not its turn
    assert task.turn is not None and task.turn > published
    later = await scheduler.get("b")
    assert later is not None and later.created_at == published + dt.timedelta(seconds=10)
    assert later.turn is not None and later.turn <= later.created_at


async def test_a_task_without_a_partition_pays_nothing(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch
):
    """No new field on its document; its publish, single or in a batch, costs the round trips
    it did (`test_publish_many_and_commit`); a partitioned one pays its own."""
    counting = CountingCollection(scheduler.collection)
    sched = ms.Scheduler(counting, clock=scheduler.store.clock)
    await sched.ensure_indexes()
    # The partitions' collection, beside the tasks, counts in the same tally.
    beside = CountingCollection(sched.store.partitions.collection)
    beside.counts = counting.counts
    monkeypatch.setattr(Partitions, "collection", property(lambda _: beside))
    await sched.publish("warm", None, name="job", options=part("W"))  # its TTL index, once
    counting.reset()
    await sched.publish("plain", None, name="job")
    single = counting.calls
    assert counting.counts == {"find_one_and_update": 1}, counting.counts  # its upsert alone
    counting.reset()
    await sched.publish_many(ms.TaskSpec(key=f"p{n}", name="job") for n in range(50))
    assert counting.calls == 2, counting.counts  # one read of the keys, one bulk write
    document = await scheduler.collection.find_one({"key": "plain"})
    assert document is not None
    assert "published_at" not in document and "partition" not in document["options"]

    counting.reset()
    await sched.publish("part", None, name="job", options=part("A"))
    assert counting.calls == single + 2, counting.counts  # the head's read, the turns' update
    counting.reset()
    await sched.publish_many(
        ms.TaskSpec(key=f"q{n}", name="job", options=part("AB"[n % 2])) for n in range(50)
    )
    # One read of the head, then one update per partition: not one per task.
    assert counting.calls == 2 + 1 + 2, counting.counts


async def test_bad_partitions_are_refused_naming_the_field(scheduler: ms.Scheduler):
    for bad in ("", "   ", "x" * 513, "a\x00b", 7):
        with pytest.raises(ValidationError, match="partition"):
            ms.TaskOptions(partition=bad)
    ms.TaskOptions(partition="x" * 512)
    assert await scheduler.store.get_many(["any"]) == []


# ---------------------------------------------------------------- partition_max_running


class Gated:
    """A handler that runs until its task's gate is set, counting what runs per partition."""

    def __init__(self) -> None:
        self.gates: dict[str, anyio.Event] = {}
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}

    async def __call__(self, task: ms.Task) -> None:
        partition = task.options.partition or ""
        self.running[partition] = self.running.get(partition, 0) + 1
        self.most[partition] = max(self.most.get(partition, 0), self.running[partition])
        try:
            await self.gates.setdefault(task.key, anyio.Event()).wait()
        finally:
            self.running[partition] -= 1

    def release(self) -> None:
        """Every handler running now returns."""
        for gate in self.gates.values():
            gate.set()


async def test_partition_max_running_holds_across_processes(
    open_scheduler: Any, clock: Any, discover: Discover
):
    """Two schedulers on one collection (two processes), each with room for 4: at most one
    task of each partition runs at once, while both partitions and tasks without a
    partition run side by side."""
    first, second = await open_scheduler(), await open_scheduler()
    await first.set_limit("job", partition_max_running=1)
    await first.publish_many(
        ms.TaskSpec(key=f"{p}{n}", name="job", options=part(p)) for p in "AB" for n in range(3)
    )
    await first.publish("plain", None, name="job")
    handler = Gated()
    async with (
        first.consumer({"job": handler}, options=worker("w1", max_running=4)),
        second.consumer({"job": handler}, options=worker("w2", max_running=4)),
    ):
        await discover()
        assert handler.running == {"A": 1, "B": 1, "": 1}
        for _ in range(6):
            handler.release()
            await discover()
            clock.advance(1)  # a consumer held back asks again each second
            await discover()
            assert all(handler.running.get(p, 0) <= 1 for p in "AB"), handler.running
    assert handler.most == {"A": 1, "B": 1, "": 1}
    for key in [f"{p}{n}" for p in "AB" for n in range(3)]:
        task = await first.get(key)
        assert task is not None and task.state is ms.TaskState.SUCCESS, key


async def test_partition_max_running_holds_for_the_pull_api(scheduler: ms.Scheduler, clock: Any):
    await scheduler.set_limit("job", partition_max_running=2)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"{p}{n}", name="job", options=part(p)) for p in "AB" for n in range(4)
    )
    leases = await scheduler.own(["job"], worker_id="w1", max_tasks=8)
    assert sorted(lease.key for lease in leases) == ["A0", "A1", "B0", "B1"]
    assert await scheduler.own(["job"], worker_id="w2", max_tasks=8) == []
    limit = (await scheduler.limits())["job"]
    assert store_limits.partitions_running(limit, clock.now()) == {"A": 2, "B": 2}
    await scheduler.succeed(leases[0])  # frees its partition's slot at once
    [again] = await scheduler.own(["job"], worker_id="w2", max_tasks=8)
    assert again.task.options.partition == leases[0].task.options.partition


async def test_a_removed_partition_limit_no_longer_holds(scheduler: ms.Scheduler):
    await scheduler.set_limit("job", partition_max_running=1)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"A{n}", name="job", options=part("A")) for n in range(3)
    )
    assert len(await scheduler.own(["job"], worker_id="w1", max_tasks=3)) == 1
    assert await scheduler.remove_limit("job")
    assert "job" not in await scheduler.limits()
    assert len(await scheduler.own(["job"], worker_id="w1", max_tasks=3)) == 2


async def test_a_partition_limit_set_counts_what_runs_already(scheduler: ms.Scheduler):
    await scheduler.publish_many(
        ms.TaskSpec(key=f"A{n}", name="job", options=part("A")) for n in range(3)
    )
    [running] = await scheduler.own(["job"], worker_id="w1", max_tasks=1)
    await scheduler.set_limit("job", partition_max_running=1)
    assert await scheduler.own(["job"], worker_id="w2", max_tasks=3) == []
    await scheduler.succeed(running)
    assert len(await scheduler.own(["job"], worker_id="w2", max_tasks=3)) == 1


@pytest.mark.parametrize("bad", [0, -1, True, "2", 1_000_001])
async def test_a_bad_partition_max_running_is_refused_naming_it(scheduler: ms.Scheduler, bad: Any):
    with pytest.raises(ConfigurationError, match="partition_max_running"):
        await scheduler.set_limit("job", partition_max_running=bad)
    assert await scheduler.limits() == {}


async def test_a_claim_that_loses_its_partitions_last_slot_gives_its_task_back(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch
):
    """A claim that read its partition as not full, while another took its last slot
    meanwhile (here: every claim reads no partition as full), wins the task but cannot count
    it: the task is given back, unrun and not failed, and the limit holds."""
    await scheduler.set_limit("job", partition_max_running=1)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"A{n}", name="job", options=part("A")) for n in range(2)
    )
    [first] = await scheduler.own(["job"], worker_id="w1", max_tasks=2)
    monkeypatch.setattr(store_limits, "full_partitions", lambda limit, now: [])
    assert await scheduler.own(["job"], worker_id="w2", max_tasks=2) == []
    other = await scheduler.get("A1" if first.key == "A0" else "A0")
    assert other is not None and other.state is ms.TaskState.PENDING
    assert other.unexpected_failures == 0
    await scheduler.succeed(first)
    [second] = await scheduler.own(["job"], worker_id="w2", max_tasks=2)
    assert second.key == other.key


async def test_show_the_task_page_and_the_limits_view_show_partitions(
    scheduler: ms.Scheduler, clock: Any
):
    from mscheduler.cli.show import render
    from mscheduler.dashboard import create_app
    from tests.scenarios.test_dashboard import client

    await scheduler.publish("t", None, name="job", options=part("tenant-7"))
    task = await scheduler.get("t")
    assert task is not None
    shown = render(task, clock.now())
    assert "partition:   tenant-7 (turn " in shown
    await scheduler.set_limit("job", partition_max_running=3)
    async with client(create_app(scheduler)) as http:
        page = (await http.get("/tasks/t")).text
        overview = (await http.get("/")).text
    assert 'id="partition"' in page and "tenant-7" in page
    assert "0/3 per partition" in overview


async def test_a_partition_limited_claim_writes_what_a_max_running_claim_writes(
    open_scheduler: Any, discover: Discover, monkeypatch: pytest.MonkeyPatch
):
    """A consumer's task of a name under ``partition_max_running`` costs the writes one under
    ``max_running`` costs (the token, the claim, the slot bound to the lease; then the
    finish and the slot freed): counting its slot in its partition is the write that binds
    the slot to its lease, which a ``max_running`` claim makes anyway."""
    from mscheduler.store.limits import Limits

    writes = ("update_one", "find_one_and_update", "bulk_write")

    async def one_task(**limit: Any) -> int:
        scheduler = await open_scheduler(collection=f"c{len(limit)}{next(iter(limit))}")
        await scheduler.set_limit("job", **limit)
        await scheduler.publish("t", None, name="job", options=part("A"))
        tasks = CountingCollection(scheduler.collection)
        beside = CountingCollection(scheduler.store.limits.collection)
        beside.counts = tasks.counts
        monkeypatch.setattr(Limits, "collection", property(lambda _: beside))
        counted = ms.Scheduler(tasks, clock=scheduler.store.clock)
        consumer = counted.consumer({"job": Starts()}, options=worker(burst=True, max_running=1))
        await run_burst(consumer, discover, 20)
        task = await scheduler.get("t")
        assert task is not None and task.state is ms.TaskState.SUCCESS
        return sum(tasks.counts[name] for name in writes)

    assert await one_task(partition_max_running=1) == await one_task(max_running=1)


async def test_a_commit_and_a_replacing_batch_publish_partitioned_tasks(
    scheduler: ms.Scheduler,
):
    """Their turns are taken before the transaction, as `publish_many`'s are."""
    await scheduler.publish("first", None, name="job")
    [lease] = await scheduler.own(["job"], worker_id="w1")
    follow = ms.TaskSpec(key="next", name="job", options=part("A"))
    await scheduler.commit(complete=[lease], publish=[follow])
    task = await scheduler.get("next")
    assert task is not None and task.options.partition == "A" and task.turn is not None
    await scheduler.cancel("next")
    rerun = ms.TaskSpec(key="next", name="job", options=part("B"), replace_finished=True)
    [result] = await scheduler.publish_many([rerun])
    assert result.replaced and result.task.options.partition == "B"
    assert result.task.turn is not None


async def test_partition_max_running_holds_for_isolated_handlers(
    scheduler: ms.Scheduler, discover: Discover, tmp_path: Any
):
    """An isolated handler's claim goes through the same claim core: with room for three,
    one task of A and one of B run (each in its child process), the second of A waits."""
    from mscheduler.handlers import isolated
    from tests import isolated_handlers as h
    from tests.scenarios.test_isolated import until

    await scheduler.set_limit("stuck", partition_max_running=1)
    for key, partition in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        path = str(tmp_path / f"{key}.pid")
        await scheduler.publish(key, path, name="stuck", options=part(partition))
    options = worker(max_running=3, shutdown_grace_ms=0)
    async with scheduler.consumer({"stuck": isolated(h.stuck)}, options=options):
        await until(lambda: (tmp_path / "a1.pid").exists() and (tmp_path / "b1.pid").exists())
        await discover()
        states = {key: (await scheduler.get(key)) for key in ("a1", "a2", "b1")}
        assert {key: task.state for key, task in states.items() if task is not None} == {
            "a1": ms.TaskState.RUNNING,
            "a2": ms.TaskState.PENDING,
            "b1": ms.TaskState.RUNNING,
        }
