"""The live workers: each consumer lists itself beside the tasks, refreshed with its heartbeat,
removed at stop; what it runs is read from the tasks; one that died shows as dead, since the
first promise it broke (a heartbeat, or the pings of its leases). `stats` counts the live ones
per name."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.handlers import Consumer
from mscheduler.models import WorkerInfo
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, until_idle

pytestmark = pytest.mark.anyio


def options(worker_id: str, heartbeat_ms: int = 1_000, **more: int | None) -> ms.WorkerOptions:
    return ms.WorkerOptions(
        worker_id=worker_id, poll_interval_ms=POLL_MS, heartbeat_ms=heartbeat_ms, **more
    )


async def test_a_consumer_is_listed_while_it_runs_and_removed_at_stop(
    scheduler: ms.Scheduler, clock: ManualClock
):
    gate = anyio.Event()

    async def slow(task: ms.Task) -> None:
        await gate.wait()

    consumer = scheduler.consumer(
        {"render": slow, "email": slow}, options=options("w1", max_running=4)
    )
    started = clock.now()
    async with consumer:
        [info] = await scheduler.workers()
        assert info.worker_id == "w1" and info.alive
        assert info.names == ["email", "render"] and info.max_running == 4
        assert info.host == socket.gethostname() and info.pid == os.getpid()
        assert info.running == 0 and info.started_at == started
        await scheduler.publish("r1", None, name="render")
        await scheduler.publish("r2", None, name="render")
        clock.advance(POLL_MS / 1000)
        await until_idle()
        assert sorted(consumer.running) == ["r1", "r2"]
        clock.advance(1.0)  # a heartbeat: the entry says what runs now
        await until_idle()
        [info] = await scheduler.workers()
        assert info.running == 2 and sorted(info.running_keys) == ["r1", "r2"]
        assert info.last_seen_at == clock.now() and info.alive
        assert [w.worker_id for w in await scheduler.workers(names=["email"])] == ["w1"]
        assert await scheduler.workers(names=["sms"]) == []
        gate.set()
    assert await scheduler.workers() == []


def registered(
    worker_id: str,
    now: dt.datetime,
    heartbeat_ms: int,
    *,
    names: tuple[str, ...] = ("job",),
    running: int = 0,
) -> WorkerInfo:
    """An entry as a worker writes it, for a worker that then dies (kill -9)."""
    return WorkerInfo(
        worker_id=worker_id,
        host="h",
        pid=1,
        names=list(names),
        max_running=16,
        running=running,
        started_at=now,
        last_seen_at=now,
        heartbeat_ms=heartbeat_ms,
    )


async def test_an_idle_worker_that_died_is_dead_after_two_missed_heartbeats(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """A kill -9 leaves the entry: alive until two heartbeats were missed, then dead since."""
    now = clock.now()
    await scheduler.store.workers.beat(registered("gone", now, heartbeat_ms=10_000))
    clock.advance(19.9)
    assert [w.alive for w in await scheduler.workers()] == [True]
    clock.advance(0.1)
    [info] = await scheduler.workers()
    assert not info.alive and info.dead_since == now + dt.timedelta(seconds=20)


async def test_the_running_count_follows_claims_and_finishes_between_heartbeats(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """What a worker runs is read from the tasks: right after its claims and its finishes,
    not as of its last heartbeat (30 s by default)."""
    gates = {key: anyio.Event() for key in ("a", "b", "c")}

    async def held(task: ms.Task) -> None:
        await gates[task.key].wait()

    busy = ms.WorkerOptions(worker_id="w1", poll_interval_ms=POLL_MS, max_running=16)
    async with scheduler.consumer({"job": held}, options=busy):
        for key in gates:
            await scheduler.publish(key, None, name="job")
        await discover()
        [info] = await scheduler.workers()
        assert (info.running, info.running_keys, info.alive) == (3, ["a", "b", "c"], True)
        gates["a"].set()
        gates["c"].set()
        await discover()
        [info] = await scheduler.workers()
        assert (info.running, info.running_keys) == (1, ["b"])
        gates["b"].set()
        await discover()
        [info] = await scheduler.workers()
        assert (info.running, info.running_keys) == (0, [])


async def test_a_worker_that_died_holding_tasks_is_dead_when_its_leases_expire(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """A worker killed while it runs tasks stops pinging them: it is dead once their leases
    expired (here 10 s), long before two missed heartbeats (60 s), and stays so when another
    worker takes its tasks over."""
    start = clock.now()
    await scheduler.store.workers.beat(registered("gone", start, heartbeat_ms=30_000))
    lease = ms.TaskOptions(ping_interval_ms=5_000, worker_timeout_ms=10_000)
    for key in ("x1", "x2"):
        await scheduler.publish(key, None, name="job", options=lease)
        assert await scheduler.store.tasks.claim("gone", key=key) is not None
    clock.advance(9.9)
    [info] = await scheduler.workers()
    assert (info.alive, info.running, info.running_keys) == (True, 2, ["x1", "x2"])
    clock.advance(0.1)
    [info] = await scheduler.workers()
    assert not info.alive and info.running == 0
    assert info.dead_since == start + dt.timedelta(seconds=10)
    clock.advance(1)
    assert await scheduler.store.tasks.claim("w2", key="x1") is not None  # a takeover
    [info] = await scheduler.workers(names=["job"])
    assert not info.alive and info.dead_since == start + dt.timedelta(seconds=10)
    rows = {(r.name, r.state.value): r for r in await scheduler.stats()}
    assert rows["job", "running"].live_workers == 0


async def test_a_death_once_found_keeps_its_time_and_reason(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Found dead when its leases expired, a worker stays dead since then and for that
    reason after the tasks it held ended, and after its heartbeats would have said so too;
    until it beats again."""
    start = clock.now()
    await scheduler.store.workers.beat(registered("gone", start, heartbeat_ms=30_000))
    lease = ms.TaskOptions(ping_interval_ms=5_000, worker_timeout_ms=10_000)
    await scheduler.publish("x", None, name="job", options=lease)
    assert await scheduler.store.tasks.claim("gone", key="x") is not None
    clock.advance(10)
    [found] = await scheduler.workers()
    assert not found.alive and found.dead_because == "its leases expired"
    assert await scheduler.store.tasks.claim("w2", key="x") is not None  # a takeover
    await scheduler.cancel("x")  # the task it held ended: no lease of it is read any more
    clock.advance(120)  # its heartbeats lapsed too, at start + 60 s
    for info in [*await scheduler.workers(), await scheduler.store.workers.get("gone")]:
        assert info is not None and not info.alive
        assert (info.dead_since, info.dead_because) == (found.dead_since, found.dead_because)
    [counted] = await scheduler.store.workers.registered()
    assert not counted.alive and counted.dead_since == found.dead_since
    await scheduler.store.workers.beat(registered("gone", clock.now(), heartbeat_ms=30_000))
    [back] = await scheduler.workers()
    assert back.alive and back.dead_since is None and back.dead_because == ""


async def test_a_worker_restarted_under_its_id_is_alive_though_its_previous_life_lost_a_lease(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Killed holding a task and restarted at once under the same id (a fixed worker id):
    the lease its previous life held expires after the restart, which says nothing of the
    worker now running; it is alive, and can be stopped."""
    lease = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=5_000)
    await scheduler.publish("x", None, name="job", options=lease)
    assert await scheduler.store.tasks.claim("w1", key="x") is not None  # the previous life
    clock.advance(1)
    restarted = registered("w1", clock.now(), heartbeat_ms=30_000)
    await scheduler.store.workers.beat(restarted.model_copy(update={"instance": "second"}))
    clock.advance(5)  # the previous life's lease has expired, unpinged
    [info] = await scheduler.workers()
    assert info.alive and info.dead_since is None and info.running == 0
    assert await scheduler.store.tasks.claim("w2", key="x") is not None  # a takeover
    [info] = await scheduler.workers(names=["job"])
    assert info.alive
    await scheduler.stop_worker("w1")  # a live worker: the request is written


async def test_a_worker_that_beat_after_losing_a_lease_is_alive(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """A lease lost to a stall is not a death when the worker beat since."""
    start = clock.now()
    lease = ms.TaskOptions(ping_interval_ms=5_000, worker_timeout_ms=10_000)
    await scheduler.publish("x", None, name="job", options=lease)
    assert await scheduler.store.tasks.claim("slow", key="x") is not None
    clock.advance(12)
    await scheduler.store.workers.beat(registered("slow", clock.now(), heartbeat_ms=30_000))
    [info] = await scheduler.workers()
    assert info.alive and info.dead_since is None and info.started_at > start


async def test_stats_count_live_workers_and_list_paused_names_without_tasks(
    scheduler: ms.Scheduler, clock: ManualClock
):
    async def noop(task: ms.Task) -> None: ...

    await scheduler.publish("e1", None, name="email")
    await scheduler.publish("o1", None, name="orphan")
    await scheduler.pause("email", reason="provider outage")
    await scheduler.pause("sms")
    async with (
        scheduler.consumer({"email": noop}, options=options("w1")),
        scheduler.consumer({"email": noop}, options=options("w2")),
    ):
        rows = {(r.name, r.state.value): r for r in await scheduler.stats()}
    assert rows["email", "pending"].live_workers == 2
    assert rows["email", "pending"].pause_reason == "provider outage"
    assert rows["orphan", "pending"].live_workers == 0
    sms = rows["sms", "pending"]  # paused, no task: still listed, so the pause is seen
    assert sms.count == 0 and sms.paused and sms.pause_reason == ""
    after = {(r.name, r.state.value): r for r in await scheduler.stats()}
    assert after["email", "pending"].live_workers == 0  # both stopped


# ------------------------------------------------------------------ the spread claim policy


def _run_burst(
    scheduler: ms.Scheduler, clock: ManualClock, discover, workers: int, **policy: int | None
) -> tuple[dict[str, list[str]], anyio.Event, list[Consumer]]:
    gate = anyio.Event()
    ran: dict[str, list[str]] = {}

    def handler_of(worker_id: str):  # type: ignore[no-untyped-def]
        async def long_task(task: ms.Task) -> None:
            ran.setdefault(worker_id, []).append(task.key)
            await gate.wait()

        return long_task

    consumers = [
        scheduler.consumer(
            {"render": handler_of(f"w{n}")}, options=options(f"w{n}", max_running=16, **policy)
        )
        for n in range(workers)
    ]
    return ran, gate, consumers


async def test_spread_shares_a_burst_of_long_tasks_among_live_workers(
    scheduler: ms.Scheduler, clock: ManualClock, discover, engine: str
):
    ran, gate, consumers = _run_burst(scheduler, clock, discover, 3, claim_spread_ms=500)
    async with contextlib.AsyncExitStack() as stack:
        for consumer in consumers:
            await stack.enter_async_context(consumer)
        clock.advance(1.0)  # a heartbeat: each now counts three live workers
        await until_idle()
        for n in range(6):
            await scheduler.publish(f"burst:{n}", None, name="render")
        await discover()
        for _ in range(6):  # past the spread waits: anything left is claimed
            clock.advance(0.5)
            await discover()
        # Each claims its share of what it sees due; the last ones go to whoever's wait
        # ends first. No worker idles while another holds all six, as greedy ones would.
        shares = sorted(len(keys) for keys in ran.values())
        assert len(shares) == 3 and max(shares) <= 3 and sum(shares) == 6, shares
        gate.set()
    assert sum(map(len, ran.values())) == 6


async def test_spread_still_claims_what_no_peer_takes(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Two peers listed alive that never claim (hung, or about to be found stale): the one
    working consumer takes its share, then, after two waits, everything left."""
    now = clock.now()
    for peer in ("hung-1", "hung-2"):
        hung = registered(peer, now, heartbeat_ms=3_600_000, names=("render",))
        await scheduler.store.workers.beat(hung)
    ran, gate, consumers = _run_burst(scheduler, clock, discover, 1, claim_spread_ms=500)
    async with consumers[0]:
        clock.advance(1.0)  # a heartbeat: it counts three live workers
        await until_idle()
        for n in range(6):
            await scheduler.publish(f"burst:{n}", None, name="render")
        await discover()
        assert len(ran["w0"]) <= 2  # its share of six among three
        for _ in range(6):
            clock.advance(0.5)
            await discover()
        assert len(ran["w0"]) == 6  # no peer took them: claimed a share per wait
        gate.set()


async def _a_burst_of_six_is_shared(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, ran: dict[str, list[str]]
) -> None:
    """Six long tasks published at once: within one spread, all six are held, each of the
    three workers holding some and none more than three."""
    for n in range(6):
        await scheduler.publish(f"burst:{n}", None, name="render")
    await discover()
    clock.advance(1.0)  # one spread: anything left is claimed
    await discover()
    shares = sorted(len(keys) for keys in ran.values())
    assert len(shares) == 3 and max(shares) <= 3 and sum(shares) == 6, shares


async def test_spread_by_default_shares_a_burst_of_long_tasks(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """No option set: six long tasks published at once go to three workers, not one."""
    ran, gate, consumers = _run_burst(scheduler, clock, discover, 3)
    async with contextlib.AsyncExitStack() as stack:
        for consumer in consumers:
            await stack.enter_async_context(consumer)
        clock.advance(1.0)  # a heartbeat: each now counts two open peers
        await until_idle()
        await _a_burst_of_six_is_shared(scheduler, clock, discover, ran)
        gate.set()


async def test_spread_counts_again_peers_that_started_since_its_heartbeat(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """The first worker started alone, and two more after it, all with long heartbeats: a
    burst a spread later is shared among the three, not taken whole by the first, which
    counts its peers again before it shares the burst out."""
    ran, gate, consumers = _run_burst(scheduler, clock, discover, 3, heartbeat_ms=60_000)
    async with contextlib.AsyncExitStack() as stack:
        for consumer in consumers:  # each counts the peers started before it
            await stack.enter_async_context(consumer)
        clock.advance(1.0)  # a spread, long before the next heartbeat
        await until_idle()
        await _a_burst_of_six_is_shared(scheduler, clock, discover, ran)
        gate.set()


@contextlib.asynccontextmanager
async def _each_running_a_long_task(
    scheduler: ms.Scheduler, record: Callable[[str, str], None], gate: anyio.Event
) -> AsyncIterator[None]:
    """Three workers of 16 slots (w0, w1, w2), each given a long task pinned to it; every
    task they run is recorded (worker, key) and holds until ``gate``."""

    def handler_of(worker_id: str) -> Callable[[ms.Task], Awaitable[None]]:
        async def held(task: ms.Task) -> None:
            record(worker_id, task.key)
            await gate.wait()

        return held

    workers = [f"w{n}" for n in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        for worker_id in workers:
            consumer = scheduler.consumer(
                {"job": handler_of(worker_id)}, options=options(worker_id, max_running=16)
            )
            await stack.enter_async_context(consumer)
        for worker_id in workers:
            pin = ms.TaskOptions(specific_worker_ids=[worker_id])
            await scheduler.publish(f"long:{worker_id}", None, name="job", options=pin)
        yield


async def test_spread_shares_a_burst_of_long_tasks_among_busy_workers(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Three workers each running one task, as their heartbeats say: six long tasks published
    at once are shared among them, none waiting for an idle peer."""
    gate = anyio.Event()
    ran: dict[str, list[str]] = {}

    def record(worker_id: str, key: str) -> None:
        ran.setdefault(worker_id, []).append(key)

    async with _each_running_a_long_task(scheduler, record, gate):
        await discover()
        clock.advance(1.0)  # a heartbeat: each counts two busy peers
        await discover()
        for n in range(6):
            await scheduler.publish(f"burst:{n}", None, name="job")
        await discover()
        clock.advance(1.0)  # one spread: anything left is claimed
        await discover()
        shares = sorted(len(keys) - 1 for keys in ran.values())
        assert len(shares) == 3 and max(shares) <= 3 and sum(shares) == 6, shares
        gate.set()


async def test_spread_claims_at_once_beside_peers_whose_heartbeat_says_they_are_busy(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Busy itself, beside open peers that each ran a task at their last heartbeat: no idle
    peer to leave a task to, so it claims its share of a burst at once (here its peers
    never claim theirs: it claims the rest after the spreads it waits for them)."""
    now = clock.now()
    for peer in ("busy-1", "busy-2"):
        await scheduler.store.workers.beat(registered(peer, now, heartbeat_ms=3_600_000, running=1))
    ran: list[str] = []
    gate = anyio.Event()

    async def job(task: ms.Task) -> None:
        ran.append(task.key)
        if task.key == "long":
            await gate.wait()

    async with scheduler.consumer({"job": job}, options=options("w0", max_running=16)):
        await scheduler.publish("long", None, name="job")
        await discover()
        await _publish_short(scheduler)
        await discover()
        # Its share, as far as it saw the burst when it looked (at most a third of it).
        assert 2 < len(ran) <= math.ceil((1 + _SHORT) / 3), len(ran)
        for _ in range(2):  # two spreads
            clock.advance(1.0)
            await discover()
        assert len(ran) == 1 + _SHORT
        gate.set()


async def test_a_task_due_beside_one_left_to_wait_is_claimed_when_a_slot_frees(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Spreading, with one free slot: the due task the policy lets wait goes back in the
    heap, and a task pinned to this worker, due beside it, stays there to be claimed when a
    slot frees (not dropped from the heap until the backstop's read, a minute later)."""
    now = clock.now()
    await scheduler.store.workers.beat(registered("hung", now, heartbeat_ms=3_600_000))
    gates = {f"long:{n}": anyio.Event() for n in range(3)}
    ran: dict[str, float] = {}

    async def job(task: ms.Task) -> None:
        ran[task.key] = (clock.now() - now).total_seconds()
        if task.key in gates:
            await gates[task.key].wait()

    pin = ms.TaskOptions(specific_worker_ids=["w0"])
    spread = options("w0", max_running=4, claim_spread_ms=1_000)
    async with scheduler.consumer({"job": job}, options=spread):
        for key in gates:
            await scheduler.publish(key, None, name="job", options=pin)
        await discover()
        await scheduler.publish("a1", None, name="job", delay=dt.timedelta(seconds=5))
        await scheduler.publish("z", None, name="job", options=pin, delay=dt.timedelta(seconds=5))
        await discover()
        for _ in range(8):
            clock.advance(1.0)
            await discover()
        gates["long:0"].set()  # a slot frees
        await discover()
        for _ in range(5):
            clock.advance(1.0)
            await discover()
        claimed = dict(ran)
        for gate in gates.values():
            gate.set()
    assert "z" in claimed and claimed["z"] <= 10, claimed


async def test_spread_claims_at_once_while_more_is_due_than_its_slots(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """A drain: with tasks due and every slot taken, no peer is idle to leave a task to, so
    each slot that frees is filled at once, to the last task, with no spread wait."""
    now = clock.now()
    for peer in ("busy-1", "busy-2"):  # listed alive, all slots taken elsewhere
        await scheduler.store.workers.beat(registered(peer, now, heartbeat_ms=3_600_000))
    gates = {f"t:{n}": anyio.Event() for n in range(12)}
    ran: list[str] = []

    async def held(task: ms.Task) -> None:
        ran.append(task.key)
        await gates[task.key].wait()

    await scheduler.publish_many(ms.TaskSpec(key=key, name="job") for key in gates)
    spread = options("w0", max_running=4, claim_spread_ms=1_000)
    async with scheduler.consumer({"job": held}, options=spread):
        await discover()  # it counted three live workers as it started, then fetched
        assert len(ran) == 4  # its share of twelve among three is its four slots
        while len(ran) < len(gates):
            before = len(ran)
            gates[ran[before - 4]].set()  # the oldest finishes: its slot is filled at once
            await discover()
            assert len(ran) == before + 1, f"a slot left empty with {len(gates) - before} due"
        for gate in gates.values():
            gate.set()
        await discover()
    assert sorted(ran) == sorted(gates)


async def test_greedy_when_spread_is_off_takes_what_its_slots_allow(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    ran, gate, consumers = _run_burst(scheduler, clock, discover, 1, claim_spread_ms=None)
    async with consumers[0]:
        for n in range(6):
            await scheduler.publish(f"burst:{n}", None, name="render")
        await discover()
        assert len(ran["w0"]) == 6  # no wait, whatever the peers
        gate.set()


# The spread policy, on by default, costs the drain of short tasks nothing beside peers that
# cannot take them: each test publishes 40 short tasks to one spreading worker and lets less
# than one spread pass (or exactly one, where no worker can know better before it).

_SHORT = 40


async def _drain_short(
    scheduler: ms.Scheduler, discover, names: tuple[str, ...] = ("job",), **more: int | None
) -> tuple[list[str], Consumer]:
    ran: list[str] = []

    async def short(task: ms.Task) -> None:
        ran.append(task.key)

    consumer = scheduler.consumer(
        dict.fromkeys(names, short), options=options("w0", max_running=16, **more)
    )
    return ran, consumer


async def _publish_short(scheduler: ms.Scheduler) -> None:
    await scheduler.publish_many(ms.TaskSpec(key=f"s:{n}", name="job") for n in range(_SHORT))


async def test_spread_claims_at_once_what_no_live_peer_of_its_name_serves(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Live peers that serve only another of its names are no peers of ``job``."""
    now = clock.now()
    for peer in ("other-1", "other-2"):
        await scheduler.store.workers.beat(
            registered(peer, now, heartbeat_ms=3_600_000, names=("other",))
        )
    ran, consumer = await _drain_short(scheduler, discover, names=("job", "other"))
    async with consumer:
        await _publish_short(scheduler)
        await discover()
        assert len(ran) == _SHORT


async def test_spread_claims_at_once_what_only_full_peers_could_take(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Peers whose every slot was taken at their last heartbeat cannot take a task now."""
    now = clock.now()
    for peer in ("full-1", "full-2"):
        await scheduler.store.workers.beat(
            registered(peer, now, heartbeat_ms=3_600_000, running=16)
        )
    ran, consumer = await _drain_short(scheduler, discover)
    async with consumer:
        await _publish_short(scheduler)
        await discover()
        assert len(ran) == _SHORT


async def test_spread_counts_again_before_letting_a_task_wait_for_peers_that_left(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Peers that stopped since its last heartbeat (their entries removed): the worker reads
    the live workers again before it lets a task wait for them, so it claims at once."""
    now = clock.now()
    for peer in ("gone-1", "gone-2"):
        await scheduler.store.workers.beat(registered(peer, now, heartbeat_ms=3_600_000))
    ran, consumer = await _drain_short(scheduler, discover, heartbeat_ms=60_000)
    async with consumer:  # its first heartbeat counts three
        for peer in ("gone-1", "gone-2"):
            await scheduler.store.workers.remove(peer)
        clock.advance(1.0)  # a spread later, long before its next heartbeat
        await until_idle()
        await _publish_short(scheduler)
        await discover()
        assert len(ran) == _SHORT


async def test_spread_stops_waiting_for_peers_that_died_unseen(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Peers killed since their last heartbeat still read alive: what they did not take is
    claimed, all of it, within two spreads; they are not waited for again until they beat,
    so the next burst is claimed at once."""
    now = clock.now()
    for peer in ("killed-1", "killed-2"):
        await scheduler.store.workers.beat(registered(peer, now, heartbeat_ms=3_600_000))
    ran, consumer = await _drain_short(scheduler, discover)
    async with consumer:
        await _publish_short(scheduler)
        await discover()
        assert len(ran) < _SHORT  # its share; the rest waits for its peers
        for _ in range(2):  # two spreads
            clock.advance(1.0)
            await discover()
        assert len(ran) == _SHORT
        await scheduler.publish_many(
            ms.TaskSpec(key=f"next:{n}", name="job") for n in range(_SHORT)
        )
        await discover()
        assert len(ran) == 2 * _SHORT


async def test_spread_waits_once_for_an_idle_peer_killed_unseen_whatever_the_name(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Busy beside an idle peer killed since its last heartbeat (it reads alive for two
    heartbeats): the first task published alone waits one spread for it and is claimed
    then; from then on that peer counts for none of its names until it beats again, so
    the next tasks published alone, of either name, are claimed at once."""
    now = clock.now()
    killed = registered("killed", now, heartbeat_ms=3_600_000, names=("job", "other"))
    await scheduler.store.workers.beat(killed)
    gate = anyio.Event()
    ran: list[str] = []

    async def held(task: ms.Task) -> None:
        ran.append(task.key)
        await gate.wait()

    spreading = options("w0", heartbeat_ms=3_600_000, max_running=16)
    async with scheduler.consumer({"job": held, "other": held}, options=spreading):
        try:
            await scheduler.publish("long", None, name="job")
            await discover()
            assert ran == ["long"]  # idle: its share at once
            await scheduler.publish("first", None, name="job")
            await discover()
            assert ran == ["long"]  # busy beside an idle peer: left to it for a spread
            clock.advance(1.0)
            await discover()
            assert ran == ["long", "first"]
            for key, name in (("second", "other"), ("third", "job")):
                await scheduler.publish(key, None, name=name)
                await discover()
                assert ran[-1] == key, f"{key} waited for the killed peer again"
        finally:
            gate.set()


async def test_spread_claims_a_task_within_one_spread_when_every_worker_is_busy(
    scheduler: ms.Scheduler, clock: ManualClock, discover
):
    """Three workers each running one task: a new task waits one spread for an idle peer,
    and none being idle, one of them claims it then."""
    gate = anyio.Event()
    ran: dict[str, str] = {}

    def record(worker_id: str, key: str) -> None:
        ran[key] = worker_id

    async with _each_running_a_long_task(scheduler, record, gate):
        await discover()
        assert len(ran) == 3
        clock.advance(1.0)  # a heartbeat: each counts its peers, each running one task
        await discover()
        await scheduler.publish("new", None, name="job")
        await discover()
        clock.advance(1.0)  # one spread
        await discover()
        assert "new" in ran
        gate.set()
