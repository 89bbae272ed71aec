"""Model-based test of the claim protocol: random interleavings against the real store.

Hypothesis drives the store (on each engine, with a manual clock) through publish, claim by one of
three workers, ping, success, fail, crash (the worker stops pinging and forgets), clock jumps,
late writes by workers that lost their lease, and cancel. After every step the invariants of
`tests/oracle.py` hold for every task; each fenced write is checked against what the task said
just before it; at the end, workers that keep running finish every task.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

import mscheduler as ms
from mscheduler.consumer.claimable import next_claim_for
from mscheduler.errors import LeaseLost, TaskNotFound
from mscheduler.liveness import lease_is_live
from mscheduler.models import Lease, WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import ENGINES, WIRE_DATABASE, Tally
from tests.oracle import check_consistent

T = TypeVar("T")
K = WorkerStateKind
KEYS = ("t0", "t1", "t2")
WORKERS = ("w0", "w1", "w2")
# Counted by the machines; each test tallies its share for the run's closing lines.
RUNS = {engine: {"machines": 0, "steps": 0} for engine in ENGINES}
# How many state-machine runs per engine: the wire is slower (a socket per call). At length
# in the slow tier (`--slow`, what .ci/run runs); a tenth of that in the README's command.
MODEL_RUNS = {
    "memory": int(os.environ.get("MSCHEDULER_MODEL_RUNS", "2000")),
    "wire": int(os.environ.get("MSCHEDULER_MODEL_RUNS_WIRE", "500")),
}
BRIEF = 10  # the README's command runs MODEL_RUNS // BRIEF


def _live_holder(task: ms.Task | None, lease: Lease, now: dt.datetime) -> bool:
    if task is None or task.state.is_terminal:
        return False
    return any(
        ws.run_id == lease.run_id and ws.worker_id == lease.worker_id and lease_is_live(ws, now)
        for ws in task.worker_states
    )


class ClaimProtocol(RuleBasedStateMachine):
    leases = Bundle("leases")

    ENGINE = "memory"
    URI = "memory://"  # the wire's subclass points at the session's wire server

    def __init__(self) -> None:
        super().__init__()
        RUNS[self.ENGINE]["machines"] += 1
        self._portal_cm = start_blocking_portal("asyncio")
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self.clock = ManualClock()
        self.sched: ms.Scheduler = self.run(
            ms.Scheduler.connect,
            self.URI,
            database=WIRE_DATABASE,
            collection=f"model_{uuid.uuid4().hex[:16]}",
            clock=self.clock,
        )
        self.crashed: set[str] = set()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        RUNS[self.ENGINE]["steps"] += 1
        return self.portal.call(lambda: fn(*args, **kwargs))

    def task(self, key: str) -> ms.Task | None:
        return self.run(self.sched.get, key)

    # ------------------------------------------------------------------ actions

    @rule(
        key=st.sampled_from(KEYS),
        concurrency=st.integers(1, 2),
        retries=st.integers(0, 2),
        retry_delay_ms=st.sampled_from([0, 2_000]),
    )
    def publish(self, key: str, concurrency: int, retries: int, retry_delay_ms: int) -> None:
        options = ms.TaskOptions(
            concurrent_worker_cnt=concurrency,
            max_unexpected_retries=retries,
            unexpected_retry_delay_ms=retry_delay_ms,
            ping_interval_ms=1_000,
            worker_timeout_ms=5_000,
        )
        self.run(self.sched.publish, key, None, name="job", options=options)

    @rule(target=leases, worker=st.sampled_from(WORKERS), key=st.none() | st.sampled_from(KEYS))
    def claim(self, worker: str, key: str | None) -> Any:
        if worker in self.crashed:
            return multiple()
        before = self.task(key) if key else None
        if key is not None:
            lease = self.run(self.sched.store.tasks.claim, worker, key=key)
        else:
            lease = self.run(self.sched.store.tasks.claim, worker, names=["job"])
        if lease is None:
            if before is not None and next_claim_for(before, worker, self.clock.now()) is None:
                pass  # refused for a reason the client can see; fine
            return multiple()
        now = self.clock.now()
        assert lease.worker_id == worker
        live = [ws for ws in lease.task.worker_states if lease_is_live(ws, now)]
        assert sum(1 for ws in live if ws.worker_id == worker) == 1, (
            "two live states for one worker"
        )
        return lease

    @rule(lease=leases)
    def ping(self, lease: Lease) -> None:
        self._fenced(lease, "ping")

    @rule(lease=consumes(leases), success=st.booleans())
    def finish(self, lease: Lease, success: bool) -> None:
        self._fenced(lease, "succeed" if success else "fail")

    @rule(lease=consumes(leases))
    def release(self, lease: Lease) -> None:
        self._fenced(lease, "release")

    def _fenced(self, lease: Lease, write: str) -> None:
        if lease.worker_id in self.crashed:
            return
        before = self.task(lease.key)
        holder = _live_holder(before, lease, self.clock.now())
        store = self.sched.store
        calls = {
            "ping": lambda: store.tasks.ping(lease),
            "succeed": lambda: store.tasks.succeed(lease, {"by": lease.worker_id}),
            "fail": lambda: store.tasks.fail(lease, RuntimeError("handler failed")),
            "release": lambda: store.tasks.release(lease),
        }
        try:
            after = self.run(calls[write])
        except LeaseLost:
            assert not holder, f"{write} by the live holder was refused"
            assert self.task(lease.key) == before, f"a refused {write} changed the task"
            return
        assert holder, f"{write} was recorded for a worker that did not hold a live lease"
        own = next(ws for ws in after.worker_states if ws.run_id == lease.run_id)
        expected = {"ping": K.RUNNING, "succeed": K.SUCCESS, "fail": K.FAIL, "release": K.RELEASED}
        assert own.state is expected[write]

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The worker vanishes: it stops pinging and never writes again."""
        # Keep two alive: a task with concurrent_worker_cnt=2 needs two distinct workers.
        if len(self.crashed | {worker}) <= len(WORKERS) - 2:
            self.crashed.add(worker)

    @rule(seconds=st.sampled_from([0.5, 1, 3, 6]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        before = self.task(key)
        if before is None:  # a key no task has is told so, and nothing is written
            with pytest.raises(TaskNotFound):
                self.run(self.sched.cancel, key)
            assert self.task(key) is None
            return
        cancelled = self.run(self.sched.cancel, key)
        assert cancelled == (not before.state.is_terminal)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def documents_agree_with_their_worker_states(self) -> None:
        for task in self.run(self.sched.store.get_many, list(KEYS)):
            check_consistent(task)
            succeeded = task.states(K.SUCCESS)
            assert len({ws.worker_id for ws in succeeded}) == len(succeeded), (
                "one worker, two successes"
            )
            # Failures stay within the limit while the task is unfinished: check_consistent
            # asserts it. A cancel may record an expired lease past the limit as it ends the
            # task (the cancel wins), so finished tasks are not held to it.

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            try:
                if self.ENGINE != "memory":
                    self.portal.call(self.sched.collection.drop)
                self.portal.call(self.sched.close)
            finally:
                self._portal_cm.__exit__(None, None, None)

    def _drain(self) -> None:
        """No task is lost: with live workers and time passing, every task ends terminal."""
        alive = [w for w in WORKERS if w not in self.crashed]
        for _ in range(60):
            tasks = self.run(self.sched.store.get_many, list(KEYS))
            if all(task.state.is_terminal for task in tasks):
                return
            self.clock.advance(6)
            for worker in alive:
                lease = self.run(self.sched.store.tasks.claim, worker, names=["job"])
                if lease is not None:
                    self.run(self.sched.store.tasks.succeed, lease, "drained")
        stuck = [(t.key, t.state.value) for t in self.run(self.sched.store.get_many, list(KEYS))]
        raise AssertionError(f"tasks never finished: {stuck}")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("length", ["brief", pytest.param("at length", marks=pytest.mark.slow)])
def test_claim_protocol(
    engine: str, length: str, request: pytest.FixtureRequest, tally: Tally
) -> None:
    runs = MODEL_RUNS[engine] if length == "at length" else max(1, MODEL_RUNS[engine] // BRIEF)
    before = dict(RUNS[engine])
    try:
        _run_the_model(engine, runs, request)
    finally:
        tally(
            "claim protocol model",
            engine,
            state_machine_runs=RUNS[engine]["machines"] - before["machines"],
            store_calls=RUNS[engine]["steps"] - before["steps"],
        )


def _run_the_model(engine: str, runs: int, request: pytest.FixtureRequest) -> None:
    uri = request.getfixturevalue("engine_uri")
    if engine == "memory":
        uri = "memory://"  # a private database per run
    machine = type(
        f"ClaimProtocolOn{engine.title()}", (ClaimProtocol,), {"ENGINE": engine, "URI": uri}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=runs,
            # Random locally, to explore; the same examples in CI, so a new draw cannot turn
            # it red.
            derandomize=bool(os.environ.get("CI")),
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
