"""Limits per task name, as a consumer keeps them (`Scheduler.set_limit`): a claim of a
limited name takes a token first (`store.limits`), a name at its limit is not tried again
before its window frees, a start counts from its handler's start, and the slot of a running
task lives exactly as long as its run.

Invariant: every token taken is held by a lease this consumer runs (`_held`), waits on an
uncertain claim's look-up (`_uncertain`), or is given back; a held slot is extended before
it lapses for as long as its run lives (an abandoned handler's included) and released when
the run ends. Every handler start of a name with a rate (a local retry's included) comes
within half of `START_HOLD` after a start taken for it alone, and confirms it as it starts
(`at_start`, `restart`): the start counts ``per`` from then (`queries.limits`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

import anyio
from anyio.abc import TaskGroup

from ..errors import BackendUnavailable, ClaimUncertain, StoreError
from ..models import Lease, Limit, Task
from ..reconnect_backoff import Backoff
from ..store.components import Store
from ..store.limits import START_HOLD

log = logging.getLogger(__name__)


def _token_retry_delay(attempt: int) -> float:
    """Seconds before asking again for a start of a limited name: the window is short."""
    return min(1.0, 0.1 * 2.0 ** min(attempt, 10))


# A slot's first life, before the holder's first extension sets it to its lease's expiry. The
# first extension comes at half of it at the latest, whatever the ping interval.
FIRST_SLOT_LIFE = dt.timedelta(seconds=60)
# Extensions are never closer than this, even when one failed and the slot nears its end.
_MIN_EXTENSION_GAP = dt.timedelta(milliseconds=100)
_RELEASE_TIMEOUT_S = 10.0  # real seconds a release may take at shutdown before we give up
# A handler that starts later than this after its start was taken takes a start of its own:
# the one taken for it is held for `START_HOLD` only.
_LATE_START = START_HOLD / 2


@dataclasses.dataclass
class _Slot:
    name: str
    token: str
    lease: Lease
    until: dt.datetime  # when the slot lapses unless extended
    extend_at: dt.datetime
    start: str | None  # the start taken for its handler, held until the handler starts
    taken_at: dt.datetime  # when that start was taken

    def next_extension(self, now: dt.datetime) -> dt.datetime:
        """A ping interval on, and before half the slot's life is left."""
        interval = dt.timedelta(milliseconds=self.lease.task.options.ping_interval_ms)
        return now + max(min(interval, (self.until - now) / 2), _MIN_EXTENSION_GAP)


def _terms(limit: Limit | None) -> tuple[int | None, ...] | None:
    return None if limit is None else (limit.rate, limit.per_ms, limit.max_running)


class Limiter:
    """The limits of a consumer's names, kept: the tokens it takes, holds and gives back."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._clock = store.clock
        self.limited: dict[str, Limit] = {}
        self.blocked: dict[str, dt.datetime] = {}  # name -> when its limit frees
        self._held: dict[str, _Slot] = {}  # key -> the slot its run holds
        self._uncertain: dict[str, tuple[str, str]] = {}  # run_id -> (name, token)
        self._wake = anyio.Event()
        self._task_group: TaskGroup | None = None
        self._releasing = 0
        self._released = anyio.Event()
        self._confirming: dict[str, list[str]] = {}  # name -> starts to confirm in one write

    def bind(self, task_group: TaskGroup) -> None:
        self._task_group = task_group

    async def refresh(self, names: Sequence[str], running: Sequence[Lease] = ()) -> list[str]:
        """Read the limits of ``names``; returns the names whose limits changed (set, changed
        or removed): their due keys are worth trying at once. The ``running`` leases of a name
        that has a ``max_running`` now and that hold no slot (started before it was limited)
        take one, so claims count them: no start beyond the limit from then on. A held slot
        stays held (extended, then released) whether its name is limited now or not: a
        removed limit's document keeps it, and counts it if the limit is set again."""
        limits = await self._store.limits.of(names)
        await self._adopt(limits, running)
        changed = sorted(
            name
            for name in {*limits, *self.limited}
            if _terms(limits.get(name)) != _terms(self.limited.get(name))
        )
        self.limited = limits
        for name in changed:
            self.blocked.pop(name, None)
        return changed

    async def _adopt(self, limits: dict[str, Limit], running: Sequence[Lease]) -> None:
        now = self._clock.now()
        unslotted: dict[str, list[Lease]] = {}
        for lease in running:
            limit = limits.get(lease.task.name)
            if limit is not None and limit.max_running is not None and lease.key not in self._held:
                unslotted.setdefault(lease.task.name, []).append(lease)
        for name, leases in unslotted.items():
            tokens = [uuid.uuid4().hex for _ in leases]
            await self._store.limits.adopt(name, tokens, now + FIRST_SLOT_LIFE)
            for lease, token in zip(leases, tokens, strict=True):
                self._hold(lease, name, token, now, now + FIRST_SLOT_LIFE, start=None)

    def offered(self, task: Task, when: dt.datetime | None) -> dt.datetime | None:
        """When the consumer may try ``task`` (claimable from ``when``): a limited name's
        key not before the name's window frees (a fetch must not undo that)."""
        if task.name not in self.limited or when is None:
            return when
        return max(when, self.blocked_until(task.name, when) or when)

    def blocked_until(self, name: str, now: dt.datetime) -> dt.datetime | None:
        until = self.blocked.get(name)
        return until if until is not None and until > now else None

    async def claim(
        self, worker_id: str, name: str, exclude_keys: Sequence[str]
    ) -> Lease | dt.datetime | None:
        """A lease of ``name`` under a token; else when its limit frees, or None if no task
        of it was claimable (the token given back). A name whose limit is gone is claimed
        without a token."""
        now = self._clock.now()
        token = await self._store.limits.acquire(name, now + FIRST_SLOT_LIFE)
        if token is None:  # no limit's document (never limited): claimed as any other name
            self.limited.pop(name, None)
            self.blocked.pop(name, None)
            return await self._store.tasks.claim(worker_id, names=[name], exclude_keys=exclude_keys)
        if isinstance(token, dt.datetime):
            self.blocked[name] = token
            log.debug("limit of %r reached until %s", name, token, extra={"action": "limited"})
            return token
        try:
            lease = await self._store.tasks.claim(
                worker_id, names=[name], exclude_keys=exclude_keys
            )
        except ClaimUncertain as exc:
            # The claim may have landed: the token waits for the look-up (`recovered`).
            for run_id in exc.run_ids:
                self._uncertain[run_id] = (name, token)
            raise
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._give_back(name, token)
            raise
        if lease is None:
            await self._give_back(name, token)
            return None
        self._hold(lease, name, token, now, now + FIRST_SLOT_LIFE, start=token)
        return lease

    def _hold(
        self,
        lease: Lease,
        name: str,
        token: str,
        now: dt.datetime,
        until: dt.datetime,
        *,
        start: str | None,
    ) -> None:
        slot = _Slot(name, token, lease, until, now, start, now)
        slot.extend_at = slot.next_extension(now)
        self._held[lease.key] = slot
        self._wake.set()  # its first extension may be the earliest

    async def claim_up_to(
        self, worker_id: str, name: str, count: int, running: Sequence[str], won: list[Lease]
    ) -> dt.datetime | None:
        """Up to ``count`` leases of ``name`` while its limit allows, each appended to ``won``
        as soon as it is won (so a failure later in the call loses none); returns when the
        limit frees if it was reached (the caller's due keys of ``name`` wait until then)."""
        blocked = self.blocked_until(name, self._clock.now())
        excluded = [*running, *(lease.key for lease in won)]
        got = 0
        while blocked is None and got < count:
            lease = await self.claim(worker_id, name, excluded)
            if lease is None:
                break
            if isinstance(lease, dt.datetime):
                blocked = lease
            else:
                won.append(lease)
                excluded.append(lease.key)
                got += 1
        return blocked

    def recovered(self, run_ids: Sequence[str], leases: Sequence[Lease]) -> None:
        """The look-up of uncertain claims found ``leases``: their tokens are held as any
        claim's; a run_id found without a lease never started anything, its token is given
        back."""
        found = {lease.run_id: lease for lease in leases}
        for run_id in run_ids:
            pending = self._uncertain.pop(run_id, None)
            if pending is None:
                continue
            name, token = pending
            lease = found.get(run_id)
            if lease is not None:
                # Its slot's first life began before the look-up: extend it at once. Its
                # start was taken before the look-up too: its handler takes one of its own.
                now = self._clock.now()
                self._hold(lease, name, token, now, now, start=None)
            elif token not in (t for _, t in self._uncertain.values()):
                self._spawn(functools.partial(self._give_back, name, token))

    async def _give_back(self, name: str, token: str) -> None:
        try:
            await self._store.limits.give_back(name, token)
        except (BackendUnavailable, StoreError) as exc:  # unused: the limit errs on the safe side
            log.warning(str(exc), extra={"action": "token_lost"})

    async def restart(self, task: Task) -> None:
        """Before a local retry of a handler: a start counts against the rate like the first
        (its slot is held already); waits while the window is full, and confirms the start
        as the retry begins."""
        token = await self._take_start(task)
        if token is not None:
            self._confirm(task.name, token)

    async def at_start(self, task: Task) -> None:
        """As a limited task's handler is about to start: the start taken for it is confirmed
        (it counts ``per`` from now). One taken too long ago (held no longer than `START_HOLD`,
        so the handler's window could outlast it), or before a lost reply's look-up, is not
        the handler's: it takes a start of its own, waiting while the window is full (the
        earlier one still counts until it expires: under-used, never exceeded)."""
        slot = self._held.get(task.key)
        limit = self.limited.get(task.name)
        if slot is None or limit is None or limit.rate is None:
            return
        start, slot.start = slot.start, None
        if start is None or self._clock.now() - slot.taken_at > _LATE_START:
            start = await self._take_start(task)
        if start is not None:
            self._confirm(task.name, start)

    async def _take_start(self, task: Task) -> str | None:
        """A start of the task's name for its handler alone, taken once its window has room;
        None when the name has no rate (any more)."""
        backoff = Backoff(self._clock, _token_retry_delay)
        while task.name in self.limited and self.limited[task.name].rate is not None:
            try:
                taken = await self._store.limits.start(task.name)
            except BackendUnavailable as exc:
                log.warning(str(exc), extra={"action": "token_retry"})
                await backoff.wait()  # the limit is read again meanwhile: it may be gone
                continue
            if not isinstance(taken, dt.datetime):
                return taken
            log.debug("rate of %r reached until %s", task.name, taken, extra={"action": "limited"})
            await self._clock.wait_until(taken, anyio.Event())
        return None

    def _confirm(self, name: str, token: str) -> None:
        """The handler of this start starts now: confirmed by one write per name for the
        starts of one moment (the handlers a claim started run their first steps together)."""
        waiting = self._confirming.get(name)
        if waiting is not None:
            waiting.append(token)
            return
        self._confirming[name] = [token]
        if not self._spawn(functools.partial(self._send_confirmations, name)):
            del self._confirming[name]  # held until it expires: under-used

    async def _send_confirmations(self, name: str) -> None:
        tokens = self._confirming.pop(name, [])
        try:
            await self._store.limits.confirm(name, tokens)
        except (BackendUnavailable, StoreError) as exc:  # held until they expire: under-used
            log.warning(str(exc), extra={"action": "start_unconfirmed"})

    def ended_elsewhere(self, task: Task) -> bool:
        """A run of ``task`` ended, seen by its write (another process's, or ours): a name
        held back by its ``max_running`` is worth asking at once, as that run's slot frees
        (its writer releases it right after the write, and signals a process that polls
        then). A rate's window does not free on an end: such a name keeps waiting."""
        limit = self.limited.get(task.name)
        if limit is None or limit.max_running is None or not task.state.is_terminal:
            return False
        return self.blocked.pop(task.name, None) is not None

    def ended(self, key: str) -> str | None:
        """The run of ``key`` ended (an abandoned handler's: it returned): its slot frees (its
        start still counts in the window). Returns the name whose slot freed, if any."""
        slot = self._held.pop(key, None)
        if slot is None:
            return None
        self.blocked.pop(slot.name, None)  # a slot of ours frees: worth asking at once
        self._spawn(functools.partial(self._release, slot.name, slot.token))
        return slot.name

    def _spawn(self, write: Callable[[], Awaitable[None]]) -> bool:
        """A write of the limit's document (a release, a token given back, confirmations)
        that nothing waits for, done in the background; False if the consumer has stopped
        (the entries expire by themselves)."""
        if self._task_group is None:
            return False
        self._releasing += 1
        try:
            self._task_group.start_soon(self._shielded, write)
        except RuntimeError:
            self._releasing -= 1
            return False
        return True

    async def _shielded(self, write: Callable[[], Awaitable[None]]) -> None:
        """Shielded: a write started as the consumer stops must not be cancelled with it
        (`drain` waits for it)."""
        try:
            with anyio.move_on_after(_RELEASE_TIMEOUT_S, shield=True):
                await write()
        finally:
            self._releasing -= 1
            if not self._releasing:
                self._released.set()

    async def drain(self) -> None:
        """Wait for the releases in flight (at shutdown, before the task group is cancelled)."""
        while self._releasing:
            self._released = released = anyio.Event()
            await released.wait()

    async def _release(self, name: str, token: str) -> None:
        try:
            await self._store.limits.release(name, token)
        except (BackendUnavailable, StoreError) as exc:  # the slot expires with its lease
            log.warning(str(exc), extra={"action": "slot_release_failed"})

    async def extend_loop(self) -> None:
        """Keep each held slot alive while its run lives: extended to its lease's timeout
        from now a ping interval after the last extension, and before half its life is left
        (so whatever the ping interval, a slot never lapses before its lease). One write per
        limited name due, only while such tasks run."""
        while True:
            self._wake = wake = anyio.Event()
            due = min((slot.extend_at for slot in self._held.values()), default=None)
            await self._clock.wait_until(due, wake)
            now = self._clock.now()
            by_name: dict[str, list[_Slot]] = {}
            for slot in self._held.values():
                if slot.extend_at <= now:
                    by_name.setdefault(slot.name, []).append(slot)
            for name, slots in by_name.items():
                timeout = max(slot.lease.task.options.worker_timeout_ms for slot in slots)
                until = now + dt.timedelta(milliseconds=timeout)
                try:
                    await self._store.limits.extend(name, [slot.token for slot in slots], until)
                except (BackendUnavailable, StoreError) as exc:
                    log.warning(str(exc), extra={"action": "slot_extend_failed"})
                else:
                    for slot in slots:
                        slot.until = until
                for slot in slots:
                    slot.extend_at = slot.next_extension(now)
