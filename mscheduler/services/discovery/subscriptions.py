"""What one consumer, waiter or watch of the process hears of from its discovery hub, and
the buffer it is handed it through.

Invariant: no event is lost without a resync. A subscriber's buffer is bounded; a subscriber
that falls behind has its buffer dropped and gets `RESYNC` in its place, the same signal as a
stream that could not resume: it reads everything it needs again, so a slow one never blocks
the others and never silently misses a change.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Final

import anyio

from ...models import Task
from ...worker_options import WorkerOptions

# Handed to a subscriber in place of the events it lost: read everything you need again.
RESYNC: Final = None
# Events a subscriber may have waiting before it is told to resync instead.
BUFFER_SIZE = 10_000


class Subscription:
    """What one consumer, waiter or watch hears of: ``wakes`` (names: writes that may give
    work), ``states`` (keys: state changes), ``every`` (names, or all names when ``None`` is
    among them: every write), ``controls`` (each control change, as a `RESYNC`). Read with
    `next`; `RESYNC` means "read everything again".
    ``options`` say how to discover (``discovery``, ``poll_interval_ms``, the backoff) when
    this subscriber runs the hub."""

    def __init__(
        self,
        options: WorkerOptions,
        *,
        wakes: Iterable[str] = (),
        states: Iterable[str] = (),
        every: Iterable[str | None] = (),
        buffer_size: int = BUFFER_SIZE,
        holds: Callable[[str], bool] = lambda key: False,
        controls: bool = False,
        worker_id: str | None = None,
    ) -> None:
        self.options = options
        # A consumer's worker: the poll reads for it the due tasks it may claim (not those
        # pinned to other workers). None: any worker's.
        self.worker_id = worker_id
        self.controls = controls  # told (as `RESYNC`) of every write of the control version
        self.holds = holds  # a consumer's running keys: every change of them matters to it
        self.wakes = frozenset(wakes)
        self.states = frozenset(states)
        self.every = frozenset(every)
        self.buffer_size = buffer_size
        # A waiter's tasks' names, once read: the poll's read of writes covers them too.
        self.names: set[str] = set()
        self.named: set[str] = set()  # keys of ``states`` read at least once
        self.ended: set[str] = set()  # keys of ``states`` seen terminal: not read again
        self.resyncs = 0  # times told to resync (fell behind, or the stream lost its place)
        self._buffer: collections.deque[Task | None] = collections.deque()
        self._ready = anyio.Event()
        self.covered = anyio.Event()  # the hub's stream (or poll) covers this subscription

    def wants(self, task: Task, woke: bool) -> bool:
        """``woke``: the write may give a consumer work (see `may_wake`)."""
        return (
            (task.name in self.wakes and (woke or self.holds(task.key)))
            or task.key in self.states
            or task.name in self.every
            or None in self.every
        )

    def note(self, task: Task) -> None:
        """A waited-for task was read (by the hub or by its waiter): its name joins the poll's
        read of writes, and once it has ended its key is not read again."""
        if task.key in self.states:
            self.names.add(task.name)
            self.named.add(task.key)
            if task.state.is_terminal:
                self.ended.add(task.key)

    @property
    def waiting(self) -> frozenset[str]:
        """Keys of ``states`` not yet seen terminal: what the poll reads by key."""
        return self.states - self.ended

    @property
    def unnamed(self) -> frozenset[str]:
        """Keys of ``states`` never read (not published yet): read by key every poll, as no
        read of writes by name covers them."""
        return self.states - self.named

    def deliver(self, item: Task | None) -> None:
        """Never blocks: past ``buffer_size`` the waiting events are dropped for one RESYNC."""
        if item is not RESYNC:
            self.note(item)
        if item is RESYNC or len(self._buffer) >= self.buffer_size:
            self._buffer.clear()
            self._buffer.append(RESYNC)
            self.resyncs += 1
        else:
            self._buffer.append(item)
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    async def next(self) -> Task | None:
        while not self._buffer:
            self._ready = anyio.Event()
            await self._ready.wait()
        return self._buffer.popleft()
