"""Group commit of finishes: outcomes written while another write of them is in flight go
out together, as one unordered bulk write (and at most one read), instead of one round trip
each (at saturation, round trips are what limits the rate).

No timer: a finish that finds nothing in flight is sent at once, alone, as the single fenced
``find_one_and_update`` it always was (so a lone task's latency is unchanged); finishes that
arrive meanwhile wait for it and are then sent together, by the first of their writers. No
writer waits on more than the batch in flight and its own (and, rarely, its own write sent
again alone, below), however busy the other consumers of the store are. Under load the
batches grow by themselves; idle, nothing waits.

Each write in a batch is the same fenced update (``key + worker_id + run_id`` of a live
lease, `queries.lease.lease_filter`), so fencing holds per task as before. A batch reports
lease loss per task, but a bulk write reports only how many of its writes matched: so a read
after it returns the documents, for the callers that want them (who tell dependents, as after
a single write), and tells, per task, whether its write landed.

A caller that wants no document back (the consumer's success of a task claimed without
dependents) is *quiet* (`Quiet`): its write adds conditions to the fence, at least
``dependent_count: 0``, so a quiet write that lands leaves no dependents to tell, and may be
a cheaper update that holds only under those conditions (`queries.lease.quick_success`: a
classic ``$set`` of the fields a success changes, instead of the success pipeline). When
every write of a batch matched, the quiet ones are resolved without that read; a quiet finish
alone is sent the same way.
Otherwise the read tells which landed; a quiet write that missed while its lease lives
missed on its added conditions (dependents added while the task ran, or options changed),
and its writer sends it again alone, as the plain fenced write of the full update, once the
batch is out. (Its ``now`` is the one its
caller took: as for any write delayed in flight, a lease that expired meanwhile but was not
taken over still accepts it; a takeover sweeps it with the claim's own time and fences it.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from pymongo.errors import BulkWriteError

from ..errors import BackendUnavailable
from ..liveness import lease_is_live
from ..models import Lease, Task, WorkerStateKind
from ..queries import lease as lq
from ..store import finishes
from ..store.finishes import Document, Quiet, lease_lost

if TYPE_CHECKING:
    from ..store.base import StoreBase


@dataclasses.dataclass
class _Finish:
    lease: Lease
    update: list[Document]
    now: Any
    wrote: WorkerStateKind
    quiet: Quiet | None
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    # Set when done, or when this finish's writer is to send the queue (`FinishBatcher`).
    wake: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    document: Document | None = None
    error: BaseException | None = None
    # Set with done: the batch did not write it, its writer sends it alone (`FinishBatcher._many`).
    alone: bool = False

    def resolve(self, document: Document | None = None, error: BaseException | None = None) -> None:
        self.document, self.error = document, error
        self.done.set()
        self.wake.set()


class FinishBatcher:
    def __init__(
        self,
        store: StoreBase,
        write_one: Callable[[Lease, list[Document], Any], Awaitable[Document]],
    ) -> None:
        """``write_one``: the single fenced write (`TaskStore.fenced_document`), for a finish
        sent by itself. In a batch of writes (`StoreBase.in_batch`) every finish is written by
        itself, at once, never yielding first (inside `transactions.run_atomically`, where the
        memory backend's atomicity is that nothing else runs between the batch's writes, and
        a transaction's write may not join other tasks' writes)."""
        self._store = store
        self._write_one = write_one
        self._queue: list[_Finish] = []
        self._busy = False

    async def write(
        self,
        lease: Lease,
        update: list[Document],
        now: Any,
        wrote: WorkerStateKind,
        *,
        quiet: Quiet | None = None,
    ) -> Document | None:
        """The document after this finish (``wrote``: the state it gives the run), or
        `LeaseLost`; driver errors as from the write itself. ``quiet``: the caller reads
        nothing back, and gets None where the batch landed without a read."""
        if self._store.in_batch:
            return await self._write_one(lease, update, now)
        finish = _Finish(lease, update, now, wrote, quiet)
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
        if finish.alone:  # by its own writer, once the batch is out: nobody waits on it
            return await self._write_one(lease, update, now)
        assert finish.document is not None or finish.quiet is not None
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
            if len(batch) == 1 and batch[0].quiet is None:
                (finish,) = batch
                finish.resolve(await self._write_one(finish.lease, finish.update, finish.now))
            else:
                await self._many(batch)
        except BaseException as exc:
            # Each waiter gets the driver's error (its caller converts and retries it); a
            # cancellation of the sender is not theirs: they are told to retry.
            error = exc if isinstance(exc, Exception) else _interrupted()
            for finish in batch:
                if not finish.done.is_set():
                    finish.resolve(error=error)
            if not isinstance(exc, Exception):
                raise

    async def _many(self, batch: list[_Finish]) -> None:
        writes = [(_fence(f), f.update if f.quiet is None else f.quiet.update) for f in batch]
        matched = 0
        try:
            matched = await finishes.write_many(self._store, writes)
        except BulkWriteError as exc:  # the server refused some; the others stand
            for error in exc.details.get("writeErrors", []):
                refused = BulkWriteError({**exc.details, "writeErrors": [error]})
                batch[error["index"]].resolve(error=refused)
        if matched == len(batch):  # every write landed
            for finish in batch:
                if finish.quiet is not None:
                    finish.resolve()
        unresolved = [finish for finish in batch if not finish.done.is_set()]
        if not unresolved:
            return
        documents = await finishes.read_back(self._store, [f.lease.key for f in unresolved])
        for finish in unresolved:
            document = documents.get(finish.lease.key)
            if _landed(document, finish):
                finish.resolve(document)
            elif finish.quiet is not None and _live(document, finish):
                # It missed on its added conditions (dependents added while it ran, options
                # changed): its writer sends it alone, as the plain fenced write of the full
                # update, which returns the document that tells any dependents.
                finish.alone = True
                finish.resolve()
            else:  # the read above already tells how it was lost
                finish.resolve(error=lease_lost(finish.lease, document))


def _fence(finish: _Finish) -> Document:
    """The lease filter, or a quiet finish's (the lease filter and more: the module's doc)."""
    if finish.quiet is not None:
        return finish.quiet.fence
    return lq.lease_filter(
        finish.lease.key, finish.lease.worker_id, finish.lease.run_id, finish.now
    )


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


def _live(document: Document | None, finish: _Finish) -> bool:
    """Whether the lease of this finish is live in ``document``: what `_fence` asks of it
    but the quiet part (so a quiet write that missed, missed on dependents)."""
    if document is None:
        return False
    lease = finish.lease
    return any(
        state.run_id == lease.run_id
        and state.worker_id == lease.worker_id
        and lease_is_live(state, finish.now)
        for state in Task.model_validate(document).worker_states
    )
