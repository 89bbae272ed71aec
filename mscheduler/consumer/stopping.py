"""`Stopping`: a consumer's stop, as its parts see it: asked for once (`Consumer.stop`, a
remote stop, or the claimer when the work of a ``burst`` or ``max_tasks`` consumer is done),
then complete once the consumer stopped, every running outcome written (or released) first.
"""

from __future__ import annotations

import anyio


class Stopping:
    """``requested``: a stop was asked for (claiming stops, the shutdown begins);
    ``stopped``: the shutdown is over: every handler ended and its outcome written or its
    lease released, the live workers entry removed (or the run was cancelled: its leases are
    left to expire). ``done_by_itself``: why it stopped by itself (``burst``: nothing left;
    ``max_tasks``), else None."""

    def __init__(self) -> None:
        self.requested = anyio.Event()
        self.stopped = anyio.Event()
        self.done_by_itself: str | None = None

    def request(self) -> None:
        self.requested.set()

    def done(self, reason: str) -> None:
        """The consumer's work is done (``reason``): it stops, as at `request`."""
        self.done_by_itself = reason
        self.requested.set()
