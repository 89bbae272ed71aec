"""Group commit of finishes: outcomes written while another write of them is in flight go
out together, as one unordered bulk write and one read, instead of one round trip each (at
saturation, round trips are what limits the rate).

No timer: a finish that finds nothing in flight is sent at once, alone, as the single fenced
``find_one_and_update`` it always was (so a lone task's latency is unchanged); finishes that
arrive meanwhile wait for it and are then sent together, by the first of their writers. No
writer waits on more than the batch in flight and its own: a finish returns within two
round trips, however busy the other consumers of the store are. Under load the batches grow by
themselves; idle, nothing waits.

Each write in a batch is the same fenced update (``key + worker_id + run_id`` of a live
lease, `queries.lease.lease_filter`), so fencing holds per task as before. The read after the
bulk returns every document, for the callers (who tell dependents, as after a single write)
and to tell, per task, whether its write landed: a batch reports lease loss per task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError

from ..errors import BackendUnavailable, LeaseLost
from ..models import Lease, Task, WorkerStateKind
from ..queries import lease as lq
from ..queries import tasks as q

if TYPE_CHECKING:
    from .base import StoreBase

Document = dict[str, Any]


@dataclasses.dataclass
class _Finish:
    lease: Lease
    update: list[Document]
    now: Any
    wrote: WorkerStateKind
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    # Set when done, or when this finish's writer is to send the queue (`FinishBatcher`).
    wake: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    document: Document | None = None
    error: BaseException | None = None

    def settle(self, document: Document | None = None, error: BaseException | None = None) -> None:
        self.document, self.error = document, error
        self.done.set()
        self.wake.set()


class FinishBatcher:
    def __init__(
        self,
        store: StoreBase,
        write_one: Callable[[Lease, list[Document], Any], Awaitable[Document]],
        *,
        alone: bool = False,
    ) -> None:
        """``write_one``: the single fenced write (`TaskStore.fenced_document`), for a finish
        sent by itself. ``alone``: every finish is written by itself, at once, never yielding
        first (inside `transactions.run_atomically`, where the memory backend's atomicity is
        that nothing else runs between the batch's writes)."""
        self._store = store
        self._write_one = write_one
        self._alone = alone
        self._queue: list[_Finish] = []
        self._busy = False

    async def write(
        self, lease: Lease, update: list[Document], now: Any, wrote: WorkerStateKind
    ) -> Document:
        """The document after this finish (``wrote``: the state it gives the run), or
        `LeaseLost`; driver errors as from the write itself."""
        if self._alone:
            return await self._write_one(lease, update, now)
        finish = _Finish(lease, update, now, wrote)
        self._queue.append(finish)
        try:
            while not finish.done.is_set():
                if self._busy:  # in the next batch: sent by the sender, or by us after it
                    finish.wake = anyio.Event()
                    await finish.wake.wait()
                    continue
                self._busy = True
                try:
                    # Let the handlers that ended in this turn of the event loop join this
                    # batch (the memory backend's calls never yield, so none would otherwise).
                    await anyio.lowlevel.checkpoint()
                    batch, self._queue = self._queue, []
                    await self._send(batch)
                finally:
                    self._busy = False
                    self._hand_over()
        finally:
            if not finish.done.is_set() and finish in self._queue:
                self._queue.remove(finish)  # its writer was cancelled before it was sent
                self._hand_over()
        # Done: no wait more (another yield here would make the freed slot's claim a turn
        # late, and split the next batches).
        if finish.error is not None:
            raise finish.error
        assert finish.document is not None
        return finish.document

    def _hand_over(self) -> None:
        """A sender sends one batch, its own finish in it, and returns to its caller: the
        writer of the first finish still queued sends the next. A sender that kept sending
        until the queue emptied would return only once the other consumers of its store
        paused finishing: a stopping consumer's handler would wait on others' outcomes."""
        if self._queue and not self._busy:
            self._queue[0].wake.set()

    async def _send(self, batch: list[_Finish]) -> None:
        try:
            if len(batch) == 1:
                (finish,) = batch
                finish.settle(await self._write_one(finish.lease, finish.update, finish.now))
            else:
                await self._many(batch)
        except BaseException as exc:
            # Each waiter gets the driver's error (its caller converts and retries it); a
            # cancellation of the sender is not theirs: they are told to retry.
            error = exc if isinstance(exc, Exception) else _interrupted()
            for finish in batch:
                if not finish.done.is_set():
                    finish.settle(error=error)
            if not isinstance(exc, Exception):
                raise

    async def _many(self, batch: list[_Finish]) -> None:
        requests = [
            UpdateOne(
                lq.lease_filter(f.lease.key, f.lease.worker_id, f.lease.run_id, f.now), f.update
            )
            for f in batch
        ]
        refused: dict[int, BaseException] = {}
        try:
            await self._store.collection.bulk_write(requests, ordered=False)
        except BulkWriteError as exc:  # the server refused some; the others stand
            for error in exc.details.get("writeErrors", []):
                refused[error["index"]] = BulkWriteError({**exc.details, "writeErrors": [error]})
        cursor = self._store.collection.find(q.by_keys([f.lease.key for f in batch]))
        documents = {document["key"]: document async for document in cursor}
        for index, finish in enumerate(batch):
            if index in refused:
                finish.settle(error=refused[index])
            elif _landed(documents.get(finish.lease.key), finish):
                finish.settle(documents[finish.lease.key])
            else:  # the read above already tells how it was lost
                finish.settle(error=lease_lost(finish.lease, documents.get(finish.lease.key)))


def _interrupted() -> BackendUnavailable:
    return BackendUnavailable("the write of this outcome was interrupted; it may have landed")


def _landed(document: Document | None, finish: _Finish) -> bool:
    """Whether this finish's write is what the run's state shows: only its holder writes a
    success or a failure, and a release of its own carries its reason (a cancel's release
    carries none)."""
    if document is None:
        return False
    for state in document.get("worker_states", []):
        if state.get("run_id") == finish.lease.run_id:
            if state.get("state") != finish.wrote.value:
                return False
            return finish.wrote is not WorkerStateKind.RELEASED or state.get("error") is not None
    return False


def lease_lost(lease: Lease, document: Document | None) -> LeaseLost:
    """What happened to a lease, told from its task's document as read after the write that
    did not match (None: the task is gone)."""
    prefix = f"task {lease.key!r}: worker {lease.worker_id!r} lost its lease"
    if document is None:
        return LeaseLost(f"{prefix}; the task was deleted")
    task = Task.model_validate(document)
    own = next((ws for ws in task.worker_states if ws.run_id == lease.run_id), None)
    state = None if own is None else own.state.value
    if task.state.is_terminal:
        return LeaseLost(f"{prefix}; the task is {task.state.value}", state=state)
    if own is None:
        return LeaseLost(f"{prefix}; the task was re-published")
    if own.state is WorkerStateKind.RUNNING and own.ping_expire_at is not None:
        expired = f"{prefix}; it expired at {own.ping_expire_at.isoformat()}"
        return LeaseLost(expired, state=state)
    return LeaseLost(f"{prefix}; its state is {own.state.value}", state=state)
