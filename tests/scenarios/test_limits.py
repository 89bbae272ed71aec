"""Limits per name (`Scheduler.set_limit`, `mscheduler limit`): never exceeded in any window,
under many consumers at once; a consumer at the limit sleeps until the window frees. Every
engine, the manual clock."""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import threading
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import BackendUnavailable, ConfigurationError
from mscheduler.models import Limit
from mscheduler.store.limits import free_at
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, until_idle
from tests.faults import LosesBesideWrites, LosesClaimAndLookUp

pytestmark = pytest.mark.anyio


def worker(**fields: Any) -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id="w", poll_interval_ms=POLL_MS, **fields)


async def test_five_consumers_never_exceed_the_rate_in_any_window(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    tasks = 1_000 if engine == "memory" else 200  # the wire engine is ~10x slower per call
    await scheduler.set_limit("email", rate=100, per=dt.timedelta(minutes=1))
    ran = 0

    async def email(task: ms.Task) -> None:
        nonlocal ran
        ran += 1

    # A start is counted when its claim's token is taken (a round trip before the claim):
    # read them from the limit's document after each step, before they age out of it.
    tokens: dict[str, dt.datetime] = {}
    await scheduler.publish_many(ms.TaskSpec(key=f"m{n}", name="email") for n in range(tasks))
    options = worker(max_running=8)
    async with scheduler.consumers({"email": email}, count=5, options=options) as group:
        with anyio.fail_after(300):
            while ran < tasks:
                clock.advance(1)
                await until_idle()
                limit = (await scheduler.limits())["email"]
                for entry in limit.starts:
                    assert entry.until is not None
                    tokens[entry.id] = entry.until - dt.timedelta(minutes=1)
    starts = list(tokens.values())
    starts.sort()
    window = dt.timedelta(minutes=1)
    busiest = max(
        sum(1 for later in starts[i:] if later < start + window) for i, start in enumerate(starts)
    )
    assert busiest == 100, busiest  # the limit, reached and never passed
    minutes = (starts[-1] - starts[0]).total_seconds() / 60
    assert minutes >= tasks / 100 - 1  # it took as long as the rate demands
    # Each consumer, at the limit, slept until the window freed instead of asking again:
    # a few refusals per window, not one per loop.
    refusals = sum(consumer.stats.limited for consumer in group)
    assert refusals <= 5 * 4 * (tasks / 100 + 1), refusals


async def test_max_running_holds_across_consumers(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    await scheduler.set_limit("render", max_running=2)
    running, most = 0, 0
    gates = [anyio.Event() for _ in range(6)]

    async def render(task: ms.Task) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await gates[int(task.payload)].wait()
        finally:
            running -= 1

    for n in range(6):
        await scheduler.publish(f"r{n}", n, name="render")
    async with scheduler.consumers({"render": render}, count=3, options=worker(max_running=4)):
        await discover()
        assert running == 2
        for gate in gates:
            gate.set()
            await discover()
            clock.advance(1)  # the other consumers ask again each second
            await discover()
            assert running <= 2
    assert most == 2
    finished = [await scheduler.get(f"r{n}") for n in range(6)]
    assert all(t is not None and t.state is ms.TaskState.SUCCESS for t in finished)
    limit = (await scheduler.limits())["render"]
    assert [slot for slot in limit.slots if slot.until and slot.until > clock.now()] == []


async def test_a_crashed_holders_slot_frees_with_its_lease(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.set_limit("render", max_running=1)
    until = clock.now() + dt.timedelta(seconds=5)
    token = await scheduler.store.limits.acquire("render", until)  # a worker that then died
    assert isinstance(token, str)
    # Full: ask again in a second (a slot may free at any moment), and so on until then.
    assert await scheduler.store.limits.acquire("render", until) == clock.now() + dt.timedelta(
        seconds=1
    )
    clock.advance(4.9)
    assert not isinstance(await scheduler.store.limits.acquire("render", until), str)
    clock.advance(0.101)
    assert isinstance(await scheduler.store.limits.acquire("render", until), str)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rate": 0, "per": dt.timedelta(minutes=1)}, "rate: expected an integer from 1"),
        ({"rate": 10}, "per: give rate and per together"),
        ({"rate": 10, "per": dt.timedelta(0)}, "per: expected a timedelta from 1 ms"),
        ({"max_running": True}, "max_running: expected an integer"),
        ({}, "give rate and per, max_running, partition_max_running, or several"),
    ],
)
async def test_a_bad_limit_names_the_field_and_writes_nothing(
    scheduler: ms.Scheduler, fields: dict[str, Any], message: str
):
    with pytest.raises(ConfigurationError, match=message):
        await scheduler.set_limit("email", **fields)
    assert await scheduler.limits() == {}


class _Concurrency:
    """Handlers of one name that block until their gate opens; counts how many run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.started: list[str] = []
        self.gates: dict[str, anyio.Event] = collections.defaultdict(anyio.Event)

    async def handler(self, task: ms.Task) -> None:
        self.started.append(task.key)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.gates[task.key].wait()
        finally:
            self.running -= 1


async def _live_slots(sched: ms.Scheduler, name: str, now: dt.datetime) -> int:
    limit = (await sched.limits()).get(name)
    return 0 if limit is None else len([s for s in limit.slots if s.until and s.until > now])


async def test_a_token_request_that_fails_loses_no_lease_won_before_it(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """The second token request of a claim fails on the network: the lease won by the first
    runs, and its slot lives exactly as long as its run (the limit stays usable: 2 at once)."""
    await scheduler.set_limit("render", max_running=2)
    for n in range(4):
        await scheduler.publish(f"r{n}", n, name="render")
    runs = _Concurrency()
    sched = ms.Scheduler(scheduler.collection, clock=clock)
    acquire, calls = sched.store.limits.acquire, 0

    async def second_fails(name: str, until: dt.datetime, **token: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise BackendUnavailable("MongoDB is unreachable: connection reset")
        return await acquire(name, until, **token)

    sched.store.limits.acquire = second_fails  # type: ignore[method-assign]
    async with sched.consumer({"render": runs.handler}, options=worker(max_running=4)):
        await discover()
        assert runs.started == ["r0"]  # the lease won before the failure runs at once
        clock.advance(1)  # the reconnect delay
        await discover()
        assert runs.running == 2
        for key in ("r0", "r1", "r2", "r3"):
            runs.gates[key].set()
            await discover()
            clock.advance(1)
            await discover()
        assert sorted(runs.started) == ["r0", "r1", "r2", "r3"] and runs.most == 2
    assert await _live_slots(scheduler, "render", clock.now()) == 0


@pytest.mark.parametrize("change", ["remove", "raise"])
async def test_removing_or_raising_a_limit_starts_the_waiting_tasks_at_once(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, change: str
):
    await scheduler.set_limit("render", max_running=1)
    for n in range(2):
        await scheduler.publish(f"r{n}", n, name="render")
    runs = _Concurrency()
    async with scheduler.consumer({"render": runs.handler}, options=worker(max_running=4)):
        await discover()
        assert runs.running == 1
        if change == "remove":
            assert await scheduler.remove_limit("render")
        else:
            await scheduler.set_limit("render", max_running=2)
        await discover()  # one change event, or one poll interval
        assert runs.running == 2
        for gate in ("r0", "r1"):
            runs.gates[gate].set()


@pytest.mark.parametrize("seen", [True, False], ids=["removal_seen", "removal_unseen"])
async def test_a_limit_removed_and_set_again_counts_the_tasks_still_running(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, seen: bool
):
    """A task runs under ``max_running=1``; the limit is removed and set again (the
    consumers told of the removal in between, or not): the running task still holds its
    slot, so no second one starts on any worker until it ends."""
    await scheduler.set_limit("render", max_running=1)
    await scheduler.publish("r0", 0, name="render")
    runs = _Concurrency()
    options = [
        ms.WorkerOptions(worker_id=f"w{n}", poll_interval_ms=POLL_MS, max_running=4)
        for n in range(2)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for each in options:
            await stack.enter_async_context(
                scheduler.consumer({"render": runs.handler}, options=each)
            )
        await discover()
        assert runs.started == ["r0"]
        assert await scheduler.remove_limit("render")
        if seen:
            await discover()
        await scheduler.set_limit("render", max_running=1)
        await discover()
        await scheduler.publish("r1", 1, name="render")
        for _ in range(3):
            await discover()
            clock.advance(1)  # a consumer at the limit asks again each second
        await discover()
        assert runs.started == ["r0"], "a second start under max_running=1"
        assert await _live_slots(scheduler, "render", clock.now()) == 1
        runs.gates["r0"].set()
        for _ in range(2):
            await discover()
            clock.advance(1)
        await discover()
        assert runs.started == ["r0", "r1"] and runs.most == 1
        runs.gates["r1"].set()
        await discover()
    assert await _live_slots(scheduler, "render", clock.now()) == 0


async def test_a_dead_holders_slot_outlives_its_limit_removed_and_set_again(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """The slot of a worker that died holding it counts until its lease would have ended,
    whatever happened to the limit meanwhile; a removed limit is listed no more."""
    await scheduler.set_limit("render", max_running=1)
    until = clock.now() + dt.timedelta(seconds=5)
    assert isinstance(await scheduler.store.limits.acquire("render", until), str)
    assert await scheduler.remove_limit("render")
    assert not await scheduler.remove_limit("render")
    assert "render" not in await scheduler.limits()
    await scheduler.set_limit("render", max_running=1)
    assert not isinstance(await scheduler.store.limits.acquire("render", until), str)
    clock.advance(5.001)
    assert isinstance(await scheduler.store.limits.acquire("render", until), str)


@pytest.mark.parametrize("retried", [True, False], ids=["retried", "not_retried"])
async def test_a_limit_removed_while_its_signal_is_lost_frees_the_waiting_tasks(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, retried: bool
):
    """The removal is written and the version bump that tells the consumers of it is lost on
    the network: retried (it finds the limit gone), the call tells them at once; not
    retried, they read their limits again within ``schedule_refresh_ms``, not an hour on."""
    await scheduler.set_limit("render", rate=1, per=dt.timedelta(hours=1))
    for n in range(2):
        await scheduler.publish(f"r{n}", n, name="render")
    runs = _Concurrency()
    operator = ms.Scheduler(LosesBesideWrites(scheduler.collection, ".controls"), clock=clock)
    options = worker(max_running=4, schedule_refresh_ms=5_000)
    async with scheduler.consumer({"render": runs.handler}, options=options):
        await discover()
        assert runs.started == ["r0"]
        with pytest.raises(BackendUnavailable):
            await operator.remove_limit("render")
        if retried:
            assert not await operator.remove_limit("render")  # removed already
        else:
            for _ in range(5):  # the running task's lease kept alive meanwhile
                await discover()
                clock.advance(1)
        await discover()
        assert runs.started == ["r0", "r1"], "the removal was not seen"
        for gate in list(runs.gates.values()):
            gate.set()


async def test_a_consumer_at_max_running_asks_again_each_second_not_in_a_loop(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Another worker holds the only slot; this consumer asks again once a second (a slot
    may free at any moment), and starts the task soon after that slot frees."""
    await scheduler.set_limit("render", max_running=1)
    until = clock.now() + dt.timedelta(minutes=10)
    token = await scheduler.store.limits.acquire("render", until)  # another worker's run
    assert isinstance(token, str)
    await scheduler.publish("r0", 0, name="render")
    runs = _Concurrency()
    sched = ms.Scheduler(scheduler.collection, clock=clock)
    acquire, calls = sched.store.limits.acquire, 0

    async def counted(name: str, until: dt.datetime, **token: Any) -> Any:
        nonlocal calls
        calls += 1
        return await acquire(name, until, **token)

    sched.store.limits.acquire = counted  # type: ignore[method-assign]
    async with sched.consumer({"render": runs.handler}, options=worker(max_running=4)):
        for _ in range(20):
            await discover()
            clock.advance(0.25)
        assert runs.started == [] and calls <= 7, calls  # about once a second
        await scheduler.store.limits.release("render", token)
        clock.advance(1)
        await discover()
        assert runs.started == ["r0"]
        runs.gates["r0"].set()


def test_a_slot_freed_between_the_refusal_and_its_read_is_asked_again_soon():
    """The refused request's read finds room: ask again after the recheck, not at once (a
    loop of requests) and never as "due now" (the consumer would drop the keys)."""
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    limit = Limit.model_validate({"_id": "render", "max_running": 1, "slots": []})
    assert now < free_at(limit, now) <= now + dt.timedelta(seconds=1)


async def test_max_running_holds_whatever_the_ping_interval(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """A slot lives as long as its lease, even when the first ping comes after a minute."""
    await scheduler.set_limit("render", max_running=1)
    slow = ms.TaskOptions(ping_interval_ms=120_000, worker_timeout_ms=300_000)
    for n in range(3):
        await scheduler.publish(f"r{n}", n, name="render", options=slow)
    runs = _Concurrency()
    async with scheduler.consumers({"render": runs.handler}, count=3, options=worker()):
        for _ in range(40):  # 400 s: past the first ping, the first extension, the second
            await discover()
            clock.advance(10)
            await discover()
            assert runs.running == 1
        assert await _live_slots(scheduler, "render", clock.now()) == 1
        for n in range(3):
            runs.gates[f"r{n}"].set()
            for _ in range(3):
                await discover()
                clock.advance(1)
        assert runs.most == 1 and sorted(runs.started) == ["r0", "r1", "r2"]


async def test_a_recovered_claim_holds_its_slot_until_its_run_ends(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """The claim's reply and its look-up are lost (`ClaimUncertain`): the lease recovered
    later runs under the token taken for it, extended while it runs, released at its end."""
    await scheduler.set_limit("render", max_running=1)
    await scheduler.publish("r0", 0, name="render")
    lossy = LosesClaimAndLookUp(scheduler.collection)
    sched = ms.Scheduler(lossy, clock=clock)
    runs = _Concurrency()
    async with sched.consumer({"render": runs.handler}, options=worker()):
        await discover()
        assert lossy.lost == 2 and runs.started == []
        clock.advance(1)  # the reconnect delay: the look-up finds the lease
        await discover()
        assert runs.started == ["r0"]
        for _ in range(12):  # two minutes: past the slot's first life
            clock.advance(10)
            await discover()
            assert await _live_slots(scheduler, "render", clock.now()) == 1
        runs.gates["r0"].set()
        await discover()
        assert await _live_slots(scheduler, "render", clock.now()) == 0


async def test_a_graceful_stop_releases_the_slots_of_the_runs_it_ended(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    await scheduler.set_limit("render", max_running=1)
    await scheduler.publish("r0", 0, name="render")
    runs = _Concurrency()
    consumer = scheduler.consumer({"render": runs.handler}, options=worker())
    async with anyio.create_task_group() as group:
        await group.start(consumer.run)
        await discover()
        assert runs.started == ["r0"]
        consumer.stop()
        await discover()
        runs.gates["r0"].set()  # ends within the grace period
    assert await _live_slots(scheduler, "render", clock.now()) == 0


@pytest.mark.parametrize("limit", ["worker", "name"])
async def test_an_abandoned_sync_handler_keeps_its_slot_until_it_returns(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, limit: str
):
    """A blocking sync handler past ``timeout_ms`` is abandoned: its thread still runs, so
    no other handler takes its slot (``WorkerOptions.max_running`` or the name's limit)."""
    if limit == "name":
        await scheduler.set_limit("block", max_running=1)
    options = ms.TaskOptions(timeout_ms=300, max_unexpected_retries=5)
    for n in range(3):
        await scheduler.publish(f"b{n}", n, name="block", options=options)
    release = threading.Event()
    lock = threading.Lock()
    bodies, most = 0, 0

    def block(task: ms.Task) -> None:
        nonlocal bodies, most
        with lock:
            bodies += 1
            most = max(most, bodies)
        release.wait(timeout=30)
        with lock:
            bodies -= 1

    max_running = 1 if limit == "worker" else 4
    work = worker(max_running=max_running, cancel_timeout_ms=100)
    try:
        async with scheduler.consumer({"block": block}, options=work):
            for _ in range(10):
                await discover()
                clock.advance(0.5)  # past timeout_ms and cancel_timeout_ms: abandoned
            assert most == 1
    finally:
        release.set()


async def test_local_retries_count_against_the_rate(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Every handler start takes a start in the window, a local retry's too."""
    await scheduler.set_limit("flaky", rate=2, per=dt.timedelta(seconds=1))
    await scheduler.publish("f0", 0, name="flaky")
    starts: list[dt.datetime] = []

    async def flaky(task: ms.Task) -> None:
        starts.append(clock.now())
        raise RuntimeError("fails every time")

    work = worker(handler_retries=2, retry_backoff_ms=100)
    async with scheduler.consumer({"flaky": flaky}, options=work):
        for _ in range(30):
            await discover()
            clock.advance(0.1)
    assert len(starts) == 3  # the first start and two local retries
    window = dt.timedelta(seconds=1)
    assert all(later - start >= window for start, later in zip(starts, starts[2:], strict=False))


async def test_a_limit_set_changed_and_removed_while_consumers_run_holds_at_once(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Three consumers: each change holds within one change event (one poll interval without
    change streams), runs that started before the limit included: no start beyond it."""
    runs = _Concurrency()
    options = [
        ms.WorkerOptions(worker_id=f"w{n}", poll_interval_ms=POLL_MS, max_running=4)
        for n in range(3)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for each in options:
            await stack.enter_async_context(
                scheduler.consumer({"render": runs.handler}, options=each)
            )
        for n in range(3):
            await scheduler.publish(f"early{n}", n, name="render")
        await discover()
        assert runs.running == 3  # no limit yet
        await scheduler.set_limit("render", max_running=2)
        await discover()  # one change event, or one poll interval
        for n in range(6):
            await scheduler.publish(f"r{n}", n, name="render")
        await discover()
        assert runs.running == 3, "a start beyond the limit set while three ran"
        for n in range(3):
            runs.gates[f"early{n}"].set()
            await discover()
            clock.advance(1)  # a slot freed elsewhere is asked for again each second
            await discover()
            assert runs.running <= 2
        assert runs.running == 2
        await scheduler.set_limit("render", max_running=3)
        await discover()
        assert runs.running == 3, "a raised limit was not seen at once"
        await scheduler.set_limit("render", max_running=1)
        await discover()
        runs.gates[runs.started[-1]].set()  # one ends: still two running, over the new limit
        await discover()
        clock.advance(1)
        await discover()
        assert runs.running == 2, "a start beyond a lowered limit"
        assert await scheduler.remove_limit("render")
        await discover()
        assert runs.running == 5, "a removed limit did not free its tasks at once"
        for gate in list(runs.gates.values()):
            gate.set()
        await discover()
    assert runs.running == 0


async def test_a_limit_set_while_tasks_wait_holds_for_them(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Tasks already known to a consumer when their name gets a limit: claimed under it,
    none left behind."""
    later = ms.TaskOptions(not_before=clock.now() + dt.timedelta(seconds=10))
    for n in range(3):
        await scheduler.publish(f"r{n}", n, name="render", options=later)
    runs = _Concurrency()
    async with scheduler.consumer({"render": runs.handler}, options=worker(max_running=4)):
        await discover()
        await scheduler.set_limit("render", max_running=1)
        await discover()
        clock.advance(10)
        await discover()
        assert runs.started == ["r0"]
        for n in range(3):
            runs.gates[f"r{n}"].set()
            await discover()
        assert sorted(runs.started) == ["r0", "r1", "r2"] and runs.most == 1


async def test_no_window_holds_more_than_rate_handler_starts_across_three_consumers(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Measured where users measure it, at handler start: claims whose replies come late (a
    busy machine) start their handlers later than their tokens were taken."""
    await scheduler.set_limit("thumb", rate=4, per=dt.timedelta(seconds=1))
    starts: list[dt.datetime] = []

    async def thumb(task: ms.Task) -> None:
        starts.append(clock.now())

    for n in range(24):
        await scheduler.publish(f"t{n}", n, name="thumb")
    slow = ms.Scheduler(scheduler.collection, clock=clock)
    claim, calls = slow.store.tasks.claim, 0

    async def late_reply(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        lease = await claim(*args, **kwargs)
        if calls % 3 == 0:
            clock.advance(0.7)  # this reply took 0.7 s to come back
        return lease

    slow.store.tasks.claim = late_reply  # type: ignore[method-assign]
    consumers = [
        (scheduler if n else slow).consumer(
            {"thumb": thumb},
            options=ms.WorkerOptions(worker_id=f"w{n}", poll_interval_ms=POLL_MS, max_running=4),
        )
        for n in range(3)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for consumer in consumers:
            await stack.enter_async_context(consumer)
        for _ in range(80):
            await discover()
            clock.advance(0.1)
            if len(starts) == 24:
                break
    assert len(starts) == 24
    starts.sort()
    window = dt.timedelta(seconds=1)
    busiest = max(
        sum(1 for s in starts[i:] if s < start + window) for i, start in enumerate(starts)
    )
    assert busiest <= 4, busiest


def _busiest(starts: list[dt.datetime], per: dt.timedelta) -> int:
    """The most handler starts in any window of ``per`` (a window opens at each start)."""
    starts = sorted(starts)
    return max(
        (sum(1 for s in starts[i:] if s < start + per) for i, start in enumerate(starts)),
        default=0,
    )


@pytest.mark.parametrize(
    ("rate", "per_ms", "max_running"),
    [(1, 50, 1), (5, 1000, 3), (1, 200, 2)],
)
async def test_a_consumer_at_its_rate_claims_again_as_its_window_frees(
    scheduler: ms.Scheduler,
    clock: ManualClock,
    discover: Any,
    rate: int,
    per_ms: int,
    max_running: int,
):
    """More tasks due than free slots: the keys not tried while the window was full wait for
    it in the heap (no write would bring them back), so the next window's starts come as it
    frees, not at the backstop a minute later."""
    per = dt.timedelta(milliseconds=per_ms)
    await scheduler.set_limit("nv", rate=rate, per=per)
    starts: list[dt.datetime] = []

    async def nv(task: ms.Task) -> None:
        starts.append(clock.now())

    tasks = 3 * rate + 1
    for n in range(tasks):
        await scheduler.publish(f"n{n}", n, name="nv")
    async with scheduler.consumer({"nv": nv}, options=worker(max_running=max_running)):
        for _ in range(4 * per_ms // 10):  # four windows, in steps of 10 ms
            await discover()
            clock.advance(0.01)
            if len(starts) == tasks:
                break
    assert len(starts) == tasks, starts
    assert _busiest(starts, per) <= rate


async def test_what_a_consumer_knows_of_its_keys_names_is_bounded_by_its_heap(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Keys of a limited name beyond ``heap_size`` are dropped from the heap, and their names
    with them: nothing the consumer keeps per key outlives the heap's bound."""
    await scheduler.set_limit("nv", rate=1, per=dt.timedelta(hours=1))
    started: list[str] = []

    async def nv(task: ms.Task) -> None:
        started.append(task.key)

    consumer = scheduler.consumer({"nv": nv}, options=worker(heap_size=4))
    async with consumer:
        for n in range(40):
            await scheduler.publish(f"n{n}", n, name="nv")
            await discover()
        assert len(started) == 1  # the rest wait for the window
        assert len(consumer._claimer._heap) <= 4
        assert len(consumer._claimer._heap.keys_of(["nv"])) <= 4
        for n in range(40):
            await scheduler.cancel(f"n{n}")
        clock.advance(3600)
        await discover()
        assert consumer._claimer._heap.keys_of(["nv"]) == []


async def test_a_start_counts_at_its_handler_start_however_late_its_claim_reply(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Three consumers, 5 per second: one's claim replies come 30 ms late, so its handlers
    start after their starts were taken. No window of ``per`` holds more than ``rate``
    handler starts, measured at the handlers."""
    per = dt.timedelta(seconds=1)
    await scheduler.set_limit("nv", rate=5, per=per)
    starts: list[dt.datetime] = []

    async def nv(task: ms.Task) -> None:
        starts.append(clock.now())

    slow = ms.Scheduler(scheduler.collection, clock=clock)
    claim = slow.store.tasks.claim

    async def late_reply(*args: Any, **kwargs: Any) -> Any:
        lease = await claim(*args, **kwargs)
        clock.advance(0.03)
        return lease

    slow.store.tasks.claim = late_reply  # type: ignore[method-assign]
    async with contextlib.AsyncExitStack() as stack:
        for n in range(3):
            options = ms.WorkerOptions(worker_id=f"w{n}", poll_interval_ms=POLL_MS, max_running=4)
            consumer = (slow if n == 0 else scheduler).consumer({"nv": nv}, options=options)
            await stack.enter_async_context(consumer)
        for n in range(12):
            await scheduler.publish(f"n{n}", n, name="nv")
        for _ in range(400):
            await discover()
            clock.advance(0.01)
            if len(starts) == 12:
                break
    assert len(starts) == 12
    assert _busiest(starts, per) <= 5, sorted(starts)


async def test_a_task_that_never_completes_does_not_block_the_rate(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """A rate without ``max_running``: a handler still running holds no start beyond its
    window, so the next windows' tasks start as they free."""
    await scheduler.set_limit("nv", rate=1, per=dt.timedelta(seconds=1))
    runs = _Concurrency()
    starts: dict[str, dt.datetime] = {}

    async def nv(task: ms.Task) -> None:
        starts[task.key] = clock.now()
        if task.key != "n0":
            runs.gates[task.key].set()
        await runs.handler(task)

    for n in range(3):
        await scheduler.publish(f"n{n}", n, name="nv")
    async with scheduler.consumer({"nv": nv}, options=worker(max_running=4)):
        for _ in range(40):
            await discover()
            clock.advance(0.1)
        assert sorted(starts) == ["n0", "n1", "n2"] and runs.running == 1  # n0 still runs
        runs.gates["n0"].set()
    assert _busiest(list(starts.values()), dt.timedelta(seconds=1)) == 1


async def test_rate_limited_tasks_still_start_by_priority(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Tasks that wait for the window start in priority order, whenever they were published."""
    await scheduler.set_limit("nv", rate=1, per=dt.timedelta(seconds=1))
    started: list[str] = []

    async def nv(task: ms.Task) -> None:
        started.append(task.key)

    for n in range(3):
        await scheduler.publish(f"low{n}", n, name="nv")
    async with scheduler.consumer({"nv": nv}, options=worker(max_running=4)):
        await discover()
        assert started == ["low0"]
        urgent = ms.TaskOptions(priority=10)
        for n in range(3):
            await scheduler.publish(f"high{n}", n, name="nv", options=urgent)
        for _ in range(60):
            await discover()
            clock.advance(0.1)
    assert started == ["low0", "high0", "high1", "high2", "low1", "low2"]


def test_a_window_full_of_held_starts_is_asked_again_after_per_not_after_the_hold():
    """A start whose handler has not confirmed it yet counts beyond ``per`` (held): a consumer
    it refuses asks again after ``per``, when the start will likely have been confirmed, not
    after the hold (no write would tell it sooner)."""
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    held = {"id": "a", "until": now + dt.timedelta(seconds=11)}
    limit = Limit.model_validate({"_id": "nv", "rate": 1, "per_ms": 1000, "starts": [held]})
    assert free_at(limit, now) == now + dt.timedelta(seconds=1)
    confirmed = {"id": "a", "until": now + dt.timedelta(milliseconds=300)}
    limit = Limit.model_validate({"_id": "nv", "rate": 1, "per_ms": 1000, "starts": [confirmed]})
    assert free_at(limit, now) == now + dt.timedelta(milliseconds=300)


async def test_the_slot_of_a_consumer_that_vanished_frees_with_its_lease(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """A consumer dies while it runs a task under ``max_running=1`` (nothing it would write
    after that lands): once its lease expires (``worker_timeout_ms``), the task is taken over
    and the slot is free for it, without waiting for any longer life of the slot."""
    await scheduler.set_limit("render", max_running=1)
    fast = ms.TaskOptions(worker_timeout_ms=2_000, ping_interval_ms=500)
    for n in range(2):
        await scheduler.publish(f"r{n}", n, name="render", options=fast)
    dying = ms.Scheduler(scheduler.collection, clock=clock)

    async def lost(*args: Any, **kwargs: Any) -> None:
        """The process is gone: its slot's release never lands."""

    dying.store.limits.release = lost  # type: ignore[method-assign]
    runs = _Concurrency()
    async with anyio.create_task_group() as task_group:
        await task_group.start(dying.consumer({"render": runs.handler}, options=worker()).run)
        await discover()
        assert runs.started == ["r0"]
        task_group.cancel_scope.cancel()  # killed: its lease is left to expire
    clock.advance(1.9)
    assert await scheduler.own(["render"], worker_id="w2") == []
    clock.advance(0.2)
    [taken] = await scheduler.own(["render"], worker_id="w2")
    assert taken.key == "r0"


async def test_a_run_that_ends_while_its_slot_is_being_adopted_leaves_no_slot_behind(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """A limit is set while a task runs: its consumer gives the run a slot, and the run ends
    before that write lands. The slot frees with it, and the next task starts."""
    await scheduler.publish("r0", 0, name="render")
    runs = _Concurrency()
    sched = ms.Scheduler(scheduler.collection, clock=clock)
    adopt = sched.store.limits.adopt

    async def run_ends_first(name: str, untils: Any) -> None:
        runs.gates["r0"].set()
        await until_idle()  # the run ends, and its end is handled, before the write
        await adopt(name, untils)

    sched.store.limits.adopt = run_ends_first  # type: ignore[method-assign]
    async with sched.consumer({"render": runs.handler}, options=worker(max_running=4)):
        await discover()
        assert runs.started == ["r0"]
        await scheduler.set_limit("render", max_running=1)
        await discover()
        await scheduler.publish("r1", 1, name="render")
        for _ in range(3):
            await discover()
            clock.advance(1)
        await discover()
        assert runs.started == ["r0", "r1"]
        runs.gates["r1"].set()
        await discover()
    assert await _live_slots(scheduler, "render", clock.now()) == 0
