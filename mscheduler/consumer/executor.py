"""Runs a consumer's handlers: local retries, one bulk ping per interval, fenced finish, release.

Each running task has its own cancel scope, so a lost lease, a remote cancel or a shutdown
stops exactly that handler. What a worker writes for a task is always fenced by its run_id
(see `queries.lease_filter`): whatever this module decides, a late write changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from .. import context, retry_policy
from ..clock import Clock, sleep
from ..constants import HURRIED_RELEASE_TIMEOUT_S
from ..errors import (
    Abort,
    BackendUnavailable,
    LeaseLost,
    PayloadError,
    RetryLater,
    StoreError,
)
from ..liveness import expiry_margin, lease_expiry
from ..models import ErrorInfo, Lease, Task, WorkerStateKind
from ..observability import otel_metrics, tracing
from ..reconnect_backoff import Backoff
from ..store.components import Store
from ..worker_options import WorkerOptions
from .batching import Batch, Batcher
from .calls import HandlerCalls, log_failure, log_finished
from .handlers import HandlerSpec
from .stats import ConsumerStats

log = logging.getLogger(__name__)

# A handler's progress is written at most this often per task (it brings the ping forward).
PROGRESS_EVERY = dt.timedelta(seconds=1)
_RELEASE_TIMEOUT_S = 10.0  # real seconds a release may take at shutdown before we give up


@dataclasses.dataclass
class _Running:
    lease: Lease
    scope: anyio.CancelScope
    next_ping_at: dt.datetime
    expire_at: dt.datetime
    ping_interval_ms: int
    worker_timeout_ms: int
    stop_reason: str | None = None
    release_on_stop: bool = False
    progress_written_at: dt.datetime | None = None
    # While its outcome is written: a shutdown cuts a write that outlasts the grace (`shutdown`).
    writing: anyio.CancelScope | None = None

    @property
    def stop_at(self) -> dt.datetime:
        return self.expire_at - expiry_margin(self.worker_timeout_ms)

    def stop(self, reason: str, *, release: bool) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.release_on_stop = release
            self.scope.cancel()


@dataclasses.dataclass
class _Outcome:
    result: Any = None
    error: BaseException | None = None
    seconds: float | None = None  # the handler's wall time, all local retries included
    final: bool = False  # the failure ends the task (`Abort`, or not in ``retry_on``)


class FreedSlots(Protocol):
    """Told of each run's end (`Claimer.slot_freed`). Invariant: called once per started
    lease, after its slot is free: when its handler returned (an abandoned one: when it
    finally returns), ``written`` saying whether its outcome was recorded."""

    def slot_freed(self, key: str, written: bool) -> None: ...


class StartGate(Protocol):
    """Where a handler's start waits for its name's rate (`limits.Limiter`). Invariant: each
    wait returns once the start may count (at once for a name without a limit), and
    `started` is called as the handler really begins, which is when the start counts from."""

    async def at_start(self, task: Task) -> None:
        """Before the first call of a run's handler."""

    async def restart(self, task: Task) -> None:
        """Before a local retry: a start like the first (its slot is held already)."""

    def started(self, task: Task) -> None:
        """The handler begins now: in this process, or in its child process."""


class Executor:
    def __init__(
        self,
        store: Store,
        handlers: Mapping[str, HandlerSpec],
        options: WorkerOptions,
        clock: Clock,
        stats: ConsumerStats,
        *,
        gate: StartGate,
    ) -> None:
        self._store = store
        self._task_group: TaskGroup | None = None
        # A batch handler's groups are this consumer's: its clock, its task group.
        handlers = {
            name: dataclasses.replace(
                spec, function=Batcher(spec.function, clock, lambda: self._task_group)
            )
            if isinstance(spec.function, Batch)
            else spec
            for name, spec in handlers.items()
        }
        self._handlers = handlers
        self._options = options
        self._clock = clock
        self._stats = stats
        self._freed: FreedSlots | None = None  # the claimer, given at `bind`
        self._gate = gate  # a start, a local retry's too, counts against its name's rate
        self._running: dict[str, _Running] = {}
        self.started = 0  # leases handed to `start`: what ``max_tasks`` counts
        self._calls = HandlerCalls(handlers, options, clock, stats)
        self._ping_wake = anyio.Event()
        self._idle = anyio.Event()
        self._hurried = anyio.Event()

    @property
    def free_slots(self) -> int:
        """An abandoned handler still runs: it keeps its slot until it returns. With
        ``max_tasks``, no more slots than runs left to start."""
        abandoned = self._calls.abandoned
        held = len(self._running) + sum(1 for key in abandoned if key not in self._running)
        free = self._options.max_running - held
        if self._options.max_tasks is not None:
            free = min(free, self._options.max_tasks - self.started)
        return free

    def holds(self, key: str) -> bool:
        """Whether ``key`` is one this worker runs (or abandoned, still running)."""
        return key in self._running or key in self._calls.abandoned

    @property
    def running_keys(self) -> list[str]:
        """Keys this worker must not claim: running, or abandoned and still running."""
        return list(dict.fromkeys([*self._running, *self._calls.abandoned]))

    @property
    def running_leases(self) -> list[Lease]:
        """The leases whose handlers run and have not been told to stop."""
        return [e.lease for e in self._running.values() if e.stop_reason is None]

    @property
    def held_runs(self) -> set[str]:
        """The run_ids of the leases this worker runs now: a live state of its worker_id with
        another run_id belongs to a previous life (a restart under the same id)."""
        return {entry.lease.run_id for entry in self._running.values()}

    def _may_start(self, entry: _Running) -> bool:
        """Checked as the handler is about to start: a claim whose handler waited (the loop
        blocked) until the lease ran out must not start, as another worker may hold it now."""
        if entry.stop_reason is None and self._clock.now() >= entry.stop_at:
            self._stats.record("timeouts", entry.lease.task.name)
            entry.stop("the lease expired before its handler started", release=False)
        return entry.stop_reason is None

    def bind(self, task_group: TaskGroup, freed: FreedSlots) -> None:
        """The consumer's task group, and where each run's freed slot goes (the claimer,
        which is built on this executor's slots: so given here, once, as the consumer
        starts, before the first lease)."""
        self._task_group = task_group
        self._freed = freed

    # ------------------------------------------------------------ running one task

    def start(self, lease: Lease) -> None:
        assert self._task_group is not None, "Executor.bind() first"
        self.started += 1
        now = self._clock.now()
        options = lease.task.options
        self._running[lease.key] = _Running(
            lease=lease,
            scope=anyio.CancelScope(),
            next_ping_at=now + dt.timedelta(milliseconds=options.ping_interval_ms),
            expire_at=lease.ping_expire_at or now,
            ping_interval_ms=options.ping_interval_ms,
            worker_timeout_ms=options.worker_timeout_ms,
        )
        lease.on_progress(self._progress_callback(lease.key))
        self._ping_wake.set()
        otel_metrics.claimed(lease)  # claim latency
        self._task_group.start_soon(self._run, lease.key, name=f"mscheduler:{lease.key}")

    async def _run(self, key: str) -> None:
        entry = self._running[key]
        run = context.Run(entry.lease)
        name = entry.lease.task.name
        started = time.perf_counter()
        written = False  # did this run write its end (outcome or release)?
        try:
            with entry.scope:
                token = context.enter(run)
                try:
                    outcome = await self._call_handler(entry)
                    outcome.seconds = run.seconds = time.perf_counter() - started
                finally:
                    context.leave(token)
            if entry.stop_reason is not None:
                written = await self._after_stop(entry)
            elif run.completed:
                self._stats.record("succeeded", name, run.seconds)  # committed by the handler
                log_finished(entry.lease, "success", run.seconds)
                written = True
            else:
                entry.writing = anyio.CancelScope()
                with entry.writing:
                    written = await self._finish(entry, outcome)
                if entry.writing.cancelled_caught:
                    log.error(
                        "outcome of task %r not recorded: the worker stopped before the write "
                        "landed; its lease is left to expire",
                        entry.lease.key,
                        extra={"action": "outcome_lost", "key": entry.lease.key},
                    )
        finally:
            if self._running.get(key) is entry:
                del self._running[key]
            if not self._running:
                self._idle.set()
            # A run that ended without writing (lease lost or expired, outcome not recorded)
            # produced no change event: the key must be looked at again, or it would wait
            # for some other write to it (it was excluded from claims while it ran). An
            # abandoned handler frees its slots (ours, its name's) only once it returns.
            abandoned = self._calls.abandoned.get(key)
            freed = self._freed
            assert freed is not None, "Executor.bind() first"
            if abandoned is None:
                freed.slot_freed(key, written)
            else:
                abandoned.add_done_callback(lambda _: freed.slot_freed(key, written))

    async def _call_handler(self, entry: _Running) -> _Outcome:
        task = entry.lease.task
        for attempt in range(self._options.handler_retries + 1):
            await self._calls.prepare(task)
            if attempt:
                await self._gate.restart(task)
            else:
                await self._gate.at_start(task)
            try:
                with tracing.processing(entry.lease, lambda: entry.stop_reason):
                    result = await self._calls.call(
                        task, lambda: self._may_start(entry), lambda: self._gate.started(task)
                    )
                return _Outcome(result=result)
            except Exception as exc:
                final = retry_policy.ends_the_task(exc, self._handlers[task.name].retry_on)
                if final or not retry_policy.retries_locally(
                    exc, attempt, self._options.handler_retries
                ):
                    return _Outcome(error=exc, final=final)
                self._stats.record("handler_retries", task.name)
                log.info(
                    "handler failed, retrying locally",
                    extra={"action": "handler_retry", "key": task.key, "attempt": attempt + 1},
                    exc_info=exc,
                )
                await sleep(self._clock, self._options.handler_retry_delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _finish(self, entry: _Running, outcome: _Outcome) -> bool:
        """Record the outcome, retrying while the database is unreachable and the lease lives."""
        lease = entry.lease
        backoff = Backoff(self._clock, self._options.reconnect_delay)
        while True:
            try:
                if outcome.error is None:
                    try:
                        await self._store.tasks.record_success(lease, outcome.result)
                        break
                    except PayloadError as exc:
                        outcome = _Outcome(error=exc, seconds=outcome.seconds)  # unstorable
                error = outcome.error
                assert error is not None
                if isinstance(error, RetryLater):
                    await self._store.tasks.retry_later(lease, error.delay, error.reason)
                else:
                    info = ErrorInfo.from_exception(error)  # once: stored, then logged
                    task = await self._store.tasks.fail(lease, info, final=outcome.final)
                    log_failure(lease, error, info, task, outcome.seconds)
                break
            except LeaseLost as exc:
                if backoff.attempt > 0 and self._landed_before(lease, outcome, exc):
                    break
                self._stats.record("lease_lost", lease.task.name)
                log.warning(str(exc), extra={"action": "lease_lost", "key": lease.key})
                return False
            except (StoreError, PayloadError) as exc:
                # The server refused the write (not the network): retrying will not help, and
                # one task's outcome must not end the consumer. The lease expires unfinished.
                self._stats.record("lease_lost", lease.task.name)
                log.error(
                    "outcome of task %r not recorded: %s",
                    lease.key,
                    exc,
                    extra={"action": "outcome_lost", "key": lease.key},
                )
                return False
            except BackendUnavailable as exc:
                if self._clock.now() >= entry.expire_at:
                    log.warning(
                        "outcome not recorded: the lease expired while MongoDB was unreachable",
                        extra={"action": "outcome_lost", "key": lease.key},
                    )
                    return False
                log.warning(str(exc), extra={"action": "finish_retry", "key": lease.key})
                await backoff.wait()
        self._record(lease, outcome)
        return True

    def _record(self, lease: Lease, outcome: _Outcome) -> None:
        name = lease.task.name
        error = outcome.error
        if error is None:
            self._stats.record("succeeded", name, outcome.seconds)
            log_finished(lease, "success", outcome.seconds)
        elif isinstance(error, RetryLater):
            self._stats.record("deferred", name, outcome.seconds)
            log_finished(lease, "retry_later", outcome.seconds)
        else:
            if isinstance(error, Abort):
                self._stats.record("aborted", name, outcome.seconds)
            self._stats.record("failed", name, outcome.seconds)

    @staticmethod
    def _landed_before(lease: Lease, outcome: _Outcome, lost: LeaseLost) -> bool:
        """After a retried finish found no lease: did the attempt whose reply was lost land?
        Then the run's state is the one this outcome writes (`LeaseLost` read it), and
        nothing was lost."""
        error = outcome.error
        if error is None:
            wrote = WorkerStateKind.SUCCESS
        elif isinstance(error, RetryLater):
            wrote = WorkerStateKind.RELEASED
        else:
            wrote = WorkerStateKind.FAIL
        if lost.state != wrote.value:
            return False
        log.info(
            "the outcome of task %r was recorded by an attempt whose reply was lost",
            lease.key,
            extra={"action": "finish_landed", "key": lease.key},
        )
        return True

    async def _after_stop(self, entry: _Running) -> bool:
        lease = entry.lease
        log.info(
            "handler stopped: %s",
            entry.stop_reason,
            extra={"action": "handler_stopped", "key": lease.key},
        )
        if not entry.release_on_stop:
            self._stats.record("cancelled", lease.task.name)
            return False
        timeout = HURRIED_RELEASE_TIMEOUT_S if self._hurried.is_set() else _RELEASE_TIMEOUT_S
        with anyio.move_on_after(timeout, shield=True):
            try:
                await self._store.tasks.release(lease, entry.stop_reason or "released")
                self._stats.record("released", lease.task.name)
                return True
            except (LeaseLost, BackendUnavailable, StoreError) as exc:
                log.warning(str(exc), extra={"action": "release_failed", "key": lease.key})
        return False

    # ------------------------------------------------------------ what the listener saw

    def on_change(self, task: Task) -> None:
        """A running task changed: stop its handler if it was cancelled, taken over or no
        longer ours to run; otherwise pick up a new ping interval."""
        entry = self._running.get(task.key)
        if entry is None or task.version <= entry.lease.task.version:
            return  # not ours, or a snapshot from before our claim
        own = next((ws for ws in task.worker_states if ws.run_id == entry.lease.run_id), None)
        if task.state.is_terminal or own is None or own.state is not WorkerStateKind.RUNNING:
            entry.stop(f"the task is {task.state.value} and no longer held", release=False)
        elif (
            task.options.specific_worker_ids
            and self._options.worker_id not in task.options.specific_worker_ids
        ):
            entry.stop("this worker was removed from specific_worker_ids", release=True)
        else:
            entry.ping_interval_ms = task.options.ping_interval_ms
            entry.worker_timeout_ms = task.options.worker_timeout_ms

    # ------------------------------------------------------------ pinging

    def _progress_callback(self, key: str) -> Callable[[], None]:
        """What the lease of ``key`` calls on each report: `progress_reported`, always on this
        event loop (it moves the ping loop's schedule, which only this loop may touch). From
        another thread, a sync handler's, the report is handed to the loop without waiting;
        if the loop is closed, the attempt ended long ago and the report has nowhere to go."""
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def reported() -> None:
            if threading.get_ident() == loop_thread:
                self.progress_reported(key)
                return
            try:
                loop.call_soon_threadsafe(self.progress_reported, key)
            except RuntimeError:  # the event loop is closed
                log.debug("progress of %s reported after its worker stopped", key)

        return reported

    def progress_reported(self, key: str) -> None:
        """A handler reported progress: its ping comes at once, or a second after the last
        one that wrote progress (coalesced: one write a second per task at most); the other
        leases due within half their interval go in the same bulk write."""
        entry = self._running.get(key)
        if entry is None or entry.stop_reason is not None:
            return
        reported = entry.lease.reported_progress
        if reported is not None:  # the metrics see it now, not at the write
            self._stats.progress(entry.lease.task.name, reported.fraction)
        now = self._clock.now()
        due = now
        if entry.progress_written_at is not None:
            due = max(now, entry.progress_written_at + PROGRESS_EVERY)
        if due < entry.next_ping_at:
            entry.next_ping_at = due
            self._ping_wake.set()

    async def ping_loop(self) -> None:
        """One bulk write pings every lease that is due (or due within half its interval)."""
        backoff = Backoff(self._clock, self._options.reconnect_delay)  # of the bulk ping
        while True:
            self._ping_wake = wake = anyio.Event()
            # A stopped handler that is still winding down is pinged no more: counting its
            # past ping time here would make this loop spin until the handler returns.
            pinged = [e for e in self._running.values() if e.stop_reason is None]
            deadline = min((e.next_ping_at for e in pinged), default=None)
            await self._clock.wait_until(deadline, wake)
            now = self._clock.now()
            for entry in self._running.values():
                if entry.stop_at <= now and entry.stop_reason is None:
                    self._stats.record("timeouts", entry.lease.task.name)
                    entry.stop("the lease expired before a ping got through", release=False)
            batch = [
                e
                for e in self._running.values()
                if e.stop_reason is None
                and e.next_ping_at - dt.timedelta(milliseconds=e.ping_interval_ms / 2) <= now
            ]
            if not batch or min(e.next_ping_at for e in batch) > now:
                continue
            try:
                lost = await self._store.tasks.ping_many([e.lease for e in batch])
            except BackendUnavailable as exc:
                log.warning(str(exc), extra={"action": "ping_retry"})
                retry_at = now + dt.timedelta(seconds=backoff.next_delay())
                for entry in batch:
                    entry.next_ping_at = min(retry_at, entry.stop_at)
                continue
            backoff.reset()
            self._stats.record("pings")
            lost_runs = {lease.run_id for lease in lost}
            for entry in batch:
                if entry.lease.run_id in lost_runs:
                    self._stats.record("lease_lost", entry.lease.task.name)
                    entry.stop("the lease was lost (found at ping)", release=False)
                else:
                    entry.expire_at = lease_expiry(now, entry.worker_timeout_ms)
                    entry.next_ping_at = now + dt.timedelta(milliseconds=entry.ping_interval_ms)
                    if entry.lease.reported_progress is not None:
                        entry.progress_written_at = now

    # ------------------------------------------------------------ shutdown

    async def shutdown(self) -> None:
        """Let handlers finish within the grace period, then stop the rest and release them,
        so another worker can claim at once instead of waiting for the leases to expire.

        Bounded: past the grace, handlers get ``cancel_timeout_ms`` to unwind (then they are
        abandoned, `HandlerCalls`), and so do the writes of outcomes still on their way (a
        slow or unreachable server, or a batch of other consumers' finishes ahead of them):
        then they are cut, and their leases left to expire. Releases have their own bound."""
        deadline = self._clock.now() + dt.timedelta(milliseconds=self._options.shutdown_grace_ms)
        while self._running and self._clock.now() < deadline and not self._hurried.is_set():
            self._idle = idle = anyio.Event()
            await self._clock.wait_until(deadline, idle)
        self._stop_all()
        give_up = self._clock.now() + dt.timedelta(milliseconds=self._options.cancel_timeout_ms)
        while self._running:
            self._idle = idle = anyio.Event()
            if self._clock.now() < give_up:
                await self._clock.wait_until(give_up, idle)
                continue
            for entry in self._running.values():
                if entry.writing is not None:
                    entry.writing.cancel()
            await idle.wait()

    async def stop_children(self) -> None:
        """Stop the isolated handlers' children: the consumer's run is over (or cancelled),
        and none may be left behind."""
        await self._calls.children.aclose()

    def hurry(self) -> None:
        """Stop now: end the grace period, cancel every handler and release its lease at once
        (a release not done within `HURRIED_RELEASE_TIMEOUT_S` leaves the lease to expire).
        A released task is claimable by another worker at once and counts no failure."""
        self._hurried.set()
        self._idle.set()  # wakes the grace period's wait: it ends now
        if self._task_group is not None:
            self._stop_all()

    def _stop_all(self) -> None:
        for entry in list(self._running.values()):
            entry.stop("the worker is shutting down", release=True)
