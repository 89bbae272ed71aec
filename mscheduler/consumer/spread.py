"""The ``spread`` claim policy (``WorkerOptions.claim_spread_ms``, on by default): a burst of
tasks is shared out across the live workers of its names instead of all going to whichever
worker looked first. Greedy claiming (``claim_spread_ms=None``) lets one worker take as many
due tasks as it has free slots: six long tasks published at once land on one of three
workers while the others idle, and a crash of that worker delays all six by the lease.

What it counts (`count_peers`, from the live workers, `store.workers`): per name, the peers
that can take a task of it now, its **open peers**: other workers that serve that name, are
alive, and had a free slot at their last heartbeat. A task waits only for the open peers of
its own name; a name with none is claimed greedily. The count is read at each heartbeat,
and again when it is older than a spread (`stale`) and about to decide (`decides`): peers
that stopped or filled up since are not waited for, and peers that started since get their
share.

- A consumer holds at most its share of what it runs and sees due of a name, divided among
  itself and that name's open peers. Idle, it claims its share at once; busy, it lets a new
  task wait ``claim_spread_ms`` while an open peer ran nothing at its last heartbeat, so
  that the idle peer, which claims at once, gets it first. When every open peer was busy
  too, it claims its share at once, as they do theirs (one more when it holds exactly its
  share, so that a task published while every worker runs one waits for none).
- What no peer took in that spread, the workers that let it wait claim as they wake
  together: each its share of it, ``ceil(waited / workers)`` (a single task is claimed
  after one spread, by whoever wakes first). What is left once it took its share waits one
  more spread (peers woken with it may be claiming it now), then is claimed whatever the
  share.
- A peer's liveness is judged as a whole, not name by name: what waited for peers in vain
  shows they are gone (killed since their last heartbeat, they read alive for two
  heartbeats). Every key of a name let wait for its idle peers and still ours to claim a
  spread later (an idle peer claims at once), or a key that waited twice (its open peers
  took nothing for two spreads): those peers (the idle ones; for a key that waited twice,
  every open peer of its name) are not counted, for any of their names, until they beat
  again (`claimed`). A task published alone waits for a dead peer once, one spread; a
  burst, two spreads, once.
- It claims greedily when no peer can be idle, so that the drain of short tasks never waits:
  no open peer serves the name; saturated (it found tasks due with every slot taken, and
  stays so until it has a free slot and nothing due); or when its share fills every free
  slot (more is due than the live workers can run at once).

Its costs: one more small read per heartbeat (the live workers), and one more at most once
a spread while it claims beside running tasks or shares out a burst; and a task held back
waits one spread when its open peers cannot take it after all: they filled up since their
heartbeat (a burst published while every worker runs something waits one spread when their
heartbeats predate their tasks), or they were killed unseen (a spread for a task published
alone, two for a burst, once, whatever their names). Set the spread above the time a peer
takes to see a new task: a moment with change streams, the poll interval
(``poll_interval_ms``) without them, or a peer sees the task only after the wait.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable

from ..models import WorkerInfo
from .heap import ClaimHeap


@dataclasses.dataclass
class _Wave:
    """The keys of a name that waited once, while some are due (`ClaimSpread._share`):
    ``share``, how many of them this worker may claim (``ceil(waited / workers)``, counted at
    the wave's first look), and ``admitted``, how many it admitted so far."""

    share: int
    admitted: int = 0

    def owed(self) -> int:
        """How many more of the wave this worker may claim."""
        return self.share - self.admitted


class ClaimSpread:
    def __init__(self, spread_ms: int | None, heap: ClaimHeap, bound: int, worker_id: str) -> None:
        self._spread = None if spread_ms is None else dt.timedelta(milliseconds=spread_ms)
        self._heap = heap
        self._bound = bound
        self._worker_id = worker_id
        self._waits: dict[str, int] = {}  # how many times a key let peers go first
        # Per name, while keys that waited once are due: its wave (reset once none is due).
        self._waves: dict[str, _Wave] = {}
        # Keys of tasks only some workers may claim (``specific_worker_ids``): not shared out,
        # since the peers this policy would wait for may be unable to claim them.
        self._pinned: set[str] = set()
        # Per name, the worker ids of its open peers (`count_peers`), and of those among them
        # that ran nothing at their last heartbeat.
        self._open: dict[str, list[str]] = {}
        self._idle: dict[str, list[str]] = {}
        self._counted_at: dt.datetime | None = None
        # Per peer, since when it is not believed alive (`claimed`): counted for none of its
        # names until it beats after that moment.
        self._distrusted: dict[str, dt.datetime] = {}
        self._suspects: set[str] = set()  # peers the last look's keys waited for in vain
        self.saturated = False  # tasks were due while every slot was taken (`observe`)

    @property
    def enabled(self) -> bool:
        return self._spread is not None

    def count_peers(self, peers: Iterable[WorkerInfo], now: dt.datetime) -> None:
        """The open peers of each name, from the live workers as read at ``now``: alive,
        not this worker, with a free slot at their last heartbeat, and not distrusted since
        (`claimed`). A full peer cannot take a task, a peer of another name never would, and
        one that left a task it was waited for unclaimed may be dead: none is waited for."""
        counted: dict[str, list[str]] = {}
        idle: dict[str, list[str]] = {}
        listed: set[str] = set()
        for peer in peers:
            listed.add(peer.worker_id)
            if peer.worker_id == self._worker_id or not peer.alive:
                continue
            if peer.running >= peer.max_running:
                continue
            since = self._distrusted.get(peer.worker_id)
            if since is not None and peer.last_seen_at <= since:
                continue
            for name in peer.names:
                counted.setdefault(name, []).append(peer.worker_id)
                if peer.running == 0:
                    idle.setdefault(name, []).append(peer.worker_id)
        # A peer no longer listed left or was found dead: listed again, it beat since.
        self._distrusted = {
            worker_id: since for worker_id, since in self._distrusted.items() if worker_id in listed
        }
        self._open = counted
        self._idle = idle
        self._counted_at = now

    def count_failed(self, now: dt.datetime) -> None:
        """The read of the live workers failed: the count stands, tried again a spread later
        (not at each look while the database is away)."""
        self._counted_at = now

    def stale(self, now: dt.datetime) -> bool:
        """The count is older than a spread: read it again before deciding on it."""
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

    def decides(self, due: list[str], running: int) -> bool:
        """Whether the count of peers decides what of ``due`` is claimed now: not saturated,
        and several keys not pinned to share out, or one beside running tasks (it may be let
        wait). An idle worker's single claim needs no count."""
        if self._spread is None or self.saturated:
            return False
        shared = sum(key not in self._pinned for key in due)
        return shared > 1 or (shared == 1 and running > 0)

    def claimed(self, asked: int, won: int, now: dt.datetime) -> None:
        """A claim of the last look's ``asked`` admitted keys won ``won`` tasks. When that
        look claimed keys that waited for peers in vain (`_share`: every key of a name let
        wait for its idle peers, or keys that waited twice) and the claim won as many tasks
        as it asked, those peers did not take what they were waited for: they are not counted,
        for any of their names, until they beat after ``now``. Liveness, not a count per name:
        a peer killed since its heartbeat reads alive for two heartbeats, and would hold back
        a task of each of its names in turn. (A claim that won fewer may have met keys its
        peers took long ago, still in the heap: no evidence. A live peer distrusted wrongly,
        say one that took other tasks, is counted again at its next heartbeat: until then its
        names are claimed without waiting for it.)"""
        if asked and won >= asked and self._suspects:
            for worker_id in self._suspects:
                self._distrusted[worker_id] = now
            self._open = _without(self._open, self._suspects)
            self._idle = _without(self._idle, self._suspects)
        self._suspects = set()

    def admit(self, due: list[str], running: int, capacity: int, now: dt.datetime) -> list[str]:
        """Of ``due`` (as many due keys as there are free slots), the keys to claim now; the
        keys let wait go back in the heap for ``claim_spread_ms``. Keys pinned to named
        workers, and keys of a name without open peers, are claimed at once; each other
        name's keys are shared out (`_share`)."""
        self._suspects = set()
        if self._spread is None or not due or self.saturated:
            return due
        admitted: list[str] = []
        shared: dict[str, list[str]] = {}
        for key in due:
            name = self._heap.name_of(key)
            if key in self._pinned or name is None or not self._open.get(name):
                admitted.append(key)
            else:
                shared.setdefault(name, []).append(key)
        for name in [name for name in self._waves if name not in shared]:
            del self._waves[name]  # nothing of it due: its wave is over
        later: list[str] = []
        for name, keys in shared.items():
            taken, waiting = self._share(name, keys, running + len(admitted), capacity, now)
            admitted += taken
            later += waiting
        if later:
            if len(self._waits) + len(later) > self._bound:  # marks of keys long gone
                self._waits.clear()
            for key in later:
                self._waits[key] = self._waits.get(key, 0) + 1
            self._heap.postpone_all(later, now + self._spread)
        return admitted

    def _share(
        self, name: str, due: list[str], running: int, capacity: int, now: dt.datetime
    ) -> tuple[list[str], list[str]]:
        """Of the due keys of ``name`` (which has open peers), those to claim now, and those
        to let wait. Its share is ``ceil((running + due of the name) / (open peers + 1))``
        tasks held at once, the due counted up to what they can all run (``capacity`` each).
        Idle, it claims up to its share at once; busy, new keys wait while an open peer was
        idle at its last heartbeat, else it claims its share at once, as its busy peers do
        theirs (one task more when it holds exactly its share). Of the keys that waited
        once, it claims its share of the wave (``ceil(waited / workers)``, counted as they
        came due, whatever its running tasks), and the rest wait again; keys that waited
        twice are claimed at once."""
        live = len(self._open[name]) + 1
        waits = self._waits
        seen = [
            key
            for key in self._heap.due_keys(now, live * capacity)
            if key not in self._pinned and self._heap.name_of(key) == name
        ]
        share = max(1, math.ceil((running + max(len(due), len(seen))) / live))
        if share - running >= len(due):
            return due, []
        quota = max(0, share - running)
        overdue = [key for key in due if waits.get(key, 0) >= 2]
        waited = [key for key in due if waits.get(key) == 1]
        fresh = [key for key in due if not waits.get(key)]
        if running == 0:
            admitted = [*waited, *fresh][:quota]
        elif self._idle.get(name):  # an idle peer may take the new keys: they wait
            admitted = waited[:quota]
        else:  # its peers are busy too: its share at once, as they take theirs; at its
            # share, one task more (every worker running one, a new task waits for none)
            room = share - running
            admitted = [*waited, *fresh][: room if room > 0 else int(room == 0)]
        if waited:
            idle = self._idle.get(name, [])
            wave_keys: list[str] = []
            if name not in self._waves or idle:
                # Of every key of the name that waited once, due now or a moment later (a
                # burst seen in several events was let wait a moment apart).
                wave_keys = [key for key in self._heap.keys_of([name]) if waits.get(key) == 1]
            if name not in self._waves:  # the first look of a wave: what is its share
                self._waves[name] = _Wave(share=math.ceil(len(wave_keys) / live))
            wave = self._waves[name]
            owed = wave.owed() - sum(waits.get(key) == 1 for key in admitted)
            taken = set(admitted)
            admitted += [key for key in waited if key not in taken][: max(0, owed)]
            wave.admitted += sum(waits.get(key) == 1 for key in admitted)
            if idle and set(admitted).issuperset(wave_keys):
                # None of what waited for the idle peers was taken by them in a spread (an
                # idle peer claims at once): if this claim wins it all, they are not alive.
                self._suspects.update(idle)
        else:
            self._waves.pop(name, None)
        if overdue:  # left for two spreads: none of its open peers takes tasks
            self._suspects.update(self._open[name])
        admitted += overdue
        chosen = set(admitted)
        # Every other due key of the name waits, not only those of this look: the claimer
        # would otherwise look again at once and admit from the rest.
        later = [key for key in dict.fromkeys([*due, *seen]) if key not in chosen]
        later = [key for key in later if waits.get(key, 0) < 2]
        return admitted, later


def _without(peers: dict[str, list[str]], gone: set[str]) -> dict[str, list[str]]:
    """``peers`` of each name, less ``gone``; a name left with none is dropped."""
    kept = {name: [p for p in ids if p not in gone] for name, ids in peers.items()}
    return {name: ids for name, ids in kept.items() if ids}
