"""The ``spread`` claim policy (``WorkerOptions.claim_spread_ms``, off by default): a burst of
tasks is shared out across the live workers of its names instead of all going to whichever
worker looked first. Greedy claiming (``claim_spread_ms=None``) lets one worker take as many
due tasks as it has free slots: six long tasks published at once land on one of three
workers while the others idle, and a crash of that worker delays all six by the lease.

- A consumer holds at most its share of what it runs and sees due, divided by the live
  workers serving its names (counted from the registry, `store.workers`, at each heartbeat).
- A consumer already running a task lets a due task wait ``claim_spread_ms`` before
  claiming it, so that an idle peer, which claims at once, gets it first; one that waited
  once is claimed within the share (a worker whose running tasks fill its share lets it
  wait again). Tasks no peer took after two waits are claimed whatever the share, a share
  of them per wait: peers that are busy, full, serve other names or are dead (but not yet
  found so) never leave a task unclaimed, but they slow a burst by a wait per share (why
  the policy is off by default).
- It claims greedily when no peer can be idle, so that the drain of short tasks never waits:
  alone; saturated (it found tasks due with every slot taken, and stays so until it has a
  free slot and nothing due); or when its share fills every free slot (more is due than the
  live workers can run at once).

It costs one more small read per heartbeat (the live workers) and, on a worker that is busy
but not saturated, a wait of ``claim_spread_ms`` for each task no idle peer took: set it above
the time a peer takes to see a new task (the poll interval on a server without change
streams; a moment with them).
"""

from __future__ import annotations

import datetime as dt
import math

from .heap import ClaimHeap


class ClaimSpread:
    def __init__(self, spread_ms: int | None, heap: ClaimHeap, bound: int) -> None:
        self._spread = None if spread_ms is None else dt.timedelta(milliseconds=spread_ms)
        self._heap = heap
        self._bound = bound
        self._waits: dict[str, int] = {}  # how many times a key let peers go first
        # Keys of tasks only some workers may claim (``specific_worker_ids``): not shared out,
        # since the peers this policy would wait for may be unable to claim them.
        self._pinned: set[str] = set()
        self.live_workers = 1  # serving our names, ourselves included (`Presence` sets it)
        self.saturated = False  # tasks were due while every slot was taken (`observe`)

    @property
    def enabled(self) -> bool:
        return self._spread is not None

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

    def admit(self, due: list[str], running: int, capacity: int, now: dt.datetime) -> list[str]:
        """Of ``due`` (as many due keys as there are free slots), the keys to claim now; the
        others, and the heap's other due keys, go back in the heap for ``claim_spread_ms``.

        Keys pinned to named workers are claimed at once. The others: greedy alone,
        saturated, or when its share fills its free slots. Else its share is
        ``ceil((running + due in the heap) / live workers)`` tasks held at once (counted up
        to what the live workers can run, ``capacity`` each). Idle, it claims up to its share
        at once; busy, only keys that already waited once, within its share.
        Keys that waited twice (no peer took them: they are busy, full, serve other names or
        are gone) are claimed whatever the share, a live worker's share of them per wait, so
        nothing starves."""
        live = max(1, self.live_workers)
        if self._spread is None or not due or self.saturated or live == 1:
            return due
        pinned = [key for key in due if key in self._pinned]
        if pinned:  # claimed at once; the policy shares out the others
            due = [key for key in due if key not in self._pinned]
            return pinned + self.admit(due, running + len(pinned), capacity, now)
        seen = [key for key in self._heap.due_keys(now, live * capacity) if key not in self._pinned]
        share = max(1, math.ceil((running + max(len(due), len(seen))) / live))
        if share - running >= len(due):
            return due
        quota = share - running
        overdue = [key for key in due if self._waits.get(key, 0) >= 2]
        eligible = due if running == 0 else [key for key in due if self._waits.get(key, 0)]
        admitted = [key for key in eligible if key not in overdue][: max(0, quota)]
        # Overdue keys a share at a time, the rest again after a wait: every waiting worker
        # finds them overdue at about the same moment, and they too take a share each.
        admitted += overdue[: max(1, math.ceil(len(overdue) / live))]
        chosen = set(admitted)
        # Every other due key waits, not only those of this look: the claimer would
        # otherwise look again at once and admit from the rest.
        later = [key for key in dict.fromkeys([*due, *seen]) if key not in chosen]
        # An admitted key keeps its mark (the claim may win another task and leave it due,
        # and it has waited already); marks are dropped wholesale at the heap's bound.
        if len(self._waits) + len(later) > self._bound:
            self._waits.clear()
        for key in later:
            self._waits[key] = self._waits.get(key, 0) + 1
        if later:
            self._heap.postpone_all(later, now + self._spread)
        return admitted
