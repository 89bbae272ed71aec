"""Model-based test of the discovery hub: random interleavings against one process's real hub.

Hypothesis drives a `TaskHub` (on each engine, with a manual clock: memory:// has change
streams, the wire engine has none, so the hub polls there) through subscribers that join and
leave (consumers of names, waiters of keys, watches of names through `TaskHub.follow`; some
read nothing and have room for two events, so they fall behind and are told to resync),
writes of every kind (publish, a dependent, a claim, a ping, one slot's failure, a success, a
release, a cancel, a retry), time passing, and on memory a stream that fails (an error, an
end, opens refused for a while) and may lose its place (the history rolls past it while it is
down: every subscriber resyncs).

The property, after every step and a bounded wait until idle (on the wire, one poll interval): every
subscriber has been handed, since it joined, every write that may give it work, or been told
to resync after it: a consumer each write that bumped ``wakes`` of a task of its names (the
writers' own rule, `queries.derived.wakes_consumers`), a waiter each change of state of its
keys, a watch every write of its names. While the stream is down (broken, not yet reopened by
a step that moves the clock) nothing can be delivered, so the property waits for it.

No step can block: every wait is on the manual clock, moved inside the step, or bounded.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pymongo.errors import AutoReconnect, OperationFailure

import mscheduler as ms
from mscheduler.models import Lease
from mscheduler.services.discovery import RESYNC, Subscription
from mscheduler.testing import ManualClock
from tests.engines import ENGINES, POLL_MS, WIRE_DATABASE, Tally, until_idle

T = TypeVar("T")
NAMES = ("a", "b")
# Each key keeps its name: t1 may depend on t0.
KEYS = {"t0": "a", "t1": "a", "t2": "b"}
# Counted by the machines; each test tallies its share for the run's closing lines.
RUNS = {engine: {"machines": 0, "steps": 0} for engine in ENGINES}
# One knob for every model test: MSCHEDULER_MODEL_RUNS(_WIRE), of which this model takes a
# fortieth on memory, a hundredth on the wire (a run of it makes many more calls).
MODEL_RUNS = {
    "memory": max(1, int(os.environ.get("MSCHEDULER_MODEL_RUNS", "2000")) // 40),
    "wire": max(1, int(os.environ.get("MSCHEDULER_MODEL_RUNS_WIRE", "500")) // 100),
}
BRIEF = 5  # the README's command runs MODEL_RUNS // BRIEF; the slow tier (--slow) all of them
# A step's real-time bound: a step that waits longer is a hang, reported as a failure.
STEP_TIMEOUT_S = 30
# Reconnect backoff, doubling from 0.1 s to 0.4 s: a step that moves the clock 0.5 s at a
# time reopens the stream within a few moves.
OPTIONS = {
    "poll_interval_ms": POLL_MS,
    "reconnect_backoff_ms": 100,
    "reconnect_backoff_max_ms": 400,
}
TASK_OPTIONS = ms.TaskOptions(
    concurrent_worker_cnt=2,
    max_unexpected_retries=2,
    unexpected_retry_delay_ms=300,
    ping_interval_ms=1_000,
    worker_timeout_ms=5_000,
)


class Recorded(Subscription):
    """A subscription that keeps what the hub handed it, in order, as it was handed: a task,
    or `RESYNC` (told to resync, or its buffer full: what it held is dropped for that)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[ms.Task | None] = []

    def deliver(self, item: ms.Task | None) -> None:
        resyncs = self.resyncs
        super().deliver(item)
        self.log.append(RESYNC if self.resyncs > resyncs else item)


@dataclass
class Owed:
    """A write the subscriber must hear of: a version of ``task_id`` after ``since`` (None:
    any version: a new task), or a resync handed after ``mark``."""

    key: str
    task_id: Any
    since: int | None
    mark: int
    what: str


@dataclass
class Subscriber:
    kind: str
    sub: Recorded
    reads: bool
    scope: anyio.CancelScope | None = None
    future: Future[None] | None = None
    entered: bool = False
    owed: list[Owed] = field(default_factory=list)

    def heard(self, owed: Owed) -> bool:
        for item in self.sub.log[owed.mark :]:
            if item is RESYNC:
                return True
            if item.id == owed.task_id and (owed.since is None or item.version > owed.since):
                return True
        return False

    def owes(self, before: ms.Task | None, after: ms.Task) -> str | None:
        """What this write is to this subscriber, when it must hear of it."""
        new = before is None or before.id != after.id
        sub = self.sub
        if after.name in sub.wakes and (new or after.wakes != before.wakes):  # type: ignore[union-attr]
            return "a write that may give it work"
        if after.key in sub.states and (new or after.state is not before.state):  # type: ignore[union-attr]
            return "a change of state"
        if None in sub.every or after.name in sub.every:
            return "a write"
        return None


class DiscoveryHubModel(RuleBasedStateMachine):
    ENGINE = "memory"
    URI = "memory://"

    def __init__(self) -> None:
        super().__init__()
        RUNS[self.ENGINE]["machines"] += 1
        self.streams = self.ENGINE == "memory"
        self._portal_cm = start_blocking_portal("asyncio")
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self.clock = ManualClock()
        self.sched: ms.Scheduler = self.portal.call(
            lambda: ms.Scheduler.connect(
                self.URI,
                database=WIRE_DATABASE,
                collection=f"hubmodel_{uuid.uuid4().hex[:16]}",
                clock=self.clock,
            )
        )
        self.hub = self.sched.services.task_hub
        self.subscribers: list[Subscriber] = []
        self.leases: list[Lease] = []
        self.workers = 0
        # The stream was broken and no step has moved the clock to reopen it since: the
        # streams the hub had opened then.
        self.down_at: int | None = None
        self.lose_place = False  # ... and each write while it is down rolls the oplog past it

    # ------------------------------------------------------------------ running steps

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """One step's work, on the portal's loop, bounded in real time."""
        RUNS[self.ENGINE]["steps"] += 1

        async def bounded() -> T:
            with anyio.fail_after(STEP_TIMEOUT_S):
                return await fn()

        return self.portal.call(bounded)

    async def _until_idle(self) -> None:
        """Everything runs until it waits on the clock; on the wire, one poll interval."""
        await until_idle()
        if not self.streams:
            self.clock.advance(POLL_MS / 1000)
            await until_idle()
        self._check_up()

    def _check_up(self) -> None:
        if self.down_at is not None and (
            not self.subscribers or self.hub.streams_opened > self.down_at
        ):
            self.down_at = None

    async def _advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self._until_idle()

    async def _reconnect(self) -> None:
        """Moves the clock past the stream's backoff until it has reopened."""
        for _ in range(20):
            if self.down_at is None:
                return
            await self._advance(0.5)
        raise AssertionError("the hub never reopened its stream")

    # ------------------------------------------------------------------ subscribers

    @initialize(
        kind=st.sampled_from(["consumer", "waiter", "watch"]),
        names=st.sets(st.sampled_from(NAMES), min_size=1),
        keys=st.sets(st.sampled_from(sorted(KEYS)), min_size=1),
        published=st.sets(st.sampled_from(sorted(KEYS))),
    )
    def first_subscriber(
        self, kind: str, names: set[str], keys: set[str], published: set[str]
    ) -> None:
        """A run starts with a subscriber, and some tasks published before it joined."""
        for key in sorted(published):
            self.run(lambda key=key: self._write(key, "publish", False))
        self.subscribe(kind, names, False, keys, False)

    @rule(
        kind=st.sampled_from(["consumer", "waiter", "watch"]),
        names=st.sets(st.sampled_from(NAMES), min_size=1),
        every_name=st.booleans(),
        keys=st.sets(st.sampled_from(sorted(KEYS)), min_size=1),
        slow=st.booleans(),
    )
    def subscribe(
        self, kind: str, names: set[str], every_name: bool, keys: set[str], slow: bool
    ) -> None:
        options = ms.WorkerOptions(worker_id="w0", **OPTIONS)  # type: ignore[arg-type]
        reads = not slow or kind == "watch"  # a watch reads as it serves
        buffer = {"buffer_size": 2} if not reads else {}
        if kind == "consumer":
            sub = Recorded(options, wakes=sorted(names), worker_id="w0", **buffer)
        elif kind == "waiter":
            sub = Recorded(options, states=sorted(keys), **buffer)
        else:
            sub = Recorded(options, every=[None] if every_name else sorted(names))
        subscriber = Subscriber(kind, sub, reads)
        self.subscribers.append(subscriber)
        subscriber.future = self.portal.start_task_soon(self._hold, subscriber)
        self.run(lambda: self._joined(subscriber))

    async def _hold(self, subscriber: Subscriber) -> None:
        """The subscriber's life: subscribed until its scope is cancelled."""
        sub = subscriber.sub
        store = self.sched.store

        async def read_again() -> None:
            """A waiter's read of its keys (`waiting._Waiter._read_all`): the poll then
            reads its tasks' writes by name."""
            for task in await store.get_many(sorted(sub.states)):
                sub.note(task)

        with anyio.CancelScope() as scope:
            subscriber.scope = scope
            if subscriber.kind == "watch":
                async with contextlib.aclosing(self.hub.follow(sub)) as events:
                    async for _ in events:
                        pass
                return
            async with self.hub.subscription(sub):
                subscriber.entered = True
                if sub.states:
                    await read_again()
                while subscriber.reads:
                    if await sub.next() is RESYNC and sub.states:
                        await read_again()
                await anyio.sleep_forever()

    async def _joined(self, subscriber: Subscriber) -> None:
        sub = subscriber.sub
        # Joined once covered (a watch: as soon as the hub covers it); a stream being
        # reopened (its backoff) covers it only once the clock moves.
        for _ in range(20):
            await self._until_idle()
            if subscriber.entered or (subscriber.kind == "watch" and sub.covered.is_set()):
                subscriber.entered = True
                break
            self.clock.advance(0.5)
        else:
            raise AssertionError(f"a {subscriber.kind} joining was never covered by the hub")
        await self._until_idle()

    @precondition(lambda self: self.subscribers)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        subscriber = data.draw(st.sampled_from(self.subscribers))
        self.subscribers.remove(subscriber)
        assert subscriber.scope is not None and subscriber.future is not None
        scope = subscriber.scope

        async def leave() -> None:
            scope.cancel()
            await self._until_idle()

        self.run(leave)
        subscriber.future.result(timeout=STEP_TIMEOUT_S)

    # ------------------------------------------------------------------ the stream

    @precondition(lambda self: self.streams and self.subscribers and self.down_at is None)
    @rule(how=st.sampled_from(["error", "end", "refused_opens"]), lost=st.booleans())
    def break_stream(self, how: str, lost: bool) -> None:
        """The stream fails (a network error), or the server ends it, or fails it and then
        refuses to reopen it twice (an election): the hub reopens it from its place once the
        clock passes its backoff, which only a later step moves. ``lost``: the oplog rolls
        past that place with each write made while it is down, so the hub cannot resume, opens
        afresh and tells every subscriber to resync."""
        feed = self.sched.collection.changes
        self.down_at = self.hub.streams_opened
        self.lose_place = lost
        if how == "refused_opens":
            feed.fail_opens(*[OperationFailure("primary stepped down", code=189)] * 2)
        if how == "end":
            feed.end_streams()
        else:
            feed.inject_error(AutoReconnect("connection reset"))
        self.run(until_idle)

    @precondition(lambda self: self.down_at is not None)
    @rule()
    def history_lost(self) -> None:
        """The oplog rolls past the stream's place while it is down (if written since)."""
        self.sched.collection.changes.forget_history()

    @rule()
    def reconnect(self) -> None:
        self.run(self._reconnect)

    @rule(seconds=st.sampled_from([0.5, 6]))
    def time_passes(self, seconds: float) -> None:
        """Leases expire, retries come due, the poll reads by state (every 5 s)."""

        async def passes() -> None:
            await self._advance(seconds)
            await self._reconnect()

        self.run(passes)

    # ------------------------------------------------------------------ writes

    @rule(
        key=st.sampled_from(sorted(KEYS)),
        write=st.sampled_from(
            ["publish", "claim", "ping", "fail", "succeed", "release", "cancel", "retry"]
        ),
        flag=st.booleans(),
    )
    def write(self, key: str, write: str, flag: bool) -> None:
        self.run(lambda: self._write(key, write, flag))

    async def _write(self, key: str, write: str, flag: bool) -> None:
        store, sched = self.sched.store, self.sched
        before = {task.key: task for task in await store.get_many(sorted(KEYS))}
        marks = [len(subscriber.sub.log) for subscriber in self.subscribers]
        lease = next((held for held in self.leases if held.key == key), None)
        try:
            if write == "publish":
                await sched.publish(
                    key,
                    None,
                    name=KEYS[key],
                    options=TASK_OPTIONS,
                    replace_finished=flag,
                    depends_on=["t0"] if key == "t1" and flag else None,
                    allow_missing=True,
                )
            elif write == "claim":
                self.workers += 1
                claimed = await store.tasks.claim(f"w{self.workers}", key=key)
                if claimed is not None:
                    self.leases.append(claimed)
            elif write == "ping" and lease is not None:
                await store.tasks.ping(lease)
            elif write in ("fail", "succeed", "release") and lease is not None:
                self.leases.remove(lease)
                if write == "fail":
                    await store.tasks.fail(lease, RuntimeError("one slot fails"))
                elif write == "succeed":
                    await store.tasks.succeed(lease, "done")
                else:
                    await store.tasks.release(lease)
            elif write == "cancel":
                await sched.cancel(key)
            elif write == "retry":
                await sched.retry(key)
        except ms.MSchedulerError:
            pass  # refused (a lost lease, a running task, nothing to retry): nothing written
        if self.down_at is not None and self.lose_place:
            self.sched.collection.changes.forget_history()
        after = {task.key: task for task in await store.get_many(sorted(KEYS))}
        for written, task in after.items():
            was = before.get(written)
            if was is not None and (was.id, was.version) == (task.id, task.version):
                continue
            since = was.version if was is not None and was.id == task.id else None
            for subscriber, mark in zip(self.subscribers, marks, strict=True):
                what = subscriber.owes(was, task)
                if what is not None:
                    subscriber.owed.append(Owed(written, task.id, since, mark, what))
        await self._until_idle()

    # ------------------------------------------------------------------ the property

    @invariant()
    def every_subscriber_heard_every_write_it_may_need(self) -> None:
        if self.down_at is not None:
            return  # nothing can be delivered until the stream is reopened
        for subscriber in self.subscribers:
            for owed in subscriber.owed:
                assert subscriber.heard(owed), (
                    f"a {subscriber.kind} ({_wants(subscriber.sub)}) was never handed "
                    f"{owed.what} of {owed.key} (_id {owed.task_id}, after version "
                    f"{owed.since}), nor told to resync after it; it was handed "
                    f"{[_brief(item) for item in subscriber.sub.log]}"
                )
            subscriber.owed = [owed for owed in subscriber.owed if not subscriber.heard(owed)]

    def teardown(self) -> None:
        try:
            if self.subscribers:
                self.run(self._reconnect)
                self.every_subscriber_heard_every_write_it_may_need()

            async def close() -> None:
                for subscriber in self.subscribers:
                    assert subscriber.scope is not None
                    subscriber.scope.cancel()
                await until_idle()
                assert self.hub.subscribers == 0
                if self.ENGINE != "memory":
                    await self.sched.collection.drop()
                await self.sched.close()

            self.run(close)
        finally:
            self._portal_cm.__exit__(None, None, None)


def _wants(sub: Subscription) -> str:
    return (
        f"wakes={sorted(sub.wakes)} states={sorted(sub.states)} every={sorted(map(str, sub.every))}"
    )


def _brief(item: ms.Task | None) -> str:
    return "RESYNC" if item is None else f"{item.key} v{item.version} {item.state.value}"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("length", ["brief", pytest.param("at length", marks=pytest.mark.slow)])
def test_every_write_that_may_give_a_subscriber_work_reaches_it(
    engine: str, length: str, request: pytest.FixtureRequest, tally: Tally
) -> None:
    runs = MODEL_RUNS[engine] if length == "at length" else max(1, MODEL_RUNS[engine] // BRIEF)
    before = dict(RUNS[engine])
    try:
        _run_the_model(engine, runs, request)
    finally:
        tally(
            "discovery hub model",
            engine,
            state_machine_runs=RUNS[engine]["machines"] - before["machines"],
            steps=RUNS[engine]["steps"] - before["steps"],
        )


def _run_the_model(engine: str, runs: int, request: pytest.FixtureRequest) -> None:
    uri = request.getfixturevalue("engine_uri")
    if engine == "memory":
        uri = "memory://"  # a private database per run
    machine = type(
        f"DiscoveryHubOn{engine.title()}", (DiscoveryHubModel,), {"ENGINE": engine, "URI": uri}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=runs,
            # Random locally, to explore; the same examples in CI, so a new draw cannot turn
            # it red.
            derandomize=bool(os.environ.get("CI")),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
