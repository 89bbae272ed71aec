"""The one claim core: what decides whether a task of a limited name may start, and how
long its slot lives, for every surface: a consumer's claimer (`claimer.Claimer`), the pull API
(`owner.Owner`, and so the HTTP API) and isolated handlers (whose start counts when their
child process starts them). Nothing else takes, confirms, extends or frees a token.

- A claim of a limited name takes a token first (`store.limits.acquire`): a held start and a
  slot, in one conditional write (`Limiter.take`). The token is the claim's run_id, so any
  process can extend or free the slot of any lease from the lease alone, and never touches
  another's.
- A name at its limit is not tried again before its window frees (`blocked`); `offered` says
  when a task of it is next worth trying, for a consumer's heap and a waiting owner alike.
- A start counts from its handler's real start: taken held with the claim, confirmed as the
  handler starts (`at_start` before the call, `started` as it really begins: in a child
  process, when the child says so), or as a pull lease reaches its worker (`handed_out`).
- A slot lives exactly as long as its lease: taken with a first life before the lease is
  known, bound to the lease's end as soon as it is (`handed_out`, or a consumer's first
  extension, at once), extended with it, and freed at its end whatever the limits say then.
- Under a ``partition_max_running``, the claim leaves out the partitions its token saw at
  their limit (the token's write returns the name's document), and the slot is then counted
  in the claimed task's partition by a conditional write that also binds it to the lease
  (`store.limits.bind_partition`); refused (another process filled the partition in
  between), the task is given back and the token too. A race loses a claim, never breaks
  the limit: a slot counts in a partition only through that write, below the limit.
- When a ``max_running`` appears, what runs takes slots: every live attempt, by the limit's
  writer (`store.limits.set`), and a consumer's own runs as it hears of it (`apply`), which
  also covers a claim that landed after the writer's read.

Invariant: every token taken by a consumer is held by a lease it runs (`_held`), waits on an
uncertain claim's look-up (`_uncertain`), or is given back; a held slot is extended before
it lapses for as long as its run lives (an abandoned handler's included) and released when
the run ends. A pull lease's slot is its worker's: bound to its lease when handed out,
extended by `Owner.extend`, freed by its end, or lapsing with it. Every handler start of a
name with a rate (a local retry's included) comes within `START_HOLD` after a start taken
for it alone, and confirms it as it starts: the start counts ``per`` from then
(`queries.limits`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
from anyio.abc import TaskGroup

from ..errors import BackendUnavailable, ClaimUncertain, StoreError
from ..liveness import lease_expiry
from ..models import Lease, Limit, Task, new_run_id
from ..reconnect_backoff import Backoff
from ..store.components import Store
from ..store.limits import RUNNING_RECHECK, START_HOLD, Token

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
    token: str  # the slot's id in the limit's document: its lease's run_id
    lease: Lease
    until: dt.datetime  # when the slot lapses unless extended
    extend_at: dt.datetime
    start: str | None  # the start taken with its claim, held until its handler is about to start
    taken_at: dt.datetime  # when that start was taken
    bound: bool = True  # its life is its lease's (else: its first life, bound at once)
    pending: str | None = None  # the start its handler confirms as it really starts

    def next_extension(self, now: dt.datetime) -> dt.datetime:
        """A ping interval on, and before half the slot's life is left."""
        interval = dt.timedelta(milliseconds=self.lease.task.options.ping_interval_ms)
        return now + max(min(interval, (self.until - now) / 2), _MIN_EXTENSION_GAP)


def _terms(limit: Limit | None) -> tuple[int | None, ...] | None:
    if limit is None:
        return None
    return (limit.rate, limit.per_ms, limit.max_running, limit.partition_max_running)


class Limiter:
    """The limits of a consumer's names, kept: the tokens it takes, holds and gives back."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._clock = store.clock
        self.limited: dict[str, Limit] = {}
        self.blocked: dict[str, dt.datetime] = {}  # name -> when its limit frees
        self._held: dict[str, _Slot] = {}  # key -> the slot its run holds
        self._uncertain: dict[str, str] = {}  # run_id (its token) -> name
        # key -> whether its run still runs, while its adoption is written (`_adopt`)
        self._adopting: dict[str, bool] = {}
        self._wake = anyio.Event()
        self._task_group: TaskGroup | None = None
        self._releasing = 0
        self._released = anyio.Event()
        self._confirming: dict[str, list[str]] = {}  # name -> starts to confirm in one write
        self._bound_at_claim: set[str] = set()  # run_ids whose slot a partition's write bound

    def bind(self, task_group: TaskGroup) -> None:
        self._task_group = task_group

    async def refresh(self, names: Sequence[str], running: Sequence[Lease] = ()) -> list[str]:
        """Read the limits of ``names`` and `apply` them."""
        return await self.apply(names, await self._store.limits.of(names), running)

    async def apply(
        self, names: Sequence[str], limits: dict[str, Limit], running: Sequence[Lease] = ()
    ) -> list[str]:
        """The limits of ``names`` are ``limits`` now; returns the names whose limits changed
        (set, changed or removed): their due keys are worth trying at once. The ``running``
        leases of a name that has a ``max_running`` now and that hold no slot here (started
        before it was limited) take one, so claims count them: no start beyond the limit from
        then on. A held slot stays held (extended, then released) whether its name is limited
        now or not: a removed limit's document keeps it, and counts it if the limit is set
        again."""
        await self._adopt(limits, running)
        changed = sorted(
            name for name in names if _terms(limits.get(name)) != _terms(self.limited.get(name))
        )
        for name in names:
            if name in limits:
                self.limited[name] = limits[name]
            else:
                self.limited.pop(name, None)
        for name in changed:
            self.blocked.pop(name, None)
        return changed

    async def _adopt(self, limits: dict[str, Limit], running: Sequence[Lease]) -> None:
        now = self._clock.now()
        unslotted: dict[str, dict[str, Lease]] = {}
        for lease in running:
            limit = limits.get(lease.task.name)
            counted = limit is not None and (
                limit.max_running is not None or limit.partition_max_running is not None
            )
            if counted and lease.key not in self._held:
                unslotted.setdefault(lease.task.name, {})[lease.run_id] = lease
        for name, leases in unslotted.items():
            untils = {run_id: _lease_end(lease, now) for run_id, lease in leases.items()}
            for lease in leases.values():
                self._adopting[lease.key] = True
            partitions = {
                run_id: lease.task.options.partition
                for run_id, lease in leases.items()
                if lease.task.options.partition is not None
            }
            try:
                if partitions:
                    await self._store.limits.adopt(name, untils, partitions)
                else:
                    await self._store.limits.adopt(name, untils)
            finally:
                for run_id, lease in leases.items():
                    if self._adopting.pop(lease.key, False):
                        self._hold(lease, name, now, untils[run_id], start=None)
                    else:  # its run ended during the write: the slot it was given frees
                        self._spawn(functools.partial(self._release, name, run_id))

    def offered(self, task: Task, when: dt.datetime | None) -> dt.datetime | None:
        """When the consumer may try ``task`` (claimable from ``when``): a limited name's
        key not before the name's window frees (a fetch must not undo that)."""
        if task.name not in self.limited or when is None:
            return when
        return max(when, self.blocked_until(task.name, when) or when)

    def blocked_until(self, name: str, now: dt.datetime) -> dt.datetime | None:
        until = self.blocked.get(name)
        return until if until is not None and until > now else None

    async def take(
        self,
        worker_id: str,
        name: str,
        exclude_keys: Sequence[str],
        until: dt.datetime | None = None,
    ) -> Lease | dt.datetime | None:
        """A lease of ``name`` under a token (its run_id: ``lease._slot`` is ``name``); else
        when its limit frees, or None if no task of it was claimable (the token given back).
        ``until``: the lease's end, if the caller chose it (then also the slot's first life;
        else `FIRST_SLOT_LIFE`, until the slot is bound to its lease). A name never limited is
        claimed without a token (``lease._slot`` is "")."""
        now = self._clock.now()
        run_id = new_run_id()
        first_life = until or now + FIRST_SLOT_LIFE
        try:
            token = await self._store.limits.acquire(name, first_life, token=run_id)
        except anyio.get_cancelled_exc_class():
            # Cancelled (a vanished owner, a crashed consumer) while the write may have been
            # applied: no lease holds that slot, so nothing would free it before its first life.
            with anyio.move_on_after(_RELEASE_TIMEOUT_S, shield=True):
                await self._give_back(name, run_id)
            raise
        if token is None:  # no limit's document (never limited): claimed as any other name
            self.limited.pop(name, None)
            self.blocked.pop(name, None)
            lease = await self._store.tasks.claim(
                worker_id, names=[name], exclude_keys=exclude_keys, until=until
            )
            if lease is not None:
                lease._slot = ""
            return lease
        if isinstance(token, dt.datetime):
            return self._limited(name, token)
        full = token.full_partitions if isinstance(token, Token) else ()
        try:
            lease = await self._store.tasks.claim(
                worker_id,
                names=[name],
                exclude_keys=exclude_keys,
                run_id=run_id,
                until=until,
                exclude_partitions=full,
            )
        except ClaimUncertain:
            raise  # the claim may have landed: its slot waits for the look-up, or lapses
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._give_back(name, run_id)
            raise
        if lease is None:
            await self._give_back(name, run_id)
            if full:  # tasks may wait in the full partitions: asked again when a slot frees
                return self._limited(name, now + RUNNING_RECHECK)
            return None
        partition = lease.task.options.partition
        counted = isinstance(token, Token) and token.partitioned
        if (
            counted
            and partition is not None
            and not await self._bind_partition(name, lease, run_id, partition, first_life)
        ):
            return self._limited(name, now + RUNNING_RECHECK)
        if lease.run_id != run_id:
            # A sharded cluster's claim chooses its own run_id: the slot moves to it (its
            # start stays under the token, held until it expires if never confirmed).
            if partition is not None:
                partitions = {lease.run_id: partition}
                await self._store.limits.adopt(name, {lease.run_id: first_life}, partitions)
            else:
                await self._store.limits.adopt(name, {lease.run_id: first_life})
            await self._store.limits.release(name, run_id)
        lease._slot = name
        return lease

    def _limited(self, name: str, until: dt.datetime) -> dt.datetime:
        self.blocked[name] = until
        log.debug("limit of %r reached until %s", name, until, extra={"action": "limited"})
        return until

    async def _bind_partition(
        self, name: str, lease: Lease, token: str, partition: str, first_life: dt.datetime
    ) -> bool:
        """The claim's slot counts in its task's partition (`store.limits.bind_partition`),
        bound to its lease's end as it is (so a consumer's first extension is not needed);
        else the partition filled between the token and the claim (another process claimed
        in it meanwhile): the task is given back (its claim undone: not a failure, and no
        attempt counted) and the token too. A race loses a claim, never breaks the limit."""
        until = lease.ping_expire_at or first_life
        try:
            bound = await self._store.limits.bind_partition(name, token, partition, until)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._give_back_claim(name, lease, token)
            raise
        if bound:
            self._bound_at_claim.add(lease.run_id)
            return True
        with anyio.CancelScope(shield=True):
            await self._give_back_claim(name, lease, token)
        return False

    async def _give_back_claim(self, name: str, lease: Lease, token: str) -> None:
        try:
            # Its handler never started: no attempt is counted (`Tasks.unclaim`).
            await self._store.tasks.unclaim(lease)
        except (BackendUnavailable, StoreError) as exc:  # the lease expires unrun
            log.warning(str(exc), extra={"action": "claim_given_back_failed"})
        await self._give_back(name, token)

    async def claim(
        self, worker_id: str, name: str, exclude_keys: Sequence[str]
    ) -> Lease | dt.datetime | None:
        """A consumer's claim (`take`): the lease's slot is held here from now, bound to its
        lease at once, and its start waits for its handler."""
        try:
            taken = await self.take(worker_id, name, exclude_keys)
        except ClaimUncertain as exc:
            # The claim may have landed: its token waits for the look-up (`recovered`).
            for run_id in exc.run_ids:
                self._uncertain[run_id] = name
            raise
        if isinstance(taken, Lease) and taken._slot:
            now = self._clock.now()
            # A slot bound to its partition at the claim lives until its lease's end already.
            bound = taken.run_id in self._bound_at_claim
            self._bound_at_claim.discard(taken.run_id)
            until = (
                (taken.ping_expire_at or now + FIRST_SLOT_LIFE) if bound else now + FIRST_SLOT_LIFE
            )
            self._hold(taken, name, now, until, start=taken.run_id, bound=bound)
        return taken

    def _hold(
        self,
        lease: Lease,
        name: str,
        now: dt.datetime,
        until: dt.datetime,
        *,
        start: str | None,
        bound: bool = True,
    ) -> None:
        slot = _Slot(name, lease.run_id, lease, until, now, start, now, bound)
        # A first life is bound to the lease at once where a slot counts (``max_running``): a
        # consumer that dies after its claim leaves a slot that lapses with its lease, not a
        # minute later. Under a rate alone, slots count for nothing: no write for it.
        limit = self.limited.get(name)
        counts = limit is None or (limit.max_running, limit.partition_max_running) != (None, None)
        slot.extend_at = now if not bound and counts else slot.next_extension(now)
        self._held[lease.key] = slot
        self._wake.set()  # its first extension may be the earliest

    async def claim_up_to(
        self,
        worker_id: str,
        name: str,
        count: int,
        running: Sequence[str],
        won: list[Lease],
        *,
        pulled: bool = False,
        length: dt.timedelta | None = None,
    ) -> dt.datetime | None:
        """Up to ``count`` leases of ``name`` while its limit allows, each appended to ``won``
        as soon as it is won (so a failure later in the call loses none); returns when the
        limit frees if it was reached (the caller's due keys of ``name`` wait until then).
        ``pulled``: the leases are a pull worker's (`Owner`), lasting ``length`` if given,
        never held here (their worker keeps them: `handed_out`); the limit is asked
        whatever it answered before (a slot may have freed in any process)."""
        now = self._clock.now()
        blocked = None if pulled else self.blocked_until(name, now)
        excluded = [*running, *(lease.key for lease in won)]
        got = 0
        while blocked is None and got < count:
            if pulled:
                until = None if length is None else self._clock.now() + length
                lease = await self.take(worker_id, name, excluded, until)
                if isinstance(lease, Lease):  # its worker binds its slot (`handed_out`)
                    self._bound_at_claim.discard(lease.run_id)
            else:
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

    async def handed_out(self, name: str, leases: Sequence[Lease]) -> None:
        """Pull leases of ``name`` reach their worker, who starts at once: their held starts
        confirmed (each counts ``per`` from now) and their slots bound to their leases'
        ends, in one write. Shielded: the leases are their worker's whatever happens here."""
        ends = {
            lease.run_id: lease.ping_expire_at
            for lease in leases
            if lease._slot and lease.ping_expire_at is not None
        }
        if not ends:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self._store.limits.started(name, list(ends), ends, _partitions(leases))
            except (BackendUnavailable, StoreError) as exc:  # held and first lives: safe side
                log.warning(str(exc), extra={"action": "start_unconfirmed"})

    async def extend_slot(self, lease: Lease, until: dt.datetime) -> None:
        """A pull lease extended: its slot (if its name's document has one) lives as long,
        counting in its task's partition."""
        name, run_id = lease.task.name, lease.run_id
        await self._store.limits.extend(name, {run_id: until}, _partitions([lease]))

    async def free(self, name: str, run_id: str) -> None:
        """A pull lease ended: its slot, if any, frees now (its start still counts). Shielded;
        an error leaves the slot to lapse with the lease."""
        self.blocked.pop(name, None)
        with anyio.CancelScope(shield=True):
            await self._release(name, run_id)

    def recovered(self, run_ids: Sequence[str], leases: Sequence[Lease]) -> None:
        """The look-up of uncertain claims found ``leases``: their tokens are held as any
        claim's; a run_id found without a lease never started anything, its token is given
        back."""
        found = {lease.run_id: lease for lease in leases}
        for run_id in run_ids:
            name = self._uncertain.pop(run_id, None)
            if name is None:
                continue
            lease = found.get(run_id)
            if lease is not None:
                # Its slot's first life began before the look-up: bound to its lease at once.
                # Its start was taken before the look-up too: its handler takes one of its own.
                lease._slot = name
                now = self._clock.now()
                self._hold(lease, name, now, now, start=None, bound=False)
            else:
                self._spawn(functools.partial(self._give_back, name, run_id))

    async def _give_back(self, name: str, token: str) -> None:
        try:
            await self._store.limits.give_back(name, token)
        except (BackendUnavailable, StoreError) as exc:  # unused: the limit errs on the safe side
            log.warning(str(exc), extra={"action": "token_lost"})

    async def restart(self, task: Task) -> None:
        """Before a local retry of a handler: a start counts against the rate like the first
        (its slot is held already); waits while the window is full. `started` confirms it."""
        token = await self._take_start(task)
        if token is None:
            return
        slot = self._held.get(task.key)
        if slot is None:
            self._confirm(task.name, token)
        else:
            slot.pending = token

    async def at_start(self, task: Task) -> None:
        """As a limited task's handler is about to be started: the start taken for it waits
        for `started`. One taken too long ago (held no longer than `START_HOLD`, so the
        handler's window could outlast it), or before a lost reply's look-up, is not the
        handler's: it takes a start of its own, waiting while the window is full (the earlier
        one still counts until it expires: under-used, never exceeded)."""
        slot = self._held.get(task.key)
        limit = self.limited.get(task.name)
        if slot is None or limit is None or limit.rate is None:
            return
        start, slot.start = slot.start, None
        if start is None or self._clock.now() - slot.taken_at > _LATE_START:
            start = await self._take_start(task)
        slot.pending = start

    def started(self, task: Task) -> None:
        """The handler really starts now (in its child process, for an isolated handler): its
        start counts ``per`` from now. A handler that never started leaves it held until it
        expires."""
        slot = self._held.get(task.key)
        if slot is not None and slot.pending is not None:
            token, slot.pending = slot.pending, None
            self._confirm(task.name, token)

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
        counted = limit is not None and (
            limit.max_running is not None or limit.partition_max_running is not None
        )
        if not counted or not task.state.is_terminal:
            return False
        return self.blocked.pop(task.name, None) is not None

    def ended(self, key: str) -> str | None:
        """The run of ``key`` ended (an abandoned handler's: it returned): its slot frees (its
        start still counts in the window). Returns the name whose slot freed, if any."""
        if key in self._adopting:
            self._adopting[key] = False  # the adoption being written frees its slot after
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
        """Keep each held slot alive while its run lives: bound to its lease's end at once,
        then extended to its lease's timeout from now a ping interval after the last
        extension, and before half its life is left (so whatever the ping interval, a slot
        never lapses before its lease). One write per limited name due, only while such
        tasks run."""
        while True:
            self._wake = wake = anyio.Event()
            due = min((slot.extend_at for slot in self._held.values()), default=None)
            await self._clock.wait_until(due, wake)
            now = self._clock.now()
            by_name: dict[str, dict[str, _Slot]] = {}
            for slot in self._held.values():
                if slot.extend_at <= now:
                    by_name.setdefault(slot.name, {})[slot.token] = slot
            for name, slots in by_name.items():
                untils = {
                    token: _lease_end(slot.lease, now) if slot.bound else _first_end(slot, now)
                    for token, slot in slots.items()
                }
                try:
                    partitions = _partitions([slot.lease for slot in slots.values()])
                    await self._store.limits.extend(name, untils, partitions)
                except (BackendUnavailable, StoreError) as exc:
                    log.warning(str(exc), extra={"action": "slot_extend_failed"})
                else:
                    for token, slot in slots.items():
                        slot.until, slot.bound = untils[token], True
                for slot in slots.values():
                    slot.extend_at = slot.next_extension(now)


def _partitions(leases: Sequence[Lease]) -> dict[str, str]:
    """The partition of each lease's task that has one, by run_id: where its slot counts
    (`queries.limits.extend`)."""
    return {
        lease.run_id: lease.task.options.partition
        for lease in leases
        if lease.task.options.partition is not None
    }


def _lease_end(lease: Lease, now: dt.datetime) -> dt.datetime:
    """The end of a running lease pinged now: its task's timeout from now."""
    return lease_expiry(now, lease.task.options.worker_timeout_ms)


def _first_end(slot: _Slot, now: dt.datetime) -> dt.datetime:
    """A slot's first binding to its lease: the end the claim gave the lease (a lease not
    pinged since), or, a lease whose end already passed in this view, its timeout from now."""
    expires = slot.lease.ping_expire_at
    return expires if expires is not None and expires > now else _lease_end(slot.lease, now)
