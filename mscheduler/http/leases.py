"""The leases this server handed out, by run_id: a worker that comes back with
``key + worker_id + run_id`` is answered without a read first. A lease it does not know (owned
through another server, or before a restart) is read once (`Scheduler.find_lease`). Bounded:
past `MAX_KEPT` the oldest are dropped (and read again if they come back)."""

from __future__ import annotations

import collections

from ..models import Lease

MAX_KEPT = 100_000


class KnownLeases:
    def __init__(self) -> None:
        self._leases: collections.OrderedDict[str, Lease] = collections.OrderedDict()

    def keep(self, lease: Lease) -> None:
        self._leases[lease.run_id] = lease
        self._leases.move_to_end(lease.run_id)
        while len(self._leases) > MAX_KEPT:
            self._leases.popitem(last=False)

    def get(self, key: str, worker_id: str, run_id: str) -> Lease | None:
        lease = self._leases.get(run_id)
        if lease is None or lease.key != key or lease.worker_id != worker_id:
            return None
        return lease

    def forget(self, run_id: str) -> None:
        self._leases.pop(run_id, None)
