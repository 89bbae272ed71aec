"""`Intake`: what reaches a consumer from the database. The writes its listener hears, the
pages its fetches read and a resync's reads are each handed, as the task after the write, to
the executor (a change of a task it runs: a cancel, new options), to the limiter (a run of a
limited name ended elsewhere) and to the claimer's heap (`Claimer.offer`).

It also catches up the dependents a finished task's writer did not tell: when this process
failed to (`services.dependents.OwedDependents`), and when a change shows a finished task
still ``dependents_notified: false`` after a grace period (its writer died or lost the
network): `recovery_loop`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

import anyio

from ..clock import Clock
from ..models import Task
from ..reconnect_backoff import retrying
from ..services.dependents import OwedDependents
from ..store.components import Store
from ..worker_options import WorkerOptions
from .claimer import Claimer
from .executor import Executor
from .limits import Limiter
from .stats import ConsumerStats

log = logging.getLogger(__name__)

# How long a finished task may stay "dependents not told" before a consumer that saw it tells
# them itself: far beyond the writer's next round trip, so normally it is done by then.
_DEPENDENTS_GRACE_S = 10.0


class Intake:
    """A consumer's intake of tasks (`listener.Changes`, and `claimer.Feed`)."""

    def __init__(
        self,
        store: Store,
        owed: OwedDependents,
        claimer: Claimer,
        runs: Executor,
        limiter: Limiter,
        *,
        names: Sequence[str],
        options: WorkerOptions,
        clock: Clock,
        stats: ConsumerStats,
    ) -> None:
        self._store = store
        self._owed = owed
        self._claimer = claimer
        self._runs = runs
        self._limiter = limiter
        self._names = names
        self._options = options
        self._clock = clock
        self._stats = stats
        self._fetched = False  # the first fetch is done (`limits` fetches again after it)
        # Keys of finished tasks whose dependents may be stranded, and when to check.
        self._recovery_checks: dict[str, dt.datetime] = {}
        self._recovery_wake = anyio.Event()

    def holds(self, key: str) -> bool:
        """Whether this consumer runs ``key``: its every change is heard."""
        return self._runs.holds(key)

    def heard(self, task: Task) -> None:
        """A write the listener heard, as the task after it."""
        self._stats.record("events", task.name)
        self.changed(task)

    def changed(self, task: Task) -> None:
        """A task as heard or read: to the executor, the limiter and the heap."""
        self._runs.on_change(task)
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
        self._claimer.offer(task)

    async def fetch(self) -> None:
        """Fill the heap with the tasks claimable soonest, one page of them (the next page is
        read once the heap drains, so a consumer's memory does not grow with the backlog);
        retried until the database answers."""
        tasks = await retrying(
            self._read_claimable,
            clock=self._clock,
            delay=self._options.reconnect_delay,
            logger=log,
            action="fetch_retry",
        )
        for task in tasks:
            self.changed(task)  # when polling, the only way a running task's change is seen
        self._claimer.fetched(len(tasks))

    async def first_fetch(self) -> None:
        """The fetch at start, once the stream is open and the limits known."""
        await self.fetch()
        self._fetched = True

    async def resync(self) -> None:
        """Told by the hub that events for this consumer were lost (it fell behind, or the
        stream lost its place): a page of the claimable tasks, and the tasks it runs, read by
        key. Invariant: every change of a running task reaches its executor, lost events
        included: a cancel, or new options that exclude this worker, is among them, and a
        page of the claimable tasks need not reach a running one (a backlog due sooner
        fills it)."""
        await self.fetch()
        keys = self._runs.running_keys
        if not keys:
            return
        tasks = await retrying(
            lambda: self._store.get_many(keys),
            clock=self._clock,
            delay=self._options.reconnect_delay,
            logger=log,
            action="fetch_retry",
        )
        for task in tasks:
            self._runs.on_change(task)

    async def _read_claimable(self) -> list[Task]:
        tasks = await self._claimer.claimable_soonest()
        await self._owed.recover()
        return tasks

    async def limits(self) -> None:
        """Read our names' limits (`Controls.limit_loop`: at start and on each change): the
        due keys of a name whose limit changed are tried at once, whatever window they were
        waiting for (a removed or raised limit lets them start now); after the first fetch,
        a fetch notes the keys of a newly limited name (its tasks are claimed under tokens)."""
        changed = await self._limiter.refresh(self._names, self._runs.running_leases)
        if not changed:
            return
        self._claimer.limit_freed(*changed)
        if self._fetched:
            await self.fetch()

    def _wake_recovery(self) -> None:
        self._recovery_checks[""] = self._clock.now()  # "": owed by this process, now
        self._recovery_wake.set()

    async def recovery_loop(self) -> None:
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
                    delay=self._options.reconnect_delay,
                    logger=log,
                    action="recovery_retry",
                )
                # Checks that came due by ``now`` are covered by this recovery; later ones
                # (a task that ended meanwhile) stay.
                self._recovery_checks = {k: t for k, t in self._recovery_checks.items() if t > now}
        finally:
            unlisten()
