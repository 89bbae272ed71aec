"""`ClaimTurns`: the process's turns at batched claims, and how wide they read.

A batched claim reads a window of candidates, then writes them (`store.claims`). Batches of
one process that ran at once would read the same candidates and take them from each other:
so they take turns, one batch at a time, and the window widens when other processes took
candidates from under a batch, and narrows when none did (`store.claims.Window`). That is
the process's state, kept here, one per store; the store holds the turn while it claims
(`store.claims.ClaimTurns`).
"""

from __future__ import annotations

import anyio

from ..store.claims import Window


class ClaimTurns:
    """Held (``async with``) for one batched claim: the window it reads, in batches. The
    counts of ``window`` are the benchmarks'."""

    def __init__(self) -> None:
        self._turn = anyio.Lock(fast_acquire=True)  # no yield when free (`store.claims`)
        self.window = Window()

    async def __aenter__(self) -> Window:
        await self._turn.acquire()
        return self.window

    async def __aexit__(self, *exc_info: object) -> None:
        self._turn.release()
