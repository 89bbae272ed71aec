"""Limits per task name, as a consumer keeps them (`Scheduler.set_limit`): a claim of a
limited name takes a token first (`store.limits`), a name at its limit is not tried again
before its window frees, and the slots of running tasks live as long as their leases."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

import anyio
from anyio.abc import TaskGroup

from ..errors import BackendUnavailable, ClaimUncertain, StoreError
from ..models import Lease, Task
from ..store.limits import Limit
from ..store.tasks import TaskStore

log = logging.getLogger(__name__)

# A slot's first life, before the holder's first extension sets it to its lease's expiry.
FIRST_SLOT_LIFE = dt.timedelta(seconds=60)


class Quotas:
    def __init__(self, store: TaskStore) -> None:
        self._store = store
        self._clock = store.clock
        self.limited: dict[str, Limit] = {}
        self.blocked: dict[str, dt.datetime] = {}  # name -> when its limit frees
        self._held: dict[str, tuple[str, str, Lease]] = {}  # key -> (name, token, lease)
        self._names: dict[str, str] = {}  # key -> name, for the keys of limited names only
        self._wake = anyio.Event()
        self._task_group: TaskGroup | None = None

    def bind(self, task_group: TaskGroup) -> None:
        self._task_group = task_group

    async def refresh(self, names: Sequence[str]) -> None:
        self.limited = await self._store.limits.of(names)

    def offered(self, task: Task, when: dt.datetime | None) -> dt.datetime | None:
        """When the consumer may try ``task`` (claimable from ``when``): a limited name's
        key is noted, and not tried before the name's window frees (a fetch must not undo
        that)."""
        if task.name not in self.limited:
            return when
        if when is None:
            self._names.pop(task.key, None)
            return None
        self._names[task.key] = task.name
        return max(when, self.blocked_until(task.name, when) or when)

    def name_of(self, key: str) -> str | None:
        """The name of a key noted by `offered` (so of a limited name), else None."""
        return self._names.get(key)

    def forget(self, keys: Sequence[str]) -> None:
        """These keys left the consumer's heap (claimed, or found not claimable)."""
        for key in keys:
            self._names.pop(key, None)

    def blocked_until(self, name: str, now: dt.datetime) -> dt.datetime | None:
        until = self.blocked.get(name)
        return until if until is not None and until > now else None

    async def claim(
        self, worker_id: str, name: str, exclude_keys: Sequence[str]
    ) -> Lease | dt.datetime | None:
        """A lease of ``name`` under a token; else when its limit frees, or None if no task
        of it was claimable (the token given back)."""
        now = self._clock.now()
        token = await self._store.limits.acquire(name, now + FIRST_SLOT_LIFE)
        if isinstance(token, dt.datetime):
            self.blocked[name] = token
            log.debug("limit of %r reached until %s", name, token, extra={"action": "limited"})
            return token
        try:
            lease = await self._store.claim(worker_id, names=[name], exclude_keys=exclude_keys)
        except ClaimUncertain:
            raise  # the claim may have landed: the token stays counted (the safe side)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._give_back(name, token)
            raise
        if lease is None:
            await self._give_back(name, token)
            return None
        self._held[lease.key] = (name, token, lease)
        self._wake.set()
        return lease

    async def claim_up_to(
        self, worker_id: str, name: str, count: int, running: Sequence[str]
    ) -> tuple[list[Lease], dt.datetime | None]:
        """Up to ``count`` leases of ``name``, while its limit allows; and, if the limit was
        reached, when it frees (the caller's due keys of ``name`` wait until then)."""
        leases: list[Lease] = []
        blocked = self.blocked_until(name, self._clock.now())
        while blocked is None and len(leases) < count:
            got = await self.claim(worker_id, name, [*running, *(lease.key for lease in leases)])
            if got is None:
                break
            if isinstance(got, dt.datetime):
                blocked = got
            else:
                leases.append(got)
        return leases, blocked

    async def _give_back(self, name: str, token: str) -> None:
        try:
            await self._store.limits.give_back(name, token)
        except (BackendUnavailable, StoreError) as exc:  # unused: the limit errs on the safe side
            log.warning(str(exc), extra={"action": "token_lost"})

    def ended(self, key: str) -> None:
        """The run of ``key`` ended: its slot frees (its start still counts in the window)."""
        held = self._held.pop(key, None)
        if held is not None:
            self.blocked.pop(held[0], None)  # a slot of ours frees: worth asking at once
        if held is not None and self._task_group is not None:
            self._task_group.start_soon(self._release, held[0], held[1])

    async def _release(self, name: str, token: str) -> None:
        try:
            await self._store.limits.release(name, token)
        except (BackendUnavailable, StoreError) as exc:  # the slot expires with its lease
            log.warning(str(exc), extra={"action": "slot_release_failed"})

    async def extend_loop(self) -> None:
        """Keep the slots of the running tasks alive as long as their leases: one write per
        limited name per ping interval, only while such tasks run."""
        while True:
            self._wake = anyio.Event()
            if not self._held:
                await self._wake.wait()
                continue
            leases = [lease for _, _, lease in self._held.values()]
            interval = min(lease.task.options.ping_interval_ms for lease in leases)
            await self._clock.wait_until(
                self._clock.now() + dt.timedelta(milliseconds=interval), anyio.Event()
            )
            by_name: dict[str, list[tuple[str, Lease]]] = {}
            for name, token, lease in list(self._held.values()):
                by_name.setdefault(name, []).append((token, lease))
            now = self._clock.now()
            for name, held in by_name.items():
                timeout = max(lease.task.options.worker_timeout_ms for _, lease in held)
                until = now + dt.timedelta(milliseconds=timeout)
                try:
                    await self._store.limits.extend(name, [token for token, _ in held], until)
                except (BackendUnavailable, StoreError) as exc:
                    log.warning(str(exc), extra={"action": "slot_extend_failed"})
