"""The poll, where the server grants no change stream: one read per interval for the whole
process (`Poller.poll_once`): the tasks of the subscribers' names written since the previous
read began, less `CLOCK_SKEW` (writers stamp ``updated_at`` with their own clocks); and every
`STATE_READ_INTERVAL` at most, read by state rather than by that stamp, the consumers' tasks
due for a claim and the waiters' tasks that ended. A write stamped long before it became
visible (a slow transaction) escapes the first read, never the others.

Invariant: each version of a task goes to each subscriber once (`Version`). The poll's place
(the time of its last read, the versions it handed out) is owned by one `Poller`, which the
hub replaces when its place must go (nobody subscribes, or the stream took over).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...clock import Clock
from ...models import Task
from ...store.base import KEYS_PER_READ, StoreBase
from .filters import may_wake
from .subscriptions import Subscription

# How far behind the previous poll a poll reads again: writers' clocks within this of ours,
# and a write in flight across a poll, are seen there; the reads by state cover the rest.
CLOCK_SKEW = dt.timedelta(seconds=1)
# How far behind the previous read a read the signal brought reads again: a write in flight
# across it, a writer's clock a little behind ours. Such reads come a fraction of a second
# apart, and each would read the last `CLOCK_SKEW` of writes again; the poll at its interval
# still reads from `CLOCK_SKEW` behind the previous poll, for a clock further behind.
SIGNALLED_SKEW = dt.timedelta(milliseconds=250)
# The tasks due soonest of one name that a poll reads for the consumers: a due task the time
# window missed is found once it is among them, as consumers claim in that order anyway.
DUE_PAGE = 20
# Names whose due tasks one poll reads, and waited keys whose end it reads, taken in turns:
# the cost of a poll stays bounded whatever the names and keys (the rest wait a few polls).
DUE_NAMES_PER_POLL = 8
ENDED_KEYS_PER_POLL = KEYS_PER_READ  # one read
# How often the poll reads by state, at most: a write that showed up late is rare (a slow
# transaction, a clock behind), and this bounds what catching it costs a busy process.
STATE_READ_INTERVAL = dt.timedelta(seconds=5)
# How often a polling process reads the signal (`store.signal`) between its polls, and so
# how late at most it reads a write that signalled (a publish, a retry, a freed slot, a
# dependent told, a control change) after it landed: one read by ``_id`` of a small document.
# Every `SIGNAL_INTERVAL` while it moved within `SIGNAL_IDLE_AFTER`; every
# `SIGNAL_IDLE_INTERVAL` after that, so an idle process costs the server a few such reads a
# second, and the first task after an idle time waits at most that longer interval.
SIGNAL_INTERVAL = dt.timedelta(milliseconds=100)
SIGNAL_IDLE_INTERVAL = dt.timedelta(milliseconds=200)
SIGNAL_IDLE_AFTER = dt.timedelta(seconds=5)


class Poller:
    """The poll's reads and its place, for one `TaskHub`."""

    def __init__(self, store: StoreBase, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._since: dt.datetime | None = None  # where the next poll at its interval reads from
        self._read_at: dt.datetime | None = None  # when the previous read began
        self._seen: dict[str, Version] = {}  # key -> the version handed out
        self._due_seen: dict[str, Version] = {}  # ... to consumers, read as due
        self._due_turn = 0
        self._ended_turn = 0
        self._read_by_state_at: dt.datetime | None = None

    async def poll_once(
        self,
        subs: Sequence[Subscription],
        hand_out: Callable[[Task, bool], None],
        *,
        signalled: bool = False,
    ) -> None:
        """A read of writes, and reads by state, each only while someone needs it:

        - the tasks of every subscriber's names (a waiter's, once read) written since the
          previous poll began (less `CLOCK_SKEW`): the fast path, every kind of write, for
          every subscriber; and the waited keys never read yet (a task a flow will publish);
        - at most every `STATE_READ_INTERVAL`, the end of waited keys, and the due tasks of
          consumers' names (the first `DUE_PAGE` of a name), a few names and keys a time, in
          turns: read by state, not by the time of a write, as a write is stamped before it
          is sent and may become visible after the poll passed its stamp (a transaction's, any
          write on a server that stalls), and a lease expires without a write at all. Due
          tasks, read without their payload, go to consumers alone.

        Each version of a task is handed out once to each subscriber: not again in the
        overlap of two polls, nor while it stays due (a limit, a pause, a busy consumer); an
        older version never after a newer one. A version the consumers were not handed (a
        claim, read by the read of writes) goes to them once read as due (`Version`).

        ``signalled``: a read the signal brought between polls (`store.signal`): the writes
        since `SIGNALLED_SKEW` behind the previous read only; the next poll at its interval
        reads from where it would have, so what this read missed is read there."""
        started = self._clock.now()
        signalled = signalled and self._since is not None  # the first read is a poll's
        since = self._since or started - CLOCK_SKEW
        if signalled and self._read_at is not None:
            since = max(since, self._read_at - SIGNALLED_SKEW)
        self._read_at = started
        wakes: set[str] = set()
        named: set[str] = set()
        every_name = False
        waiting: set[str] = set()
        unnamed: set[str] = set()
        for sub in subs:
            wakes |= sub.wakes
            named |= sub.names | {name for name in sub.every if name is not None}
            every_name = every_name or None in sub.every
            waiting |= sub.waiting
            unnamed |= sub.unnamed
        written: list[Task] = []
        if wakes or named or every_name:
            names = None if every_name else sorted(wakes | named)
            written = await self._store.changed_since(since, names)
        if unnamed:
            written += await self._store.get_many(sorted(unnamed))
        ended: list[Task] = []
        due: list[Task] = []
        due_names: list[str] = []
        workers: set[str] | None = set()
        for sub in subs:
            if sub.wakes and workers is not None:
                workers = None if sub.worker_id is None else workers | {sub.worker_id}
        last = self._read_by_state_at
        if last is None or started - last >= STATE_READ_INTERVAL:
            self._read_by_state_at = started
            keys, self._ended_turn = _in_turn(
                sorted(waiting - unnamed), self._ended_turn, ENDED_KEYS_PER_POLL
            )
            ended = await self._store.ended(keys) if keys else []
            due_names, self._due_turn = _in_turn(sorted(wakes), self._due_turn, DUE_NAMES_PER_POLL)
            for name in due_names:
                due += await self._store.due(
                    name, started, DUE_PAGE, None if workers is None else sorted(workers)
                )
        handed: dict[str, Version] = {}
        for task in [*written, *ended]:
            if _newer(task, self._seen, handed):
                woke = may_wake(task, started)
                handed[task.key] = Version(task.id, task.version, woke, task.name)
                hand_out(task, woke)
        for task in due:
            if _new_to_consumers(task, self._seen, handed, self._due_seen):
                handed[task.key] = Version(task.id, task.version, True, task.name)
                for sub in subs:
                    if task.name in sub.wakes:
                        sub.deliver(task)
        # What the next poll may read again, and no more: the overlap's writes for everyone,
        # each as it went out (to the consumers or not); the due tasks, for the consumers, of
        # this poll's names and of those not read now. Every due task read here went to the
        # consumers, now or before, unless a newer version of it was read. A signalled read
        # leaves where the next poll reads from: what the reads since that poll's place
        # handed out is kept until that poll, which reads it all again.
        known = {**self._seen, **handed}
        if signalled and self._since is not None:
            keep_since = self._since
            self._seen = dict(self._seen)
        else:
            keep_since = self._since = started - CLOCK_SKEW
            self._seen = {}
        for task in [*written, *ended]:
            was = known.get(task.key)
            if (
                task.updated_at >= keep_since
                and was is not None
                and not _newer(task, {task.key: was})
            ):
                self._seen[task.key] = was
        read = set(due_names)
        self._due_seen = {
            key: seen for key, seen in self._due_seen.items() if seen.name not in read
        }
        self._due_seen.update((t.key, Version(t.id, t.version, True, t.name)) for t in due)


class Version(NamedTuple):
    """A version of a task the poll handed out, and whether the consumers had it: a due
    task always goes to them, a write only when it may give them work (`may_wake`).

    Invariant: each version of a task goes to each subscriber once, and a version the
    consumers did not get counts as handed out to everyone but them: read again as due
    (its lease expired, its retry came), it goes to the consumers then."""

    id: Any
    version: int
    to_consumers: bool
    name: str


def _newer(task: Task, *handed_out: dict[str, Version]) -> bool:
    """Whether ``task`` is a later version than any of ``handed_out`` holds; a key deleted
    and published again has a new ``_id``."""
    for seen in handed_out:
        was = seen.get(task.key)
        if was is not None and was.id == task.id and was.version >= task.version:
            return False
    return True


def _new_to_consumers(task: Task, *handed_out: dict[str, Version]) -> bool:
    """Whether the consumers have had neither this version of ``task`` nor a newer one
    (a newer one handed to anyone makes this one stale)."""
    for seen in handed_out:
        was = seen.get(task.key)
        if was is None or was.id != task.id:
            continue
        if was.version > task.version or (was.version == task.version and was.to_consumers):
            return False
    return True


def _in_turn(items: list[str], turn: int, count: int) -> tuple[list[str], int]:
    """``count`` of ``items`` from position ``turn`` on, wrapping; and the next turn."""
    if len(items) <= count:
        return items, 0
    turn %= len(items)
    return (items[turn:] + items[:turn])[:count], turn + count
