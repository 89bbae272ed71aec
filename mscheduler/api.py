"""`Scheduler`: the public entry point. It owns the composition root (`services.root.Services`:
the `Store`, each capability a component of it, reached alike, and the process's services over
it) and, after `connect`, the client."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
from typing_extensions import Unpack

from .backends.uri import Connection, check_collection, open_collection, open_options
from .browse import Browse
from .clock import Clock, SystemClock
from .collection import TasksCollection
from .consumer.consumer import Consumer
from .consumer.group import numbered
from .consumer.group import running as group_running
from .consumer.handlers import Handler
from .consumer.owner import Owner
from .errors import ConfigurationError, WorkerNotLive
from .models import (
    ConnectParams,
    ErrorInfo,
    Lease,
    Limit,
    OwnParams,
    PublishParams,
    PublishResult,
    ScheduleParams,
    StatsRow,
    Task,
    TaskOptions,
    TaskParams,
    TaskState,
    WorkerInfo,
)
from .periodic import Schedule
from .services.root import Services
from .services.task_events import TaskEvents
from .specs import PublishSpec, Step, limit_spec, new_schedule, publish_spec
from .worker_options import Discovery, WorkerOptions


class Scheduler:
    """Publish, inspect and cancel tasks in one collection; build consumers of them.

    ``Scheduler(collection)`` wraps a collection you already have (pymongo's
    ``AsyncCollection`` or Motor's); `Scheduler.connect` opens one from a URI and closes it
    on `close` or at the end of ``async with``.
    """

    def __init__(self, collection: TasksCollection, *, clock: Clock | None = None) -> None:
        check_collection(collection)
        self.clock: Clock = clock or SystemClock()
        # The composition root: the store, then the process's services over it.
        self.services = Services(collection, self.clock)
        self.store = self.services.store
        self._owner = Owner(self.services)
        self._browse = Browse(self.store)
        self._connection: Connection | None = None

    @classmethod
    async def connect(cls, uri: str = "memory://", **params: Unpack[ConnectParams]) -> Scheduler:
        """Open ``uri`` and ensure the indexes, so a bad URI or an unreachable server fails
        here, within the server-selection timeout, rather than at the first publish. The
        options (``database``, ``collection``, ``clock``, ``server_selection_timeout_ms``):
        `models.ConnectParams`."""
        options = open_options(params, "connect")
        connection = await open_collection(uri, **options)
        scheduler = cls(connection.collection, clock=params.get("clock"))
        scheduler._connection = connection
        try:
            await scheduler.store.operations.ensure_indexes()
        except BaseException:
            await scheduler.close()
            raise
        return scheduler

    @property
    def collection(self) -> TasksCollection:
        return self.store.collection

    @property
    def browse(self) -> Browse:
        """The operator's reads of the queue (pages of tasks, names, dependents, paused
        names, finished counts): what a view of the queue needs beyond the methods here."""
        return self._browse

    async def close(self) -> None:
        """Close the client `connect` opened; a collection passed in is the caller's to close."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.close()

    async def __aenter__(self) -> Scheduler:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def ensure_indexes(self, *, finished_ttl: dt.timedelta | None = None) -> list[str]:
        """Create the indexes (idempotent). With ``finished_ttl``, also a TTL index that makes
        MongoDB delete finished tasks that long after they ended."""
        return await self.store.operations.ensure_indexes(finished_ttl=finished_ttl)

    async def index_information(self) -> dict[str, Any]:
        """The collection's indexes, as the driver describes them (name -> its spec: ``key``,
        the fields in order, and the options)."""
        return await self.store.index_information()

    async def in_use(self) -> bool:
        """Whether anything was ever written to this collection: a task, or a document
        beside the tasks (a schedule, a paused name, a limit, a worker, a remote stop). An
        empty collection nobody uses is most likely a mistyped database or collection name."""
        return await self.store.in_use()

    async def list_tasks(
        self, *, name: str | None = None, state: str | None = None, limit: int = 50
    ) -> list[Task]:
        """The newest tasks, optionally of one name and one state."""
        return await self.store.operations.list_tasks(name=name, state=state, limit=limit)

    async def retry(self, key: str, *, with_dependents: bool = False) -> PublishResult:
        """Run a failed or cancelled task again (same name, payload and options), keeping the
        attempts of its earlier runs (``Task.earlier_attempts``). ``with_dependents``: run
        again too the dependents its end cancelled (and theirs), named in ``revived``."""
        return await self.store.operations.retry(key, with_dependents=with_dependents)

    async def retry_failed(self, *, name: str | None = None) -> list[PublishResult]:
        """The dead-letter queue: run every failed task (of ``name``) again."""
        return await self.store.operations.retry_failed(name=name)

    async def purge(
        self, *, states: Sequence[str], older_than: dt.timedelta, dry_run: bool = False
    ) -> int:
        """Delete finished tasks of ``states`` that ended more than ``older_than`` ago (with
        ``dry_run``, count them instead)."""
        return await self.store.operations.purge(states, older_than, dry_run=dry_run)

    async def publish(
        self, key: str, payload: Any = None, *, name: str, **params: Unpack[PublishParams]
    ) -> PublishResult:
        """Publish a task, idempotently by ``key``: an existing key returns the existing task
        (``created=False``) and changes nothing, unless ``update_payload`` (a task not running
        gets the new payload) or ``replace_finished`` (a finished task is published anew:
        ``True``, or only in the finished states named, e.g. ``("fail", "cancelled")``). A
        running task is never replaced: `TaskRunning`. ``delay`` (a timedelta or seconds)
        sets ``not_before`` to that long from now; a fixed time is ``options.not_before``.
        ``debounce`` (the same): start that long from now, and a publish of the key again
        before it started gives it the new payload and pushes its start back
        (``payload_updated``), so a burst of publishes makes one run, with the last payload."""
        spec = publish_spec(key, payload, name=name, now=self.store.clock.now(), **params)
        return await self.store.publisher.publish(spec)

    async def publish_many(
        self, specs: Step | Iterable[Step], *, allow_missing: bool = False
    ) -> list[PublishResult]:
        """Publish many tasks, all or nothing: specs, or structures from `chain`, `group`
        and `chord`. Dependencies inside the batch are written in order; any invalid spec,
        missing dependency or cycle raises before anything is written. Each key is
        idempotent, as with `publish`."""
        return await self.store.batches.publish_many(specs, allow_missing=allow_missing)

    async def replace(
        self, key: str, payload: Any = None, *, name: str, **params: Unpack[TaskParams]
    ) -> PublishResult:
        """Publish ``key`` anew over a task that is not running (as if it were cancelled and
        published again); a running task raises `TaskRunning`. The options (``options``,
        ``depends_on``, ``allow_missing``): `models.TaskParams`."""
        spec = PublishSpec.of(key, payload, name=name, **params)
        return await self.store.publisher.replace(spec)

    async def commit(
        self,
        *,
        complete: Iterable[Lease | tuple[Lease, Any]] = (),
        publish: Step | Iterable[Step] = (),
        delete: Iterable[str] = (),
        require: Mapping[str, int] | None = None,
    ) -> list[PublishResult]:
        """In one transaction: require that other tasks are still at the given ``version``,
        finish the worker's own tasks (``(lease, result)``, fenced by run_id; a handler gets
        its lease from `current_lease()`), delete tasks, then publish tasks.
        `PreconditionFailed` or `LeaseLost` write nothing, and so does `TaskRunning`: a
        running task is never deleted (nor deleted and published again), unless it runs only
        by the leases this commit completes."""
        return await self.store.batches.commit(
            complete=complete, publish=publish, delete=delete, require=require
        )

    async def get(self, key: str) -> Task | None:
        return await self.store.operations.get(key)

    async def own(self, names: Sequence[str], **params: Unpack[OwnParams]) -> list[Lease]:
        """Claim up to ``max_tasks`` tasks of ``names`` for ``worker_id``, best first (priority,
        then age), under every rule a consumer's claim follows (``not_before``, dependencies,
        ``specific_worker_ids``, ``concurrent_worker_cnt``, retries, paused names, ``rate``
        and ``max_running`` limits), in one batched claim. Each lease lasts ``lease`` (a
        timedelta or seconds; the task's ``worker_timeout_ms`` by default) unless extended,
        and holds its name's limit slot until it ends or expires. End each with `succeed`,
        `fail` or `release`. ``wait``: when none is claimable, wait up to that long for one
        (woken by the process's discovery hub, by a control change: one made here, or one
        made elsewhere, which the wait follows, and when the first task it may claim is due);
        ``[]`` after it. The options: `models.OwnParams`."""
        return await self._owner.own(names, **params)

    @contextlib.asynccontextmanager
    async def following_controls(self) -> AsyncIterator[None]:
        """For the block, this process follows the paused names and limits as they change
        (through its discovery hub, or a poll where the server has no change streams), so
        `own` reads none of them per claim: what a long-lived process that owns tasks without
        a consumer (the HTTP API's server) holds while it serves. A process whose consumers
        run follows them already."""
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(self.services.control_hub.serve, WorkerOptions())
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()

    async def extend(self, lease: Lease, length: dt.timedelta | float | None = None) -> Lease:
        """The lease extended to ``length`` from now (the task's ``worker_timeout_ms`` by
        default), with its limit slot; `LeaseLost` when it expired, was taken over, or the
        task ended. Use the lease returned from then on."""
        return await self._owner.extend(lease, length)

    async def succeed(self, lease: Lease, result: Any = None) -> Task:
        """The attempt succeeded, with ``result`` stored (fenced by the run_id: `LeaseLost`)."""
        return await self._owner.succeed(lease, result)

    async def fail(self, lease: Lease, error: BaseException | ErrorInfo | str) -> Task:
        """The attempt failed: the task is retried by its rules (``max_unexpected_retries``,
        after ``unexpected_retry_delay_ms``), else fails. Fenced: `LeaseLost`."""
        return await self._owner.fail(lease, error)

    async def release(self, lease: Lease) -> Task:
        """Hand the task back unrun: claimable at once, and no attempt counted. Fenced:
        `LeaseLost`."""
        return await self._owner.release(lease)

    async def find_lease(self, key: str, *, worker_id: str, run_id: str) -> Lease:
        """The live lease ``worker_id`` holds on ``key`` under ``run_id`` (one read), for a
        worker that kept only those three; `LeaseLost` when it is gone."""
        return await self._owner.find(key, worker_id=worker_id, run_id=run_id)

    def consumer(
        self, handlers: Mapping[str, Handler], *, options: WorkerOptions | None = None
    ) -> Consumer:
        """A consumer that runs ``handlers`` (task name → ``async def handler(task)``, or a
        plain ``def``, run in a worker thread; or an `ms.Handlers` registry); the return value
        is stored as the result. Start it with ``await consumer.run()`` or
        ``async with consumer:``; several at once with `consumers`."""
        return Consumer(self.services, handlers, options)

    @contextlib.asynccontextmanager
    async def consumers(
        self,
        handlers: Mapping[str, Handler],
        *,
        count: int = 1,
        options: WorkerOptions | None = None,
    ) -> AsyncIterator[list[Consumer]]:
        """Run ``count`` consumers of ``handlers`` in one task group; entered once all of them
        listen, left once all of them stopped (gracefully, as `Consumer.stop`). Their worker
        ids are ``options.worker_id`` followed by ``-1``, ``-2``, ... when ``count`` > 1."""
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise ConfigurationError(f"count: expected an integer from 1 to 1000, got {count!r}")
        each = numbered(options or WorkerOptions(), count)
        group = [self.consumer(handlers, options=one) for one in each]
        async with group_running(group) as started:
            yield started

    async def add_dependencies(self, edges: Sequence[tuple[str, str]]) -> list[Task]:
        """Make existing tasks wait: each ``(before, after)`` makes ``after`` depend on
        ``before``. Refused (nothing written) if an ``after`` started or finished, a key is
        missing, or an edge would close a cycle."""
        return await self.store.operations.add_dependencies(edges)

    async def set_options(self, key: str, options: TaskOptions) -> Task | None:
        """Replace the options of a task that has not finished (None if it has). Running
        workers no longer in ``specific_worker_ids`` stop and give the task back."""
        return await self.store.operations.set_options(key, options)

    async def wait(
        self,
        key: str,
        timeout: float | None = None,  # noqa: ASYNC109 - the API, on the injectable clock
        *,
        missing_ok: bool = False,
        discovery: Discovery = "auto",
        poll_interval_ms: int = 1_000,
    ) -> Task:
        """The task once it is terminal (success, fail or cancelled), from the change stream.
        `TimeoutError` after ``timeout`` seconds (0: look once; a negative one is refused,
        `ConfigurationError`); `TaskNotFound` if no task has the key,
        unless ``missing_ok`` (then a task that a flow will publish is waited for). Where the
        server refuses a change stream, ``discovery="auto"`` polls every ``poll_interval_ms``
        (as `WorkerOptions.discovery`)."""
        found = await self.wait_many(
            [key],
            timeout,
            missing_ok=missing_ok,
            discovery=discovery,
            poll_interval_ms=poll_interval_ms,
        )
        return found[key]

    async def wait_many(
        self,
        keys: Sequence[str],
        timeout: float | None = None,  # noqa: ASYNC109 - the API, on the injectable clock
        *,
        missing_ok: bool = False,
        discovery: Discovery = "auto",
        poll_interval_ms: int = 1_000,
    ) -> dict[str, Task]:
        """Every task of ``keys`` once terminal, in the order given (see `wait`)."""
        return await self.services.waiting.wait(
            keys,
            timeout=timeout,
            missing_ok=missing_ok,
            discovery=discovery,
            poll_interval_ms=poll_interval_ms,
        )

    async def schedule(
        self, schedule_id: str, *, name: str, **params: Unpack[ScheduleParams]
    ) -> Schedule:
        """A periodic task: a ``name`` task every ``every``, or at each time of the ``cron``
        expression in ``timezone`` (DST-correct). Consumers of ``name`` publish each
        occurrence as the task ``<schedule_id>@<time>``, so many workers make it once.
        ``skip_if_running``: no occurrence while the previous one has not ended.
        ``catch_up`` after downtime: ``latest`` runs the last missed occurrence, ``all`` each
        one, ``none`` none. ``jitter``: each start is delayed by up to that much. The same
        id again changes nothing if the schedule is the same, and keeps its state (last
        occurrence, anchor, next occurrence) as far as a change allows (`reregistered`)."""
        # the spec: checked here, stored whole
        schedule = new_schedule(schedule_id, name=name, now=self.store.clock.now(), **params)
        return await self.store.schedules.put(schedule)

    async def schedules(self, *, names: Sequence[str] | None = None) -> list[Schedule]:
        return await self.store.schedules.all(names)

    async def unschedule(self, schedule_id: str) -> bool:
        """Remove a schedule (its tasks already published stay). False if there was none."""
        return await self.store.schedules.remove(schedule_id)

    async def pause(self, name: str, reason: str = "") -> bool:
        """Consumers stop claiming tasks of ``name`` (within a moment on a change stream, one
        poll interval otherwise); running ones finish. False if it was paused already."""
        changed = await self.store.pauses.pause(name, reason)
        self._owner.controls.forget()
        return changed

    async def resume(self, name: str) -> bool:
        """Claiming ``name`` again; False if it was not paused."""
        changed = await self.store.pauses.resume(name)
        self._owner.controls.forget()
        return changed

    async def paused(self) -> dict[str, dt.datetime]:
        """The paused names, with when each was paused."""
        return await self.store.pauses.paused()

    async def set_limit(
        self,
        name: str,
        *,
        rate: int | None = None,
        per: dt.timedelta | None = None,
        max_running: int | None = None,
        partition_max_running: int | None = None,
    ) -> Limit:
        """Limit ``name`` across every worker: at most ``rate`` starts in any window of
        ``per`` (a sliding window, of handler starts), at most ``max_running`` running at
        once, and at most ``partition_max_running`` running at once in each partition of it
        (`TaskOptions.partition`). A token taken atomically before each claim of the name
        holds its start until the handler starts, from when it counts; a consumer at the
        limit sleeps until the window frees. Setting it again replaces the limits."""
        spec = limit_spec(
            name,
            rate=rate,
            per=per,
            max_running=max_running,
            partition_max_running=partition_max_running,
        )
        limit = await self.store.limits.set(spec)
        self._owner.controls.forget()
        return limit

    async def remove_limit(self, name: str) -> bool:
        changed = await self.store.limits.remove(name)
        self._owner.controls.forget()
        return changed

    async def limits(self) -> dict[str, Limit]:
        return await self.store.limits.of()

    async def stats(self) -> list[StatsRow]:
        """Task counts by name and state (one aggregation), with the running attempts, the
        live workers serving the name, whether it is paused, and the oldest pending's age."""
        return await self.store.operations.stats()

    async def workers(self, *, names: Sequence[str] | None = None) -> list[WorkerInfo]:
        """The consumers registered (serving any of ``names``), live ones first; one that
        died without stopping is listed with ``alive=False`` until a day later."""
        return await self.store.workers.all(names)

    async def stop_worker(self, worker_id: str, *, drain: bool = True) -> WorkerInfo:
        """Ask the live worker ``worker_id`` to stop, wherever it runs: it claims nothing more
        (within a moment on a change stream, one poll interval otherwise), then with ``drain``
        lets its running tasks finish within its ``shutdown_grace_ms``, without it releases
        them for other workers at once; then its run ends (`Consumer.wait_stopped` returns,
        ``mscheduler worker`` exits 0). Carried like a pause, so a lost signal arrives within
        ``schedule_refresh_ms``; calling again is safe (``drain=False`` hurries a draining
        stop). The stop is for the worker as it runs now: one that restarts later under the
        same id is not stopped. Returns the entry of the worker told to stop; raises
        `WorkerNotLive`, changing nothing, when no live worker has the id (and
        `ConfigurationError` for a worker of a release that reads no stop)."""
        worker = await self.store.workers.get(worker_id)
        if worker is None or not worker.alive:
            raise WorkerNotLive(f"no live worker has the id {worker_id!r}")
        if not worker.instance:  # its entry names no run: it reads no stop (an older release)
            raise ConfigurationError(
                f"worker {worker_id!r} runs a release of mscheduler without remote stop"
            )
        await self.store.stops.request(worker, drain)
        return worker

    def watch(self, *, names: Sequence[str] | None = None) -> AsyncIterator[Task]:
        """Every change to a task (of ``names``) as it happens: through the process's
        discovery hub while its consumers or a waiter run it, else from a change stream (or
        poll) of its own. Closing the iterator, or dropping it, unsubscribes it."""
        return self.services.waiting.watch(names)

    def events(
        self, names: Sequence[str] | None = None, *, poll_interval_ms: int = 1_000
    ) -> TaskEvents:
        """What happens to tasks (of ``names``), by any process: an async iterator of
        `TaskEvent` s (published, started, progress, succeeded, failed, cancelled), in the
        order written for each task, from its first step on. Derived from the writes the
        process's discovery hub hears of (its change stream, or its poll every
        ``poll_interval_ms`` at most where the server has none): no stream of their own. On a
        poll some versions go unseen; their events are derived from the newest one (see
        docs/guides/events.md). Closing the iterator, or dropping it, unsubscribes it.

        ``async with sched.events() as events:`` holds the hub for the block (from its start):
        iterated bare, a listener alone in its process reopens the stream after each wait."""
        if not isinstance(poll_interval_ms, int) or poll_interval_ms < 10:
            raise ConfigurationError(f"poll_interval_ms: {poll_interval_ms!r} is not an int >= 10")
        return TaskEvents(self.store, self.services.task_hub, names, poll_interval_ms)

    async def cancel(self, key: str, reason: str = "cancelled") -> bool:
        """Cancel a task that has not finished: True if this call cancelled it, False if it
        had already ended; `TaskNotFound` if no task has the key. Running workers lose their
        lease: their next ping fails and their handlers are cancelled."""
        return await self.store.operations.cancel(key, reason)

    async def cancel_many(
        self,
        *,
        name: str,
        states: Sequence[str | TaskState] = ("pending", "blocked"),
        reason: str = "cancelled",
    ) -> int:
        """Cancel every task of ``name`` in one of ``states``, and return how many were
        cancelled. Running tasks only when ``"running"`` is named (their handlers are then
        cancelled, as by `cancel`); a finished state is refused. Dependents are told as after
        `cancel` (by default a dependent of a cancelled task is cancelled too)."""
        return await self.store.operations.cancel_many(name, states, reason)
