"""The ``spread`` claim policy (``WorkerOptions.claim_spread_ms``, on by default): a burst of
tasks is shared out across the live workers of its names instead of all going to whichever
worker looked first. Greedy claiming (``claim_spread_ms=None``) lets one worker take as many
due tasks as it has free slots: six long tasks published at once land on one of three
workers while the others idle, and a crash of that worker delays all six by the lease.

What it counts (`count_peers`, from the live workers, `store.workers`): per name, the peers
that can take a task of it now, its **open peers**: other workers that serve that name, are
alive, and had a free slot at their last heartbeat. A task waits only for the open peers of
its own name; a name with none is claimed greedily. The count is read at each heartbeat,
and again before a task is let wait when it is older than a spread (`stale`), so peers that
stopped or filled up since are not waited for.

- A consumer holds at most its share of what it runs and sees due of a name, divided among
  itself and that name's open peers. Idle, it claims its share at once; busy, it lets a new
  task wait ``claim_spread_ms``, so that an idle peer, which claims at once, gets it first.
- A task waits at most one spread. What no peer took during it is claimed by the workers
  that let it wait, a share of it per look, each look after the others woken with it had
  theirs (`holds_back`: the claimer yields first): workers woken together split it evenly,
  and a worker whose peers died unseen (killed since their last heartbeat still read alive)
  drains it at full speed, one look per share.
- It claims greedily when no peer can be idle, so that the drain of short tasks never waits:
  no open peer serves the name; saturated (it found tasks due with every slot taken, and
  stays so until it has a free slot and nothing due); or when its share fills every free
  slot (more is due than the live workers can run at once).

Its costs: one more small read per heartbeat (the live workers), and one more before a task
is let wait, at most once a spread; a task held back waits one spread when its open peers
cannot take it after all (they died unseen, or filled up since their heartbeat). Set the
spread above the time a peer takes to see a new task: a moment with change streams, the poll
interval (``poll_interval_ms``) without them, or a peer sees the task only after the wait.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable

from ..models import WorkerInfo
from .heap import ClaimHeap


class ClaimSpread:
    def __init__(self, spread_ms: int | None, heap: ClaimHeap, bound: int, worker_id: str) -> None:
        self._spread = None if spread_ms is None else dt.timedelta(milliseconds=spread_ms)
        self._heap = heap
        self._bound = bound
        self._worker_id = worker_id
        self._waited: set[str] = set()  # keys that let peers go first once: they wait no more
        # Keys of tasks only some workers may claim (``specific_worker_ids``): not shared out,
        # since the peers this policy would wait for may be unable to claim them.
        self._pinned: set[str] = set()
        self._open: dict[str, int] = {}  # per name, its open peers (`count_peers`)
        self._counted_at: dt.datetime | None = None
        self.saturated = False  # tasks were due while every slot was taken (`observe`)
        self.holds_back = False  # the last look left keys that waited once due (see `admit`)

    @property
    def enabled(self) -> bool:
        return self._spread is not None

    def count_peers(self, peers: Iterable[WorkerInfo], now: dt.datetime) -> None:
        """The open peers of each name, from the live workers as read at ``now``: alive,
        not this worker, with a free slot at their last heartbeat. A full peer cannot take a
        task, and a peer of another name never would: neither is waited for."""
        counted: dict[str, int] = {}
        for peer in peers:
            if peer.worker_id == self._worker_id or not peer.alive:
                continue
            if peer.running >= peer.max_running:
                continue
            for name in peer.names:
                counted[name] = counted.get(name, 0) + 1
        self._open = counted
        self._counted_at = now

    def stale(self, now: dt.datetime) -> bool:
        """The count is older than a spread: read it again before a task waits on it."""
        if self._spread is None:
            return False
        return self._counted_at is None or now - self._counted_at >= self._spread

    def offered(self, key: str, pinned: bool) -> None:
        """A task offered to the heap: whether it is pinned to named workers."""
        if not pinned:
            self._pinned.discard(key)
            return
        if len(self._pinned) >= self._bound:  # stale marks of keys gone from the heap
            self._pinned.clear()
        self._pinned.add(key)

    def observe(self, free_slots: int, due: bool) -> None:
        """What the claimer found as it looked: saturated once tasks were due with no free
        slot, and no longer once a slot was free with nothing due."""
        if free_slots <= 0 and due:
            self.saturated = True
        elif free_slots > 0 and not due:
            self.saturated = False

    def would_hold(self, due: list[str], running: int, capacity: int, now: dt.datetime) -> bool:
        """Whether `admit` would let a new task wait (nothing changed): then its count of
        peers had better be fresh."""
        return bool(self._plan(due, running, capacity, now)[1])

    def admit(self, due: list[str], running: int, capacity: int, now: dt.datetime) -> list[str]:
        """Of ``due`` (as many due keys as there are free slots), the keys to claim now. New
        keys held back go back in the heap for ``claim_spread_ms``; keys that waited once
        are left due, and `holds_back` tells the claimer to let the others look first."""
        admitted, later = self._plan(due, running, capacity, now)
        chosen = set(admitted)
        self.holds_back = any(key in self._waited and key not in chosen for key in due)
        if later and self._spread is not None:
            if len(self._waited) + len(later) > self._bound:  # marks of keys long gone
                self._waited.clear()
            self._waited.update(later)
            self._heap.postpone_all(later, now + self._spread)
        return admitted

    def _plan(
        self, due: list[str], running: int, capacity: int, now: dt.datetime
    ) -> tuple[list[str], list[str]]:
        """The keys to claim now, and the new keys to let wait a spread. Keys pinned to named
        workers, and keys of a name without open peers, are claimed at once; each other
        name's keys are shared out (`_share`)."""
        if self._spread is None or not due or self.saturated:
            return due, []
        admitted: list[str] = []
        shared: dict[str, list[str]] = {}
        for key in due:
            name = self._heap.name_of(key)
            if key in self._pinned or name is None or not self._open.get(name):
                admitted.append(key)
            else:
                shared.setdefault(name, []).append(key)
        later: list[str] = []
        for name, keys in shared.items():
            taken, waiting = self._share(name, keys, running + len(admitted), capacity, now)
            admitted += taken
            later += waiting
        return admitted, later

    def _share(
        self, name: str, due: list[str], running: int, capacity: int, now: dt.datetime
    ) -> tuple[list[str], list[str]]:
        """Of the due keys of ``name`` (which has open peers), those to claim now, and the new
        keys to let wait. Its share is ``ceil((running + due of the name) / (open peers +
        1))`` tasks held at once, the due counted up to what they can all run (``capacity``
        each). Idle, it claims up to its share at once; busy, only keys that waited once,
        within its share. Keys that waited once never wait again: at least a share of them
        (``ceil(waited / workers)``) is claimed at each look."""
        live = self._open[name] + 1
        seen = [
            key
            for key in self._heap.due_keys(now, live * capacity)
            if key not in self._pinned and self._heap.name_of(key) == name
        ]
        share = max(1, math.ceil((running + max(len(due), len(seen))) / live))
        if share - running >= len(due):
            return due, []
        quota = max(0, share - running)
        waited = [key for key in due if key in self._waited]
        admitted = (due if running == 0 else waited)[:quota]
        waited_seen = sum(key in self._waited for key in dict.fromkeys([*due, *seen]))
        owed = math.ceil(waited_seen / live) - sum(key in self._waited for key in admitted)
        admitted += [key for key in waited if key not in set(admitted)][: max(0, owed)]
        chosen = set(admitted)
        # Every other new due key of the name waits, not only those of this look: the
        # claimer would otherwise look again at once and admit from the rest.
        later = [
            key
            for key in dict.fromkeys([*due, *seen])
            if key not in chosen and key not in self._waited
        ]
        return admitted, later
