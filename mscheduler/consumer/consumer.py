"""`Consumer`: runs handlers for tasks of some names, in one anyio task group.

- listener (`listener.py`): change events of the consumer's names → heap; running tasks that
  changed → executor (cancelled remotely, worker excluded, new ping interval).
- fetcher: the tasks that become claimable first → heap; at start (after the stream is open),
  after an unresumable stream loss, when the heap drained after overflowing, and on every
  poll interval when the server has no change streams; with a stream, one page of them
  every ``backstop_interval_ms`` (`ChangeListener.poll_loop`).
- heap (`heap.py`): next-claim time per key; the claimer sleeps until the earliest.
- claimer (`claimer.py`): while a slot is free and something is due, claims the best tasks of
  its names (server-side: priority, then age), a limited name's under a token (`limits.py`);
  puts back what was not claimable; recovers claims whose replies were lost.
- executor (`executor.py`): handlers, local retries, one bulk ping per interval, finish.
- controls (`controls.py`): schedules, expiry (idle, 3 reads a minute); paused names,
  limits, schedules and a remote stop (`Scheduler.stop_worker`), re-read on each change the
  process's `ControlHub` sees (one stream, or one read of a version per poll interval, for
  all the consumers of a `Scheduler`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from types import TracebackType

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..errors import ConfigurationError
from ..models import Task
from ..reconnect_backoff import retrying
from ..services.root import Services
from ..worker_options import WorkerOptions
from .claimer import Claimer
from .controls import Controls
from .executor import Executor
from .handlers import Handler, handler_specs
from .heap import ClaimHeap
from .limits import Limiter
from .listener import ChangeListener
from .presence import Presence
from .stats import ConsumerStats

log = logging.getLogger(__name__)

# How long a finished task may stay "dependents not told" before a consumer that saw it tells
# them itself: far beyond the writer's next round trip, so normally it is done by then.
_DEPENDENTS_GRACE_S = 10.0


class Consumer:
    """Claims and runs tasks of the handled names until `stop` or cancellation.

    Exported as a type only (to annotate, to read `stats` or call `stop`): get one from
    `Scheduler.consumer` or `Scheduler.consumers`. The constructor takes the internal
    services (`services.root.Services`) and may change in any release."""

    def __init__(
        self,
        services: Services,
        handlers: Mapping[str, Handler],
        options: WorkerOptions | None = None,
    ) -> None:
        if options is not None and not isinstance(options, WorkerOptions):
            raise ConfigurationError(
                f"options: expected WorkerOptions, got {type(options).__name__}"
            )
        self.options = options or WorkerOptions()
        self._specs = handler_specs(handlers)
        self.handlers = {name: spec.function for name, spec in self._specs.items()}
        self.names = sorted(self.handlers)
        self.worker_id = self.options.worker_id
        self.stats = ConsumerStats()
        store = services.store
        self._store = store
        self._owed = services.owed
        self._clock = services.clock
        self._heap = ClaimHeap(self.options.heap_size)
        self._stop_requested = anyio.Event()
        self.stopped_remotely = False  # the stop came from `Scheduler.stop_worker`
        # Why it stopped by itself (``burst``: nothing left; ``max_tasks``), else None.
        self.done_by_itself: str | None = None
        self._limiter = Limiter(store)
        self._executor = Executor(
            store,
            self._specs,
            self.options,
            self._clock,
            self.stats,
            freed=self,
            gate=self._limiter,
        )
        self._listener = ChangeListener(
            services.task_hub,
            self.names,
            self.options,
            self._clock,
            self._on_event,
            self._resync,
            self.fetch,
            self._executor.holds,
        )
        self._own_task_group: TaskGroup | None = None
        self._fetched = False  # the first fetch is done (`_limits` fetches again after it)
        # Keys of finished tasks whose dependents may be stranded, and when to check.
        self._recovery_checks: dict[str, dt.datetime] = {}
        self._recovery_wake = anyio.Event()
        self._controls = Controls(services, self.names, self.options, self.fetch, self._limits)
        self._presence = Presence(store, self.names, self.options, self._heap, lambda: self.running)
        self._claimer = Claimer(
            store.tasks,
            self._heap,
            self._executor,
            self._limiter,
            self,
            names=self.names,
            options=self.options,
            clock=self._clock,
            stats=self.stats,
        )

    @property
    def polling(self) -> bool:
        """True when the server has no change streams and the consumer polls instead."""
        return self._listener.polling

    @property
    def paused(self) -> set[str]:
        """Names paused (`Scheduler.pause`): this consumer claims none of their tasks."""
        return self._controls.paused

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def running(self) -> list[str]:
        """Keys of the tasks this consumer is running now."""
        return self._executor.running_keys

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until `stop` (graceful) or cancellation (hard: running leases left to expire).
        With ``task_group.start``, returns once the change stream is open and the first
        fetch done."""
        async with anyio.create_task_group() as task_group:
            await task_group.start(self._serve)
            task_status.started()

    async def wait_stopped(self) -> None:
        """Return once `stop` has been called (the shutdown itself follows)."""
        await self._stop_requested.wait()

    def stop(self) -> None:
        """Stop claiming, let running handlers finish within the grace period, release the rest."""
        self._stop_requested.set()

    def stop_now(self) -> None:
        """Stop claiming and cancel every running handler at once, releasing its lease (within
        about two seconds, or the lease is left to expire): another worker claims the task at
        once, and no failure is counted. A sync handler that ignores its cancellation still
        gets ``cancel_timeout_ms`` before it is abandoned."""
        self._stop_requested.set()
        self._executor.hurry()

    def _stop_remotely(self, drain: bool) -> None:
        """A stop requested of this worker (`Scheduler.stop_worker`): as `stop`, or, without
        ``drain``, as `stop_now` (also when a draining stop is under way)."""
        log.info(
            "stop requested remotely",
            extra={"action": "remote_stop", "worker_id": self.worker_id, "drain": drain},
        )
        self.stopped_remotely = True
        if drain:
            self.stop()
        else:
            self.stop_now()

    async def __aenter__(self) -> Consumer:
        """Returns once the change stream is open and the first fetch is done."""
        self._own_task_group = anyio.create_task_group()
        await self._own_task_group.__aenter__()
        try:
            await self._own_task_group.start(self._serve)
        except BaseException as exc:
            await self._own_task_group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._own_task_group is not None
        self.stop()
        return await self._own_task_group.__aexit__(exc_type, exc, tb)

    async def _serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        log.info(
            "consumer starting",
            extra={"action": "consumer_start", "worker_id": self.worker_id, "names": self.names},
        )
        try:
            async with anyio.create_task_group() as task_group:
                self._executor.bind(task_group)
                self._limiter.bind(task_group)
                await task_group.start(self._listener.run)  # the stream is open before the fetch
                await task_group.start(self._controls.serve_hub)  # controls watched before read
                await task_group.start(self._controls.limit_loop)  # limits known before the fetch
                await self.fetch()
                self._fetched = True
                task_group.start_soon(self._limiter.extend_loop)
                task_group.start_soon(self._executor.ping_loop)
                task_group.start_soon(self._recovery_loop)
                task_group.start_soon(self._controls.schedule_loop)
                await task_group.start(self._controls.pause_loop)
                claiming = anyio.CancelScope()
                claimed = anyio.Event()
                task_group.start_soon(self._claim_and_poll, claiming, claimed)
                await self._presence.start(task_group)  # listed among the live workers
                await task_group.start(
                    self._controls.stop_loop, self._presence, self._stop_remotely
                )
                task_status.started()
                await self._stop_requested.wait()
                claiming.cancel()
                await claimed.wait()  # a claim in flight has ended, its leases started
                await self._claimer.start_uncertain_claims()  # they too run or are released below
                await self._executor.shutdown()
                await self._limiter.drain()  # the slots of the runs that just ended are released
                task_group.cancel_scope.cancel()
        finally:
            await self._executor.stop_children()  # shielded: also when cancelled
        await self._presence.leave()
        log.info(
            "consumer stopped",
            extra={"action": "consumer_stop", "worker_id": self.worker_id},
        )

    async def _claim_and_poll(self, scope: anyio.CancelScope, claimed: anyio.Event) -> None:
        try:
            with scope:
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(self._claimer.run)
                    task_group.start_soon(self._listener.poll_loop)
        finally:
            claimed.set()

    # ------------------------------------------------------------ feeding the heap

    def _on_event(self, task: Task) -> None:
        self.stats.record("events", task.name)
        self._on_change(task)

    def _on_change(self, task: Task) -> None:
        self._executor.on_change(task)
        if task.dependents_notified is False and task.state.is_terminal:
            # Its writer tells the dependents in its next round trip (an event this consumer
            # sees too, which drops the check); if that has not happened a while later, the
            # writer died or lost the network: this consumer tells them.
            if task.key not in self._recovery_checks:
                due = self._clock.now() + dt.timedelta(seconds=_DEPENDENTS_GRACE_S)
                self._recovery_checks[task.key] = due
                self._recovery_wake.set()
        else:
            self._recovery_checks.pop(task.key, None)
        if self._limiter.ended_elsewhere(task):
            self._claimer.limit_freed(task.name)
        self.offer(task)

    def offer(self, task: Task) -> None:
        """A task in the heap at its next claim time (`claimer.Feed`)."""
        held = self._executor.held_runs
        when = self._limiter.offered(
            task, task.next_claim_for(self.worker_id, self._clock.now(), held)
        )
        self._presence.spread.offered(task.key, bool(task.options.specific_worker_ids))
        if self._heap.offer(task.key, when, task.version, task.id, task.name):
            self._claimer.wake()

    async def fetch(self) -> None:
        """Fill the heap with the tasks claimable soonest, one page of them (the next page is
        read once the heap drains, so a consumer's memory does not grow with the backlog);
        retried until the database answers."""
        tasks = await retrying(
            self._read_claimable,
            clock=self._clock,
            delay=self.options.reconnect_delay,
            logger=log,
            action="fetch_retry",
        )
        for task in tasks:
            self._on_change(task)  # when polling, the only way a running task's change is seen
        # Look again once the heap drains only if this fetch may have left some out *and* gave
        # the claimer something to do: a full fetch of tasks none of which we can claim now
        # (our own running ones, say) would otherwise be repeated back to back for ever.
        page = min(self.options.heap_size, self.options.fetch_batch_size)
        self._heap.overflowed = len(tasks) >= page and len(self._heap) > 0
        self._claimer.wake()

    async def _resync(self) -> None:
        """Told by the hub that events for this consumer were lost (it fell behind, or the
        stream lost its place): a page of the claimable tasks, and the tasks it runs, read by
        key. Invariant: every change of a running task reaches its executor, lost events
        included: a cancel, or new options that exclude this worker, is among them, and a
        page of the claimable tasks need not reach a running one (a backlog due sooner
        fills it)."""
        await self.fetch()
        keys = self._executor.running_keys
        if not keys:
            return
        tasks = await retrying(
            lambda: self._store.get_many(keys),
            clock=self._clock,
            delay=self.options.reconnect_delay,
            logger=log,
            action="fetch_retry",
        )
        for task in tasks:
            self._executor.on_change(task)

    async def _read_claimable(self) -> list[Task]:
        tasks = await self.claimable_soonest()
        await self._owed.recover()
        return tasks

    async def claimable_soonest(self) -> list[Task]:
        """The tasks we may claim, soonest first: one page (reading the whole heap's worth read
        thousands of tasks of a large backlog each time)."""
        limit = min(self.options.heap_size, self.options.fetch_batch_size)
        return await self._store.fetch(self.names, self.worker_id, limit, limit)

    def _wake_recovery(self) -> None:
        self._recovery_checks[""] = self._clock.now()  # "": owed by this process, now
        self._recovery_wake.set()

    async def _recovery_loop(self) -> None:
        """Dependents not told of a finished task are told without waiting for a restart:
        when this process failed to tell them (`services.dependents.OwedDependents`), and
        when a change event shows a finished task still ``dependents_notified: false`` after
        a grace period. Idle, it makes no call."""
        unlisten = self._owed.listen(self._wake_recovery)
        try:
            while True:
                self._recovery_wake = wake = anyio.Event()
                now = self._clock.now()
                due = min(self._recovery_checks.values(), default=None)
                if due is None or due > now:
                    await self._clock.wait_until(due, wake)
                    continue
                await retrying(
                    self._owed.recover,
                    clock=self._clock,
                    delay=self.options.reconnect_delay,
                    logger=log,
                    action="recovery_retry",
                )
                # Checks that came due by ``now`` are covered by this recovery; later ones
                # (a task that ended meanwhile) stay.
                self._recovery_checks = {k: t for k, t in self._recovery_checks.items() if t > now}
        finally:
            unlisten()

    # ------------------------------------------------------------ waking the claimer

    async def _limits(self) -> None:
        """Read our names' limits (`Controls.limit_loop`: at start and on each change): the
        due keys of a name whose limit changed are tried at once, whatever window they were
        waiting for (a removed or raised limit lets them start now); after the first fetch,
        a fetch notes the keys of a newly limited name (its tasks are claimed under tokens)."""
        changed = await self._limiter.refresh(self.names, self._executor.running_leases)
        if not changed:
            return
        now = self._clock.now()
        for key in self._heap.keys_of(changed):
            self._heap.nudge(key, now)
        self._claimer.wake()
        if self._fetched:
            await self.fetch()

    def slot_freed(self, key: str, written: bool) -> None:
        """`executor.FreedSlots`: the claimer decides what the freed slot makes due."""
        self._claimer.slot_freed(key, written)

    async def admit(self, due: list[str], now: dt.datetime) -> list[str]:
        """Of the due keys, those the claim policy lets this consumer claim now (`claimer.Feed`:
        the policy is `presence`'s)."""
        return await self._presence.admit(due, now)

    def claimed(self, asked: int, won: int, now: dt.datetime) -> None:
        """`claimer.Feed`: what the claim of the admitted keys won (the spread policy)."""
        self._presence.spread.claimed(asked, won, now)

    async def out_of_work(self, now: dt.datetime) -> dt.datetime | None:
        """`claimer.Feed`, asked with nothing running and nothing due in the heap (``burst`` or
        ``max_tasks``): stop, and return None, once ``max_tasks`` runs were started (and so
        have ended), or, with ``burst``, once a fresh read finds no task of our unpaused
        names that we may claim now (the heap, bounded and fed by events, may not hold every
        one). Otherwise the tasks claimable now go to the heap (held by a limit, they wait
        there for its window), and the claimer asks again after a poll interval unless a run
        starts or ends first.

        Invariant: the consumer stops only with no handler running and no claim in flight
        (the claimer asks only then, from its own loop), so it exits as a graceful stop does."""
        if self.options.max_tasks is not None and self._executor.started >= self.options.max_tasks:
            self._done_by_itself("max_tasks")
            return None
        if self.options.burst:
            due = await self._claimable_now(now)
            if not due:
                self._done_by_itself("burst")
                return None
            for task in due:
                self.offer(task)
        return now + dt.timedelta(milliseconds=self.options.poll_interval_ms)

    async def _claimable_now(self, now: dt.datetime) -> list[Task]:
        """The tasks of our unpaused names that we may claim at ``now``, of one page of those
        claimable soonest (read again, retried until the database answers)."""
        paused = self.paused
        names = [name for name in self.names if name not in paused]
        if not names:
            return []
        limit = min(self.options.heap_size, self.options.fetch_batch_size)
        tasks = await retrying(
            lambda: self._store.fetch(names, self.worker_id, limit, limit),
            clock=self._clock,
            delay=self.options.reconnect_delay,
            logger=log,
            action="fetch_retry",
        )
        held = self._executor.held_runs
        due = []
        for task in tasks:
            when = task.next_claim_for(self.worker_id, now, held)
            if when is not None and when <= now:
                due.append(task)
        return due

    def _done_by_itself(self, reason: str) -> None:
        self.done_by_itself = reason
        log.info(
            "consumer done by itself",
            extra={
                "action": "consumer_done",
                "worker_id": self.worker_id,
                "reason": reason,
                "runs": self._executor.started,
            },
        )
        self.stop()

    def observe(self, free_slots: int, due: bool) -> None:
        """`claimer.Feed`: the spread policy sees the claimer's free slots and due work."""
        self._presence.spread.observe(free_slots, due)
