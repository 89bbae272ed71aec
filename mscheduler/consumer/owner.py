"""The pull API (`Scheduler.own`, ``extend``, ``succeed``, ``fail``, ``release``): a worker
that drives the loop itself claims, extends and finishes leases through the consumer's own
claim, under the same rules.

A call of `Owner.own` is one round of the consumer's claim path (`claimer.Claimer`): the
paused names are left out, the names without a limit are claimed in one batched claim
(`TaskStore.claim_many`: three round trips for any number of tasks, one for a single task),
and a limited name's tasks one by one, each under a token of its limit taken first
(`store.limits`), as `limits.Limiter.claim` does. What differs is where the state lives:

- A lease owned here holds its limit slot until it ends or expires, without a process that
  keeps it: the slot's token *is* the lease's ``run_id`` and the slot lasts as long as the
  lease (``until``). `Owner.extend` extends both; a finish releases the slot by the run_id.
  Any process can therefore end a lease another one owned (the HTTP API's workers come back
  to any server), and a worker that vanishes leaves a slot that lapses with its lease.
- The paused names and the limits are read at each call, or taken from `ControlView`, which
  keeps them while the process's `ControlHub` watches (a consumer, or the HTTP server, runs
  it), exactly as a consumer keeps them: a change is in effect within one event or one poll
  interval, and a claim then costs what the consumer's costs.

Invariant: every lease won is returned, whatever fails after it (a lease nobody knows of
would expire unrun and count as an attempt).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

import anyio

from ..errors import BackendUnavailable, ClaimUncertain, ConfigurationError, LeaseLost
from ..models import (
    ErrorInfo,
    Lease,
    Limit,
    Task,
    check_name,
    check_worker_id,
    checked,
    new_run_id,
)
from ..services.discovery import Subscription
from ..store.components import Store
from ..worker_options import WorkerOptions
from . import takeover
from .limits import FIRST_SLOT_LIFE

log = logging.getLogger(__name__)

MAX_TASKS = 1_000  # the most one call of `own` claims
_MIN_LEASE = dt.timedelta(milliseconds=1)
_LONGEST_LEASE = dt.timedelta(days=7)


class ControlView:
    """The paused names and the limits of the names asked about, kept while the process's
    `ControlHub` watches (read again after each change it sees), else read at each call."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._hub = store.control_hub
        self._version = -1
        self._paused: dict[str, bool] = {}
        self._limits: dict[str, Limit | None] = {}

    def forget(self) -> None:
        """This process wrote a control: read them again at the next call, not at the hub's
        event (a claim right after a pause made here must see it)."""
        self._version = -1
        self._paused.clear()
        self._limits.clear()

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

    def __init__(self, store: Store) -> None:
        self._store = store
        self._clock = store.clock
        self.controls = ControlView(store)

    async def own(
        self,
        names: Sequence[str],
        *,
        worker_id: str,
        max_tasks: int = 1,
        lease: dt.timedelta | float | None = None,
        wait: dt.timedelta | float | None = None,
    ) -> list[Lease]:
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
        """Claim again on each write the process's hub says may give work on ``names`` (as
        a consumer hears of it), on each control change its control hub sees while one runs
        (a resume, a limit raised), and at the times nothing announces: the soonest task's
        next claim time, and when a full limit frees; ``[]`` at ``deadline``. Subscribed
        before the first claim of the wait, so a task published after the first try is not
        missed."""
        subscription = Subscription(WorkerOptions(), wakes=names)
        async with self._store.task_hub.subscription(subscription):
            while True:
                seen = self._store.control_hub.version  # before the claim: no change missed
                leases, wake_at = await self._claim(names, worker_id, max_tasks, length)
                if leases:
                    return leases
                now = self._clock.now()
                if now >= deadline:
                    return []
                soonest = await self._soonest(names, worker_id, now)
                wake_at = min(t for t in (deadline, wake_at, soonest) if t is not None)
                await self._until_event(subscription, seen, wake_at)

    async def _soonest(
        self, names: list[str], worker_id: str, now: dt.datetime
    ) -> dt.datetime | None:
        """When the first task of ``names`` that no write will announce becomes claimable by
        ``worker_id`` (a ``not_before``, a retry delay, a lease that expires)."""
        for task in await self._store.fetch(names, worker_id, 1, 1):
            when = task.next_claim_for(worker_id, now)
            if when is not None and when > now:
                return when
        return None

    async def _until_event(self, subscription: Subscription, seen: int, until: dt.datetime) -> None:
        wake = anyio.Event()
        async with anyio.create_task_group() as task_group:

            async def heard() -> None:
                await subscription.next()
                while subscription.pending:  # one claim answers every event heard so far
                    await subscription.next()
                wake.set()

            async def controls_changed() -> None:
                await self._store.control_hub.changed(seen)
                wake.set()

            task_group.start_soon(heard)
            task_group.start_soon(controls_changed)
            await self._clock.wait_until(until, wake)
            task_group.cancel_scope.cancel()

    async def _claim(
        self, names: list[str], worker_id: str, max_tasks: int, length: dt.timedelta | None
    ) -> tuple[list[Lease], dt.datetime | None]:
        """Up to ``max_tasks`` leases, and when a limit that refused a claim frees."""
        paused = await self.controls.paused(names)
        active = [name for name in names if name not in paused]
        limits = await self.controls.limits(active) if active else {}
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
                free = await self._claim_limited(name, worker_id, max_tasks, length, leases)
                if free is not None:
                    freed = free if freed is None else min(freed, free)
        except BackendUnavailable as exc:
            if not leases:
                raise
            log.warning(str(exc), extra={"action": "own_partial", "leases": len(leases)})
        for lease in leases:
            takeover.report(lease)
        return leases, freed

    async def _claim_limited(
        self,
        name: str,
        worker_id: str,
        max_tasks: int,
        length: dt.timedelta | None,
        leases: list[Lease],
    ) -> dt.datetime | None:
        """Leases of ``name``, each under a token of its limit (the lease's run_id), appended
        to ``leases`` as each is won; returns when the limit frees if it was reached."""
        while len(leases) < max_tasks:
            now = self._clock.now()
            until = None if length is None else now + length
            run_id = new_run_id()
            slot_until = until or now + FIRST_SLOT_LIFE
            token = await self._store.limits.acquire(name, slot_until, token=run_id)
            if isinstance(token, dt.datetime):
                return token
            excluded = [lease.key for lease in leases]
            try:
                lease = await self._store.tasks.claim(
                    worker_id, names=[name], exclude_keys=excluded, run_id=run_id, until=until
                )
            except ClaimUncertain:
                # The claim may have landed with its reply lost: the slot lapses with the
                # lease it would belong to (``slot_until``), never before it.
                raise
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._store.limits.give_back(name, run_id)
                raise
            if lease is None:
                if token is not None:
                    await self._store.limits.give_back(name, run_id)
                return None
            lease._slot = "" if token is None else name
            leases.append(lease)
            if token is not None:
                # The caller starts its work as the lease comes back: the start its token
                # took, held until now, counts ``per`` from here (as a handler's start does).
                await self._store.limits.confirm(name, [run_id])
            expires = lease.ping_expire_at
            if token is not None and expires is not None and expires > slot_until:
                # The task's own timeout outlasts the first slot life: the slot lasts as long.
                await self._store.limits.extend(name, [run_id], expires)
        return None

    async def extend(self, lease: Lease, length: dt.timedelta | float | None = None) -> Lease:
        """The lease extended by ``length`` from now (else its task's ``worker_timeout_ms``),
        its limit slot with it; `LeaseLost` when it is gone."""
        until = None
        if length is not None:
            until = self._clock.now() + _timedelta(length, "lease", minimum=_MIN_LEASE)
        task = await self._store.tasks.ping(lease, until)
        extended = Lease(key=lease.key, worker_id=lease.worker_id, run_id=lease.run_id, task=task)
        extended._slot = slot = await self._slot_of(lease)
        expires = extended.ping_expire_at
        if slot and expires is not None:
            await self._store.limits.extend(slot, [lease.run_id], expires)
        return extended

    async def _slot_of(self, lease: Lease) -> str:
        """The name whose limit slot ``lease`` holds ("" for none): known for a lease owned
        in this process; else a slot may be held if the name has a limit now (its token is
        the run_id, so extending or freeing it touches no one else's)."""
        if lease._slot is not None:
            return lease._slot
        limited = await self.controls.limits([lease.task.name])
        return lease.task.name if limited else ""

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
        """The run ended (or its lease is gone): its slot, if its name is limited, frees.
        Its token is its run_id, so this frees nothing of anyone else's."""
        with anyio.CancelScope(shield=True):
            try:
                slot = await self._slot_of(lease)
                if slot:
                    await self._store.limits.release(slot, lease.run_id)
            except BackendUnavailable as exc:  # the slot lapses with the lease
                log.warning(str(exc), extra={"action": "slot_release_failed"})

    async def find(self, key: str, *, worker_id: str, run_id: str) -> Lease:
        """The live lease ``key + worker_id + run_id`` (one read), for a caller that kept only
        those (the HTTP API's workers); `LeaseLost` when it is gone."""
        task = await self._store.get(key)
        now = self._clock.now()
        if task is not None:
            for ws in task.worker_states:
                if ws.run_id == run_id and ws.worker_id == worker_id and ws.is_live(now):
                    return Lease(key=key, worker_id=worker_id, run_id=run_id, task=task)
        raise LeaseLost(
            f"task {key!r}: worker {worker_id!r} holds no live lease with run {run_id!r}",
            state=None,
        )
