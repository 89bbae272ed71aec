"""The consumer's view of what it may claim next: one entry per key, earliest time first."""

from __future__ import annotations

import collections
import datetime as dt
import heapq
from collections.abc import Collection


class ClaimHeap:
    """Next-claim times keyed by task key, bounded, fed by change events and fetches.

    - One entry per key: a newer offer replaces the older one (lazy deletion in the heap).
    - Offers carry the document ``version``; an older snapshot than one already seen (a fetch
      racing a change event, an event delivered twice or out of order) changes nothing.
      Versions are compared only within one incarnation of a key (its ``_id``): a key purged
      or deleted and published again starts at version 1 with a new ``_id``, and that new task
      is always taken in (compared with the old incarnation's versions, it could be hidden).
    - Never more than ``bound`` entries: past it the latest are dropped and ``overflowed`` is
      set, so the fetcher knows to look again once the heap drains.
    - The name of each key offered with one is kept exactly as long as its entry (`name_of`,
      `keys_of`: a limited name's keys are claimed under its limit and wait for its window),
      so what the heap knows of names is bounded by it too, whatever leaves it and how.
    """

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.overflowed = False
        self._entries: dict[str, dt.datetime] = {}
        self._names: dict[str, str] = {}  # key -> its task's name, for keys in ``_entries``
        self._heap: list[tuple[dt.datetime, str]] = []
        # (incarnation, version) of keys seen lately, kept after removal so stale snapshots
        # stay ignored.
        self._versions: collections.OrderedDict[str, tuple[object, int]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def _newer(self, key: str, version: int, incarnation: object) -> bool:
        seen = self._versions.get(key)
        if seen is not None and seen[0] == incarnation and version < seen[1]:
            return False
        self._versions[key] = (incarnation, version)
        self._versions.move_to_end(key)
        while len(self._versions) > 2 * self.bound:
            self._versions.popitem(last=False)
        return True

    def offer(
        self,
        key: str,
        when: dt.datetime | None,
        version: int,
        incarnation: object = None,
        name: str | None = None,
    ) -> bool:
        """Record that ``key`` (of the task name ``name``) is claimable from ``when`` (None:
        not by us). True if the earliest time moved earlier, i.e. the claimer should wake."""
        if not self._newer(key, version, incarnation):
            return False
        if when is None:
            self.discard(key)
            return False
        if name is not None and key in self._entries:
            self._names[key] = name
        if self._entries.get(key) == when:
            return False
        earliest = self.earliest()
        self._put(key, when, name)
        return key in self._entries and (earliest is None or when < earliest)

    def time_of(self, key: str) -> dt.datetime | None:
        """When ``key`` is claimable, while it is in the heap."""
        return self._entries.get(key)

    def name_of(self, key: str) -> str | None:
        """The task name ``key`` was offered with, while it is in the heap."""
        return self._names.get(key)

    def keys_of(self, names: Collection[str]) -> list[str]:
        """The keys in the heap offered with one of ``names``."""
        return [key for key, name in self._names.items() if name in names]

    def nudge(self, key: str, when: dt.datetime, name: str | None = None) -> None:
        """Try ``key`` (of ``name``, when known) at ``when`` whatever its version: after a run
        of ours ended without a write (so no event will bring it back). At worst one claim
        finds it not claimable."""
        if key not in self._entries or when < self._entries[key]:
            self._put(key, when, name)

    def _put(self, key: str, when: dt.datetime, name: str | None = None) -> None:
        self._entries[key] = when
        if name is not None:
            self._names[key] = name
        heapq.heappush(self._heap, (when, key))
        if len(self._entries) > self.bound:
            self._shrink()
        elif len(self._heap) > 2 * len(self._entries) + 16:
            self._compact()

    def discard(self, key: str) -> None:
        self._entries.pop(key, None)
        self._names.pop(key, None)

    @property
    def stored_pairs(self) -> int:
        """Pairs held in the heap, superseded ones included: what the memory costs."""
        return len(self._heap)

    def earliest(self) -> dt.datetime | None:
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def due_count(self, now: dt.datetime, limit: int) -> int:
        """How many keys are due at ``now``, counting up to ``limit``."""
        return len(self.due_keys(now, limit))

    def due_keys(self, now: dt.datetime, limit: int) -> list[str]:
        """Up to ``limit`` keys due at ``now``: the heap's top subtree of due pairs is walked,
        so this costs O(limit), not O(len)."""
        keys: list[str] = []
        pending, heap = [0], self._heap
        while pending and len(keys) < limit:
            index = pending.pop()
            if index >= len(heap) or heap[index][0] > now:
                continue
            when, key = heap[index]
            if self._entries.get(key) == when:
                keys.append(key)
            pending += (2 * index + 1, 2 * index + 2)
        return keys

    def postpone_all(self, keys: list[str], when: dt.datetime) -> None:
        """Try ``keys`` at ``when`` and not before (their name's limit frees then); a key due
        later already keeps its time."""
        for key in keys:
            if key in self._entries and self._entries[key] < when:
                self._put(key, when)

    def pop_due(self, now: dt.datetime) -> list[str]:
        """Remove and return every key due at ``now``, earliest first."""
        due: list[str] = []
        while (earliest := self.earliest()) is not None and earliest <= now:
            _, key = heapq.heappop(self._heap)
            self.discard(key)
            due.append(key)
        return due

    def _drop_stale_top(self) -> None:
        while self._heap and self._entries.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        """Drop superseded pairs. Each re-offer of a key (a ping event of a running task)
        leaves its old pair behind, and only the top is cleaned as it surfaces: without this a
        busy consumer's heap would grow by one pair per observed ping, unbounded. Rebuilding once
        the heap is twice the live size keeps it O(bound), at O(1) amortised per offer."""
        self._heap = [(when, key) for key, when in self._entries.items()]
        heapq.heapify(self._heap)

    def _shrink(self) -> None:
        keep = heapq.nsmallest(self.bound, self._entries.items(), key=lambda item: item[1])
        self._entries = dict(keep)
        self._names = {key: self._names[key] for key in self._entries if key in self._names}
        self._heap = [(when, key) for key, when in keep]
        heapq.heapify(self._heap)
        self.overflowed = True
