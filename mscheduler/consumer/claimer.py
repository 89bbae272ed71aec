"""The claim path of a consumer: claim what its heap says is due, put back what was not
claimable, and recover the claims whose replies were lost.

While a slot is free and a key is due, the claimer claims the best tasks of its names
(server-side order: priority, then age): the plain names in one batched claim
(`TaskStore.claim_many`), a limited name's under a token (`limits.py`). Every lease won is
started, whatever fails after it: a lease nobody runs would expire and count as a failure.

A claim whose reply was lost and could not be looked up (`ClaimUncertain`) leaves run_ids
that may hold leases of ours: they are looked up (`TaskStore.find_claims`) before any new
claim, and at shutdown, so each lease that landed runs or is released.

The claimer owns what it claims from: the heap of next-claim times (`heap.ClaimHeap`), and
the claim policy that decides which due keys to claim now (`spread.ClaimSpread`, which lets
some wait in that heap). A task reaches the heap through `Claimer.offer`; the live workers the
policy counts come from the heartbeats (`presence`) and, when the count is stale as it
decides, from one read of its own.

The claimer sees each collaborator through one small interface, declared here with the
invariant it relies on: `Claims` (the store's claims), `ClaimableReads` (the store's read of
the tasks claimable soonest), `Slots` (the executor), `LimitedClaims` (the limiter), `Paused`
(the controls), `Feed` (what refills the heap from the database, given to `run`). A freed
slot comes back here (`Claimer.slot_freed`), the one place that decides what it makes due
again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol

import anyio
import anyio.lowlevel

from ..clock import Clock, sleep
from ..errors import BackendUnavailable, ClaimUncertain
from ..models import Lease, Limit, Task
from ..reconnect_backoff import retrying
from ..worker_options import WorkerOptions
from . import takeover
from .claimable import next_claim_for
from .heap import ClaimHeap
from .presence import LiveWorkers, count_peers
from .spread import ClaimSpread
from .stats import ConsumerStats
from .stopping import Stopping

log = logging.getLogger(__name__)


class Claims(Protocol):
    """The store's claims (`TaskStore`). Invariant: a claim either returns the leases it won
    or raises; one whose reply was lost raises `ClaimUncertain` with the run_ids that may
    hold leases, which `find_claims` turns into the leases that did land."""

    def claim_many(
        self,
        worker_id: str,
        *,
        names: Sequence[str],
        limit: int,
        exclude_keys: Sequence[str] = (),
        until: dt.datetime | None = None,
    ) -> Awaitable[list[Lease]]: ...

    def find_claims(self, worker_id: str, run_ids: Sequence[str]) -> Awaitable[list[Lease]]: ...


class ClaimableReads(Protocol):
    """The store's read of the tasks ``worker_id`` may claim first (`StoreBase.fetch`).
    Invariant: it changes nothing, and returns at most ``limit`` tasks, soonest first."""

    def fetch(
        self, names: Sequence[str], worker_id: str, limit: int, batch_size: int
    ) -> Awaitable[list[Task]]: ...


class Paused(Protocol):
    """The names paused now (`controls.Controls`): none of their tasks is claimed."""

    @property
    def paused(self) -> set[str]: ...


class Slots(Protocol):
    """The executor's slots, as the claimer asks for capacity. Invariant: `start` takes
    every lease handed to it (it runs it, or releases it when it may not run), so a lease won
    is never dropped between the claim and the executor; each start takes one of
    `free_slots`, given back through `Claimer.slot_freed` once that run ends."""

    @property
    def free_slots(self) -> int: ...

    @property
    def running_keys(self) -> list[str]: ...

    @property
    def held_runs(self) -> set[str]: ...

    @property
    def started(self) -> int: ...

    def start(self, lease: Lease) -> None: ...


class LimitedClaims(Protocol):
    """The limiter (`limits.Limiter`): the claims of a limited name, each under a token.
    Invariant: every token taken is held by a started lease or given back; `ended` gives back
    the slot of a run that ended, and names the limited name whose slot freed."""

    @property
    def limited(self) -> dict[str, Limit]: ...

    async def claim_up_to(
        self, worker_id: str, name: str, count: int, running: Sequence[str], won: list[Lease]
    ) -> dt.datetime | None: ...

    def recovered(self, run_ids: Sequence[str], leases: Sequence[Lease]) -> None: ...

    def ended(self, key: str) -> str | None: ...

    def offered(self, task: Task, when: dt.datetime | None) -> dt.datetime | None: ...


class Feed(Protocol):
    """What refills the heap from the database (`intake.Intake`). Invariant: `fetch` reads
    the page of tasks claimable soonest, hands each to the consumer as a change (so to
    `Claimer.offer`), and tells `Claimer.fetched`; retried until the database answers."""

    async def fetch(self) -> None: ...


class Claimer:
    def __init__(
        self,
        claims: Claims,
        reads: ClaimableReads,
        workers: LiveWorkers,
        slots: Slots,
        limiter: LimitedClaims,
        paused: Paused,
        stopping: Stopping,
        *,
        names: Sequence[str],
        options: WorkerOptions,
        clock: Clock,
        stats: ConsumerStats,
    ) -> None:
        self._claims = claims
        self._reads = reads
        self._workers = workers
        self._heap = ClaimHeap(options.heap_size)
        # The claim policy: it lets due keys wait in this claimer's heap. Its peer counts
        # come from the heartbeats (`presence.Presence`, handed this policy) and `_admit`.
        self.spread = ClaimSpread(
            options.claim_spread_ms, self._heap, options.heap_size, options.worker_id
        )
        self._slots = slots
        self._limiter = limiter
        self._paused = paused
        self._stopping = stopping
        self._names = names
        self._options = options
        self._worker_id = options.worker_id
        self._clock = clock
        self._stats = stats
        self._wake = anyio.Event()
        self._uncertain_runs: list[str] = []  # claims that may have been applied unseen
        # ``burst`` or ``max_tasks``: when to ask the feed again whether the work is done
        # (`_done`); now after every run started or ended.
        self._stops_by_itself = options.burst or options.max_tasks is not None
        self._ask_done_at: dt.datetime | None = None
        # Keys seen due while a run of ours still holds them, looked at when it ends
        # (`_set_aside_running`): at most one per slot.
        self._after_run: dict[str, str | None] = {}  # key -> its name

    def wake(self) -> None:
        """Something may be due sooner (a heap entry, a free slot): look again."""
        self._wake.set()

    def slot_freed(self, key: str, written: bool) -> None:
        """A run of ``key`` ended and its slot is free (`Slots`). What it makes due now: the
        waiting keys of its name when that name is limited (a slot of its limit freed), and
        ``key`` itself when the run ended without writing (lease lost or expired, outcome not
        recorded), as no change event will bring it back, or when its written end was
        handed in before the run ended (`_set_aside_running`). Then the claimer looks again
        (one wake-up)."""
        now = self._clock.now()
        name = self._limiter.ended(key)
        if name is not None:
            self._nudge_names([name], now)
        if key in self._after_run:  # its new version was handed in already: none will come
            self._heap.nudge(key, now, self._after_run.pop(key))
        elif not written:
            self._heap.nudge(key, now)
        self._ask_done_at = None
        self.wake()

    def limit_freed(self, *names: str) -> None:
        """A slot of limited ``names`` freed (here, or in another process: `Limiter`), or
        their limits changed (a removed or raised limit lets them start now, whatever window
        they were waiting for): their waiting keys are tried again now."""
        self._nudge_names(names, self._clock.now())
        self.wake()

    def _nudge_names(self, names: Sequence[str], now: dt.datetime) -> None:
        for waiting in self._heap.keys_of(names):
            self._heap.nudge(waiting, now)

    # ------------------------------------------------------------ filling the heap

    def offer(self, task: Task) -> None:
        """``task`` in the heap at its next claim time for this worker (a limited name's not
        before its window frees), noted by the claim policy; the claimer looks again if that
        is sooner than it knew."""
        held = self._slots.held_runs
        when = self._limiter.offered(
            task, next_claim_for(task, self._worker_id, self._clock.now(), held)
        )
        self.spread.offered(task.key, bool(task.options.specific_worker_ids))
        if self._heap.offer(task.key, when, task.version, task.id, task.name):
            self.wake()

    def fetched(self, count: int) -> None:
        """A fetch offered ``count`` tasks (`Feed.fetch`): look again once the heap drains
        only if it may have left some out *and* gave the claimer something to do (a full
        fetch of tasks none of which we can claim now, our own running ones, say, would
        otherwise be repeated back to back for ever)."""
        page = min(self._options.heap_size, self._options.fetch_batch_size)
        self._heap.overflowed = count >= page and len(self._heap) > 0
        self.wake()

    async def claimable_soonest(self) -> list[Task]:
        """The tasks we may claim, soonest first: one page (reading the whole heap's worth read
        thousands of tasks of a large backlog each time)."""
        limit = min(self._options.heap_size, self._options.fetch_batch_size)
        return await self._reads.fetch(self._names, self._worker_id, limit, limit)

    async def run(self, feed: Feed) -> None:
        """Claim while a slot is free and something is due; sleep until the earliest due
        key, a wake-up, or a free slot. ``feed`` refills the heap once it drained after
        dropping entries (given here: it offers what it reads to this claimer)."""
        while True:
            self._wake = wake = anyio.Event()
            now = self._clock.now()
            earliest = self._heap.earliest()
            if self._uncertain_runs and self._slots.free_slots > 0:
                earliest = now  # a lease of ours may be waiting to run (see _claim_due)
            # The spread policy claims greedily while work is due beyond our free slots.
            self.spread.observe(self._slots.free_slots, earliest is not None and earliest <= now)
            if self._slots.free_slots <= 0 or earliest is None or earliest > now:
                if earliest is None and self._heap.overflowed:
                    # Drained after dropping entries: look again, letting the rest of the
                    # process run first (the memory backend's calls never yield).
                    await anyio.lowlevel.checkpoint()
                    await feed.fetch()
                    continue
                deadline = earliest if self._slots.free_slots > 0 else None
                if self._stops_by_itself and not self._slots.running_keys:
                    ask_at = await self._done(now)
                    if ask_at is None:
                        return  # the consumer is stopping
                    if ask_at <= now:
                        continue  # the heap was given what is claimable now
                    deadline = ask_at if deadline is None else min(deadline, ask_at)
                await self._clock.wait_until(deadline, wake)
                continue
            # A claim in flight completes even if claiming stops meanwhile: the leases it won
            # are started (then run or released by the shutdown), never dropped with a reply.
            with anyio.CancelScope(shield=True):
                failed = await self._claim_due(now)
            if failed:  # the database is unreachable: look again after a delay
                await sleep(self._clock, self._options.reconnect_delay(0))

    async def _done(self, now: dt.datetime) -> dt.datetime | None:
        """``burst`` or ``max_tasks``, with nothing running and nothing due in the heap:
        whether the work is done (None: it is stopping) or when to ask again. Asked at once
        after a run started or ended (`slot_freed`, `_start`), else no sooner than
        `_out_of_work` said, so a task that looks claimable yet is not (an expired one not
        yet cancelled, say) costs one read per interval, not a loop of reads."""
        if self._ask_done_at is not None and self._ask_done_at > now:
            return self._ask_done_at
        if self._uncertain_runs:
            return now  # recovered first: a lease of ours may be waiting to run
        again = await self._out_of_work(now)
        self._ask_done_at = again
        return again

    async def _out_of_work(self, now: dt.datetime) -> dt.datetime | None:
        """Stop, and return None, once ``max_tasks`` runs were started (and so have ended),
        or, with ``burst``, once a fresh read finds no task of our unpaused names that we may
        claim now (the heap, bounded and fed by events, may not hold every one). Otherwise
        the tasks claimable now go to the heap (held by a limit, they wait there for its
        window), and the claimer asks again after a poll interval unless a run starts or
        ends first.

        Invariant: the consumer stops only with no handler running and no claim in flight
        (asked only then, from this claimer's loop), so it exits as a graceful stop does."""
        if self._options.max_tasks is not None and self._slots.started >= self._options.max_tasks:
            self._done_by_itself("max_tasks")
            return None
        if self._options.burst:
            due = await self._claimable_now(now)
            if not due:
                self._done_by_itself("burst")
                return None
            for task in due:
                self.offer(task)
        return now + dt.timedelta(milliseconds=self._options.poll_interval_ms)

    async def _claimable_now(self, now: dt.datetime) -> list[Task]:
        """The tasks of our unpaused names that we may claim at ``now``, of one page of those
        claimable soonest (read again, retried until the database answers)."""
        paused = self._paused.paused
        names = [name for name in self._names if name not in paused]
        if not names:
            return []
        limit = min(self._options.heap_size, self._options.fetch_batch_size)
        tasks = await retrying(
            lambda: self._reads.fetch(names, self._worker_id, limit, limit),
            clock=self._clock,
            delay=self._options.reconnect_delay,
            logger=log,
            action="fetch_retry",
        )
        held = self._slots.held_runs
        due = []
        for task in tasks:
            when = next_claim_for(task, self._worker_id, now, held)
            if when is not None and when <= now:
                due.append(task)
        return due

    def _done_by_itself(self, reason: str) -> None:
        log.info(
            "consumer done by itself",
            extra={
                "action": "consumer_done",
                "worker_id": self._worker_id,
                "reason": reason,
                "runs": self._slots.started,
            },
        )
        self._stopping.done(reason)

    async def _admit(self, due: list[str], now: dt.datetime) -> list[str]:
        """Of the due keys, those the claim policy lets this consumer claim now. Before it
        decides on peers counted more than a spread ago, it counts them again: peers that
        stopped or filled up since are not waited for, and peers that started since get
        their share."""
        running = len(self._slots.running_keys)
        if self.spread.stale(now) and self.spread.decides(due, running):
            await count_peers(self._workers, self._names, self._worker_id, self.spread, self._clock)
            now = self._clock.now()
        return self.spread.admit(due, running, self._options.max_running, now)

    async def _claim_due(self, now: dt.datetime) -> bool:
        """Claim what is due; True when the database failed (the caller backs off)."""
        leases: list[Lease] = []  # started whatever happens next: each is a live lease
        try:
            if self._uncertain_runs:
                await self._recover_uncertain_claims()
                return False
            paused = self._paused.paused
            names = [name for name in self._names if name not in paused]
            if not names:  # all paused: resuming fetches them again
                self._heap.pop_due(now)
                return False
            self._set_aside_running(now)
            asked = self._heap.due_keys(now, self._slots.free_slots)
            due = await self._admit(asked, now)
            if asked and not due:
                # The claim policy let them wait (back in the heap for a while): nothing was
                # tried, so nothing is learnt of the other due keys, which stay in the heap
                # (dropping them would leave a claimable task to the backstop's read).
                return False
            limited: dict[str, list[str]] = {}
            for key in due:
                name = self._heap.name_of(key)
                if name in names and name in self._limiter.limited:
                    limited.setdefault(name, []).append(key)
            plain = [name for name in names if name not in self._limiter.limited]
            plain_due = len(due) - sum(map(len, limited.values()))
            if plain and plain_due > 0:
                # Several due and slots for them: one batched claim of three round trips
                # (`store.claims`); one or two go one by one, which costs less.
                leases = await self._claims.claim_many(
                    self._worker_id,
                    names=plain,
                    limit=plain_due,
                    exclude_keys=self._slots.running_keys,
                )
            for name, keys in limited.items():  # each under a token (`Limiter`)
                room = min(len(keys), self._slots.free_slots - len(leases))
                running = [*self._slots.running_keys, *(lease.key for lease in leases)]
                # Each lease won joins ``leases`` at once: a failure later in the call loses none.
                blocked = await self._limiter.claim_up_to(
                    self._worker_id, name, room, running, leases
                )
                if blocked is not None:
                    # All its keys wait in the heap until the window frees, the due ones that
                    # found no free slot to be tried included: they are claimable, and with a
                    # change stream no write would bring them back if they left the heap.
                    self._stats.record("limited", name)
                    self._heap.postpone_all(self._heap.keys_of([name]), blocked)
        except ClaimUncertain as exc:
            self._uncertain_runs.extend(exc.run_ids)  # looked up before any other claim
            log.warning(str(exc), extra={"action": "claim_uncertain"})
            self._start_all(leases)  # won before the failure: they run
            return True
        except BackendUnavailable as exc:
            log.warning(str(exc), extra={"action": "claim_retry"})
            self._start_all(leases)
            return True
        self.spread.claimed(len(due), len(leases), now)
        if not leases:
            return await self._reschedule(self._heap.pop_due(now))
        self._start_all(leases)
        return False

    def _set_aside_running(self, now: dt.datetime) -> None:
        """Due keys that a run of ours still holds leave the heap until that run ends
        (`slot_freed` puts them back, due). A run's end is written before its slot frees (the
        write's reply, the finish batch): the change stream or the poll may hand in the new
        version, due again (a retry without delay), while the run still holds the key. A claim
        leaves out the keys we run, so it would win nothing of them, and a claim that wins
        nothing forgets what was due (`_reschedule`): the retry would wait for a write that
        already came, until a read by state or a fetch found it. Set aside, it is not claimed
        before its run let go of it, and not forgotten."""
        for key in self._slots.running_keys:
            when = self._heap.time_of(key)
            if when is not None and when <= now:
                self._after_run[key] = self._heap.name_of(key)
                self._heap.discard(key)

    async def _reschedule(self, keys: list[str]) -> bool:
        """Nothing due was claimable by us: each key was taken, finished or pushed back by
        writes that wake nobody (`queries.derived.wakes_consumers`). The fetch's read (what we
        may claim, soonest first) says when each may be claimable next: a later time goes back
        in the heap (an expiring lease, a retry); a key not ours, finished, or due yet not
        claimable, waits for a write that wakes us. Not a read of ``keys``: a heap fetched
        while other consumers ran holds thousands of keys they finished."""
        if not keys:
            return False
        self._stats.record("rescheduled")
        try:
            tasks = await self.claimable_soonest()
        except BackendUnavailable as exc:
            log.warning(str(exc), extra={"action": "reschedule_retry"})
            for key in keys:  # look again after the delay, as for a failed claim
                self._heap.nudge(key, self._clock.now())
            return True
        now = self._clock.now()
        held = self._slots.held_runs
        for task in tasks:
            when = next_claim_for(task, self._worker_id, now, held)
            if when is not None and when > now:
                self.offer(task)
        return False

    def _start_all(self, leases: list[Lease]) -> None:
        for lease in leases:
            self._start(lease)

    def _start(self, lease: Lease) -> None:
        self._ask_done_at = None
        self._heap.discard(lease.key)
        self._stats.record("claimed", lease.task.name)
        takeover.report(lease, self._stats)
        self._slots.start(lease)

    async def start_uncertain_claims(self) -> None:
        """At shutdown: leases that uncertain claims may hold are found and started, so the
        shutdown runs or releases them; if the database cannot tell, they expire."""
        if not self._uncertain_runs:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self._recover_uncertain_claims()
            except BackendUnavailable as exc:
                log.warning(str(exc), extra={"action": "claim_uncertain"})

    async def _recover_uncertain_claims(self) -> None:
        """Claims whose leases may have landed unseen (`ClaimUncertain`): looked up in one read
        before any new claim, so each recovered lease runs while it lives, under its token if
        its name is limited."""
        run_ids = list(self._uncertain_runs)
        leases = await self._claims.find_claims(self._worker_id, run_ids)
        del self._uncertain_runs[: len(run_ids)]
        self._limiter.recovered(run_ids, leases)
        for lease in leases:
            # A lease too close to its expiry is refused by the executor as its handler is
            # about to start (`Executor._may_start`), like any claim that waited too long.
            log.info(
                "a claim whose reply was lost is recovered",
                extra={"action": "claim_recovered", "key": lease.key, "run_id": lease.run_id},
            )
            self._start(lease)
