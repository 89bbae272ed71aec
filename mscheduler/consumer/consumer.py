"""`Consumer`: runs handlers for tasks of some names, in one anyio task group. It builds its
parts and wires them once, each to the narrow collaborators it needs (never to the consumer),
then runs their loops and, at a stop, their shutdown in order.

- listener (`listener.py`): the process's discovery hub's events of the consumer's names,
  handed to the intake; a resync reads again what may have been lost.
- intake (`intake.py`): each task heard or read → executor (a running task's change), limiter
  (a run ended elsewhere), claimer (its heap); the fetch of the tasks claimable first: at
  start (after the stream is open), after an unresumable stream loss, when the heap drained
  after overflowing, and on every poll interval when the server has no change streams; with a
  stream, one page of them every ``backstop_interval_ms`` (`ChangeListener.poll_loop`); and the
  dependents a finished task's writer did not tell.
- claimer (`claimer.py`): owns the heap (next-claim time per key) and the claim policy
  (`spread.py`); while a slot is free and something is due, claims the best tasks of its
  names (server-side: priority, then age), a limited name's under a token (`limits.py`);
  puts back what was not claimable; recovers claims whose replies were lost; stops a
  ``burst`` or ``max_tasks`` consumer whose work is done.
- executor (`executor.py`): handlers, local retries, one bulk ping per interval, finish; each
  freed slot back to the claimer.
- presence (`presence.py`): the live workers entry, and the peer counts of the claim policy.
- controls (`controls.py`): schedules, expiry (idle, 3 reads a minute); paused names,
  limits, schedules and a remote stop (`Scheduler.stop_worker`), re-read on each change the
  process's `ControlHub` sees (one stream, or one read of a version per poll interval, for
  all the consumers of a `Scheduler`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import TracebackType

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..errors import ConfigurationError
from ..services.root import Services
from ..worker_options import WorkerOptions
from .claimer import Claimer
from .controls import Controls
from .executor import Executor
from .handlers import Handler, handler_specs
from .intake import Intake
from .limits import Limiter
from .listener import ChangeListener
from .presence import Presence
from .stats import ConsumerStats
from .stopping import Stopping

log = logging.getLogger(__name__)


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
        clock = services.clock
        self._stopping = Stopping()
        self.stopped_remotely = False  # the stop came from `Scheduler.stop_worker`
        self._own_task_group: TaskGroup | None = None
        # Each part is built once, on the parts it needs; the executor is told where freed
        # slots go (the claimer, built on its slots) as it is bound, at start.
        self._limiter = Limiter(store)
        self._executor = Executor(
            store, self._specs, self.options, clock, self.stats, gate=self._limiter
        )
        self._controls = Controls(services, self.names, self.options)
        self._claimer = Claimer(
            store.tasks,
            store,
            store.workers,
            self._executor,
            self._limiter,
            self._controls,
            self._stopping,
            names=self.names,
            options=self.options,
            clock=clock,
            stats=self.stats,
        )
        self._presence = Presence(
            store, self.names, self.options, self._executor, self._claimer.spread
        )
        self._intake = Intake(
            store,
            services.owed,
            self._claimer,
            self._executor,
            self._limiter,
            names=self.names,
            options=self.options,
            clock=clock,
            stats=self.stats,
        )
        self._listener = ChangeListener(
            services.task_hub, self.names, self.options, clock, self._intake
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
        return self._stopping.requested.is_set()

    @property
    def done_by_itself(self) -> str | None:
        """Why it stopped by itself (``burst``: nothing left; ``max_tasks``), else None."""
        return self._stopping.done_by_itself

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
        """Return once the consumer has stopped: after a stop (`stop`, `stop_now`, a remote
        stop, or its work done by itself), every running handler has ended and its outcome
        is written (or its lease released), and it left the live workers. Also when its run
        was cancelled (a hard stop: the leases it held are left to expire)."""
        await self._stopping.stopped.wait()

    async def wait_stop_requested(self) -> None:
        """Return once a stop was asked for (`stop`, `stop_now`, a remote stop, or its work
        done by itself): the shutdown then follows (`wait_stopped` waits for its end)."""
        await self._stopping.requested.wait()

    def stop(self) -> None:
        """Stop claiming, let running handlers finish within the grace period, release the rest."""
        self._stopping.request()

    def stop_now(self) -> None:
        """Stop claiming and cancel every running handler at once, releasing its lease (within
        about two seconds, or the lease is left to expire): another worker claims the task at
        once, and no failure is counted. A sync handler that ignores its cancellation still
        gets ``cancel_timeout_ms`` before it is abandoned."""
        self._stopping.request()
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
        try:
            await self._run_parts(task_status)
        finally:
            self._stopping.stopped.set()  # `wait_stopped`: also when cancelled

    async def _run_parts(self, task_status: TaskStatus[None]) -> None:
        """Start the parts' loops in order; at a stop, shut them down in order: every
        outcome is written (or its lease released) before this returns."""
        log.info(
            "consumer starting",
            extra={"action": "consumer_start", "worker_id": self.worker_id, "names": self.names},
        )
        try:
            async with anyio.create_task_group() as task_group:
                self._executor.bind(task_group, self._claimer)
                self._limiter.bind(task_group)
                await task_group.start(self._listener.run)  # the stream is open before the fetch
                await task_group.start(self._controls.serve_hub)  # controls watched before read
                # The limits are known before the fetch.
                await task_group.start(self._controls.limit_loop, self._intake.limits)
                await self._intake.first_fetch()
                task_group.start_soon(self._limiter.extend_loop)
                task_group.start_soon(self._executor.ping_loop)
                task_group.start_soon(self._intake.recovery_loop)
                task_group.start_soon(self._controls.schedule_loop)
                await task_group.start(self._controls.pause_loop, self._intake.fetch)
                claiming = anyio.CancelScope()
                claimed = anyio.Event()
                task_group.start_soon(self._claim_and_poll, claiming, claimed)
                await self._presence.start(task_group)  # listed among the live workers
                await task_group.start(
                    self._controls.stop_loop, self._presence, self._stop_remotely
                )
                task_status.started()
                await self._stopping.requested.wait()
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
                    task_group.start_soon(self._claimer.run, self._intake)
                    task_group.start_soon(self._listener.poll_loop)
        finally:
            claimed.set()
