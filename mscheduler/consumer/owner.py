"""The pull API (`Scheduler.own`, ``extend``, ``succeed``, ``fail``, ``release``): a worker
that drives the loop itself claims, extends and finishes leases through the consumer's own
claim, under the same rules.

A call of `Owner.own` is one round of the consumer's claim path (`claimer.Claimer`): the
paused names are left out, the names without a limit are claimed in one batched claim
(`TaskStore.claim_many`: three round trips for any number of tasks, one for a single task),
and a limited name's tasks through the one claim core (`limits.Limiter`), as a consumer's
are. What differs is where the state lives:

- A lease owned here holds its limit slot until it ends or expires, without a process that
  keeps it: the slot's token *is* the lease's ``run_id`` (as every slot's is) and the slot
  lives as long as the lease, bound to it as the lease is handed out (`Limiter.handed_out`).
  `Owner.extend` extends both; an end frees the slot by the run_id. Any process can
  therefore end a lease another one owned (the HTTP API's workers come back to any server),
  and a worker that vanishes leaves a slot that lapses with its lease.
- Whether a lease holds a slot is never decided from the limits as this process knows them
  (a limit removed meanwhile, set again, or set while it ran, by any process:
  `store.limits.set` adopts the running attempts, and a process hears of it only later):
  every lease's slot is extended and freed by its run_id, a write that touches no one
  else's (and no document for a name never limited).
- The paused names and the limits are read at each call, or taken from `ControlView`, which
  keeps them while the process's `ControlHub` watches (a consumer, the HTTP server, or a
  waiting `own` runs it), exactly as a consumer keeps them: a change is in effect within one
  event or one poll interval, and one made through this process at once.
- A waiting `own` wakes at each write its names' tasks see, at each control change, and at
  the soonest time a task of its names that is not paused becomes claimable, a limited
  name's not before its limit frees (`Limiter.offered`, as a consumer's heap has it).

Invariant: every lease won is returned, whatever fails after it (a lease nobody knows of
would expire unrun and count as an attempt).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
from typing_extensions import Unpack

from ..constants import MAX_TASKS
from ..errors import BackendUnavailable, ConfigurationError, LeaseLost
from ..liveness import lease_is_live
from ..models import (
    ErrorInfo,
    Lease,
    Limit,
    OwnParams,
    Task,
    check_name,
    check_params,
    check_worker_id,
    checked,
)
from ..services.discovery import Subscription
from ..services.root import Services
from ..worker_options import WorkerOptions
from . import takeover
from .claimable import next_claim_for
from .limits import Limiter

log = logging.getLogger(__name__)

# The tasks a waiting `own` reads to know when the first it may claim is due: those of its
# names neither paused nor at their limit, soonest first (a page, not one: the soonest may be
# claimable now by the read's rules and taken by another worker meanwhile).
_SOONEST_PAGE = 16
_MIN_LEASE = dt.timedelta(milliseconds=1)
_LONGEST_LEASE = dt.timedelta(days=7)


class ControlView:
    """The paused names and the limits of the names asked about, kept while the process's
    `ControlHub` watches (read again after each change it sees), else read at each call."""

    def __init__(self, services: Services) -> None:
        self._store = services.store
        self._hub = services.control_hub
        self._version = -1
        self._paused: dict[str, bool] = {}
        self._limits: dict[str, Limit | None] = {}
        # Each waiter's own event, set by the next write (as `ControlHub.changed` gives each
        # its own): an event serves the loop it was first waited in, and a blocking client
        # runs each call in a loop of its own.
        self._writes: set[anyio.Event] = set()

    def forget(self) -> None:
        """This process wrote a control: read them again at the next call, not at the hub's
        event (a claim right after a pause made here must see it), and wake the waiting
        owners (a resume made here is heard at once, whether or not a hub watches)."""
        self._version = -1
        self._paused.clear()
        self._limits.clear()
        writes, self._writes = self._writes, set()
        for written in writes:
            written.set()

    @contextlib.contextmanager
    def next_write(self) -> Iterator[anyio.Event]:
        """An event of the caller's own, set by the next control write made through this
        process while the block runs."""
        written = anyio.Event()
        self._writes.add(written)
        try:
            yield written
        finally:
            self._writes.discard(written)

    def _current(self) -> bool:
        """Whether what is kept is still true: the hub watches and saw no change since."""
        if not self._hub.ready.is_set():
            self._paused.clear()
            self._limits.clear()
            return False
        if self._hub.version != self._version:
            self._paused.clear()
            self._limits.clear()
            self._version = self._hub.version
        return True

    async def paused(self, names: Sequence[str]) -> set[str]:
        version, keep = self._hub.version, self._current()
        missing = [name for name in names if name not in self._paused]
        if missing:
            found = await self._store.pauses.paused(missing)
            if keep and self._hub.version == version:  # no change during the read
                self._paused.update((name, name in found) for name in missing)
            else:
                return {name for name in names if name in found or self._paused.get(name)}
        return {name for name in names if self._paused[name]}

    async def limits(self, names: Sequence[str]) -> dict[str, Limit]:
        version, keep = self._hub.version, self._current()
        missing = [name for name in names if name not in self._limits]
        found: dict[str, Limit] = {}
        if missing:
            found = await self._store.limits.of(missing)
            if keep and self._hub.version == version:
                self._limits.update((name, found.get(name)) for name in missing)
        kept = {name: self._limits.get(name) for name in names if name not in found}
        return {**found, **{name: limit for name, limit in kept.items() if limit is not None}}


def _timedelta(value: Any, field: str, *, minimum: dt.timedelta) -> dt.timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or not minimum <= value <= _LONGEST_LEASE:
        raise ConfigurationError(
            f"{field}: expected a timedelta (or seconds) from {minimum} to {_LONGEST_LEASE}, "
            f"got {value!r}"
        )
    return value


class Owner:
    """The pull API over one store. Stateless across calls: any process may extend or end a
    lease another one owned."""

    def __init__(self, services: Services) -> None:
        self._store = services.store
        self._task_hub = services.task_hub
        self._control_hub = services.control_hub
        self._clock = services.clock
        self.controls = ControlView(services)
        # The one claim core, as a consumer's claimer uses it; it holds no lease (a pull
        # lease is its worker's: `handed_out`, `extend`, its end).
        self._limiter = Limiter(services.store)

    async def own(self, names: Sequence[str], **params: Unpack[OwnParams]) -> list[Lease]:
        """`Scheduler.own`: its options (`OwnParams`) read here, with their defaults."""
        check_params(params, OwnParams, "own")
        if "worker_id" not in params:  # `Required` there: the type checker refuses it too
            raise TypeError("own() missing the required keyword argument 'worker_id'")
        worker_id = params["worker_id"]
        max_tasks = params.get("max_tasks", 1)
        lease = params.get("lease")
        wait = params.get("wait")
        if isinstance(names, str) or not names:
            raise ConfigurationError("names: expected a non-empty list of task names")
        names = list(dict.fromkeys(checked(check_name, name) for name in names))
        worker_id = checked(check_worker_id, worker_id)
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int):
            raise ConfigurationError(f"max_tasks: expected an integer, got {max_tasks!r}")
        if not 1 <= max_tasks <= MAX_TASKS:
            raise ConfigurationError(f"max_tasks: expected 1 to {MAX_TASKS}, got {max_tasks}")
        length = None if lease is None else _timedelta(lease, "lease", minimum=_MIN_LEASE)
        waited = None if wait is None else _timedelta(wait, "wait", minimum=dt.timedelta(0))
        leases, _ = await self._claim(names, worker_id, max_tasks, length)
        if leases or not waited:
            return leases
        return await self._wait(names, worker_id, max_tasks, length, self._clock.now() + waited)

    async def _wait(
        self,
        names: list[str],
        worker_id: str,
        max_tasks: int,
        length: dt.timedelta | None,
        deadline: dt.datetime,
    ) -> list[Lease]:
        """Claim again now, on each write the process's hub says may give work on
        ``names`` (as a consumer hears of it), on each control change (a resume, a limit
        raised: made through this process, or seen by its control hub, which this wait runs
        if nothing else in the process does), and at the times nothing announces: when the
        first task it may claim is due; ``[]`` at ``deadline``. Subscribed before the first
        claim, so a task published meanwhile is not missed."""
        subscription = Subscription(WorkerOptions(), wakes=names)
        hub = self._control_hub
        async with (
            self._task_hub.subscription(subscription),
            anyio.create_task_group() as task_group,
        ):
            # A pull-only process hears control changes made elsewhere while it waits.
            task_group.start_soon(functools.partial(hub.serve, WorkerOptions()))
            try:
                while True:
                    seen = hub.version
                    with self.controls.next_write() as written:  # none missed
                        leases, freed = await self._claim(names, worker_id, max_tasks, length)
                        if leases:
                            return leases
                        now = self._clock.now()
                        if now >= deadline:
                            return []
                        soonest = await self._soonest(names, worker_id, now)
                        wake_at = min(t for t in (deadline, freed, soonest) if t is not None)
                        await self._until_event(subscription, seen, written, wake_at)
            finally:
                task_group.cancel_scope.cancel()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _soonest(
        self, names: list[str], worker_id: str, now: dt.datetime
    ) -> dt.datetime | None:
        """When the first task that ``worker_id`` may claim of ``names`` becomes due, of those
        no write will announce (a ``not_before``, a retry delay, a lease that expires): of
        the names neither paused nor at their limit (whose freeing is the claim's to say),
        each task not before its name's limit frees (`Limiter.offered`)."""
        paused = await self.controls.paused(names)
        free = [
            name
            for name in names
            if name not in paused and self._limiter.blocked_until(name, now) is None
        ]
        if not free:
            return None
        soonest: dt.datetime | None = None
        for task in await self._store.fetch(free, worker_id, _SOONEST_PAGE, _SOONEST_PAGE):
            when = self._limiter.offered(task, next_claim_for(task, worker_id, now))
            if when is not None and when > now and (soonest is None or when < soonest):
                soonest = when
        return soonest

    async def _until_event(
        self, subscription: Subscription, seen: int, written: anyio.Event, until: dt.datetime
    ) -> None:
        wake = anyio.Event()
        async with anyio.create_task_group() as task_group:

            async def heard() -> None:
                await subscription.next()
                while subscription.pending:  # one claim answers every event heard so far
                    await subscription.next()
                wake.set()

            async def controls_changed() -> None:
                await self._control_hub.changed(seen)
                wake.set()

            async def written_here() -> None:
                await written.wait()
                wake.set()

            task_group.start_soon(heard)
            task_group.start_soon(controls_changed)
            task_group.start_soon(written_here)
            await self._clock.wait_until(until, wake)
            task_group.cancel_scope.cancel()

    async def _claim(
        self, names: list[str], worker_id: str, max_tasks: int, length: dt.timedelta | None
    ) -> tuple[list[Lease], dt.datetime | None]:
        """Up to ``max_tasks`` leases, and when a limit that refused a claim frees."""
        paused = await self.controls.paused(names)
        active = [name for name in names if name not in paused]
        limits = await self.controls.limits(active) if active else {}
        await self._limiter.apply(active, limits)
        plain = [name for name in active if name not in limits]
        leases: list[Lease] = []
        freed: dt.datetime | None = None
        try:
            until = None if length is None else self._clock.now() + length
            while plain and len(leases) < max_tasks:
                asked = max_tasks - len(leases)
                won = await self._store.tasks.claim_many(
                    worker_id,
                    names=plain,
                    limit=asked,
                    exclude_keys=[lease.key for lease in leases],
                    until=until,
                )
                for lease in won:
                    lease._slot = ""  # a name without a limit: no slot taken
                leases += won
                # Fewer than three are claimed one per round trip (`claim_many`): go on
                # while each wins one; a batch that won fewer found no more.
                if len(won) < (1 if asked < 3 else asked):
                    break
            for name in (name for name in active if name in limits):
                if len(leases) >= max_tasks:
                    break
                blocked = await self._limiter.claim_up_to(
                    worker_id, name, max_tasks - len(leases), [], leases, pulled=True, length=length
                )
                if blocked is not None:
                    freed = blocked if freed is None else min(freed, blocked)
        except BackendUnavailable as exc:
            if not leases:
                raise
            log.warning(str(exc), extra={"action": "own_partial", "leases": len(leases)})
        finally:
            # As the leases go to their worker, who starts at once: their starts count from
            # now, their slots live as long as they do.
            for name in limits:
                await self._limiter.handed_out(name, [ls for ls in leases if ls._slot == name])
        for lease in leases:
            takeover.report(lease)
        return leases, freed

    async def extend(self, lease: Lease, length: dt.timedelta | float | None = None) -> Lease:
        """The lease extended by ``length`` from now (else its task's ``worker_timeout_ms``),
        its limit slot with it; `LeaseLost` when it is gone."""
        until = None
        if length is not None:
            until = self._clock.now() + _timedelta(length, "lease", minimum=_MIN_LEASE)
        try:
            task = await self._store.tasks.ping(lease, until)
        except LeaseLost:
            # Cancelled, deleted or taken over: the run is over, so is its slot (a taken over
            # one lapsed already; a cancelled task's would block its name until the lease's end).
            await self._free_slot(lease)
            raise
        extended = Lease(key=lease.key, worker_id=lease.worker_id, run_id=lease.run_id, task=task)
        extended._slot = lease._slot
        expires = extended.ping_expire_at
        if expires is not None:
            await self._limiter.extend_slot(lease, expires)
        return extended

    async def succeed(self, lease: Lease, result: Any = None) -> Task:
        try:
            return await self._store.tasks.succeed(lease, result)
        finally:
            await self._free_slot(lease)

    async def fail(self, lease: Lease, error: BaseException | ErrorInfo | str) -> Task:
        """An attempt failed: retried by the task's rules (``max_unexpected_retries``, after
        ``unexpected_retry_delay_ms``)."""
        if isinstance(error, str):
            error = ErrorInfo.from_message("Error", error)
        try:
            return await self._store.tasks.fail(lease, error)
        finally:
            await self._free_slot(lease)

    async def release(self, lease: Lease, reason: str = "released by the worker") -> Task:
        """Handed back unrun: claimable at once, no attempt counted."""
        try:
            return await self._store.tasks.release(lease, reason)
        finally:
            await self._free_slot(lease)

    async def _free_slot(self, lease: Lease) -> None:
        """The run ended (or its lease is gone): its slot, if it holds one, frees, whatever
        the limits say now or this process has heard of them (a lease that took none may
        have been adopted by a limit set anywhere since)."""
        await self._limiter.free(lease.task.name, lease.run_id)

    async def find(self, key: str, *, worker_id: str, run_id: str) -> Lease:
        """The live lease ``key + worker_id + run_id`` (one read), for a caller that kept only
        those (the HTTP API's workers); `LeaseLost` when it is gone."""
        task = await self._store.get(key)
        now = self._clock.now()
        if task is not None:
            for ws in task.worker_states:
                if ws.run_id == run_id and ws.worker_id == worker_id and lease_is_live(ws, now):
                    return Lease(key=key, worker_id=worker_id, run_id=run_id, task=task)
        raise LeaseLost(
            f"task {key!r}: worker {worker_id!r} holds no live lease with run {run_id!r}",
            state=None,
        )
