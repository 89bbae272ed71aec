"""The ``spread`` claim policy (``WorkerOptions.claim_spread_ms``): long tasks shared out across
the live workers instead of all going to whichever worker looked first.

By default (greedy) a consumer claims as many due tasks as it has free slots: the best
throughput on short tasks, but a burst of six long tasks all lands on the first worker to
look, and a crash of that worker delays all six by the lease. Under ``spread``:

- a consumer holds at most its share of what it runs and sees due, divided by the live
  workers serving its names (counted from the registry, `store.workers`, at each heartbeat);
- a consumer already running a task lets a due task wait ``claim_spread_ms`` before
  claiming it, so that an idle peer, which claims at once, gets it first. Tasks no peer took
  after two waits are claimed whatever the share, a share of them per wait: peers that are
  busy or dead (but not yet stale in the registry) never leave a task unclaimed.

It costs one more small read per heartbeat (the live workers) and, while busy, a few
``claim_spread_ms`` of extra wait per task: set it above the time a peer takes to see a new
task (the poll interval on a server without change streams; a moment with them).
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
        self.live_workers = 1  # serving our names, ourselves included (`Presence` sets it)

    @property
    def enabled(self) -> bool:
        return self._spread is not None

    def admit(self, due: list[str], running: int, now: dt.datetime) -> list[str]:
        """The due keys to claim now; the others go back in the heap for ``claim_spread_ms``.

        Its share is ``ceil((running + due) / live workers)`` tasks held at once. Idle, it
        claims up to its share at once; busy, only keys that already waited once, within its
        share. Keys that waited twice (no peer took them: they are busy or gone) are claimed
        whatever the share, a live worker's share of them per wait, so nothing starves."""
        if self._spread is None or not due:
            return due
        live = max(1, self.live_workers)
        share = max(1, math.ceil((running + len(due)) / live))
        quota = share - running
        overdue = [key for key in due if self._waits.get(key, 0) >= 2]
        eligible = due if running == 0 else [key for key in due if self._waits.get(key, 0)]
        admitted = [key for key in eligible if key not in overdue][: max(0, quota)]
        # Overdue keys a share at a time, the rest again after a wait: every waiting worker
        # finds them overdue at about the same moment, and they too take a share each.
        admitted += overdue[: max(1, math.ceil(len(overdue) / live))]
        later = [key for key in due if key not in admitted]
        # An admitted key keeps its mark (the claim may win another task and leave it due,
        # and it has waited already); marks are dropped wholesale at the heap's bound.
        if len(self._waits) + len(later) > self._bound:
            self._waits.clear()
        for key in later:
            self._waits[key] = self._waits.get(key, 0) + 1
        if later:
            self._heap.postpone_all(later, now + self._spread)
        return admitted
