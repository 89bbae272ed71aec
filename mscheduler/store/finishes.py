"""The round trips of a batch of finishes (`services.finishes.FinishBatcher` groups them):
the fenced writes sent as one unordered bulk write, and the read of their documents after it.
Also what a finish's writer needs to tell of its outcome: a quiet finish's added conditions
(`Quiet`) and how a lease was lost (`lease_lost`); and `FinishWrites`, how the store sees the
service that sends its finishes (the store declares it, the composition root hands it one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pymongo import UpdateOne

from ..errors import LeaseLost
from ..models import Lease, Task, WorkerStateKind
from ..queries import tasks as q

if TYPE_CHECKING:
    from .base import StoreBase

Document = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Quiet:
    """How a quiet finish is written: ``fence``, its whole filter: the lease filter
    (`queries.lease.lease_filter`) with conditions added (at least ``dependent_count: 0``),
    and ``update``, the update that holds under them."""

    fence: Document
    update: list[Document] | Document


class FinishWrites(Protocol):
    """What sends a finish's fenced write (`TaskStore`'s succeed, fail, retry later, release):
    the process's finish batcher, which groups the finishes in flight together.

    Invariant the store relies on: the write is the fenced update given (or, ``quiet``, its
    quiet form), sent once; the document after it comes back, or `LeaseLost`, or the
    driver's error; None only for a quiet write that landed without a read."""

    async def write(
        self,
        lease: Lease,
        update: list[Document],
        now: Any,
        wrote: WorkerStateKind,
        *,
        quiet: Quiet | None = None,
    ) -> Document | None: ...


async def write_many(
    store: StoreBase, writes: Sequence[tuple[Document, list[Document] | Document]]
) -> int:
    """``(filter, update)`` pairs as one unordered bulk write: how many matched. A refusal
    of some raises `BulkWriteError` (the others stand)."""
    requests = [UpdateOne(fence, update) for fence, update in writes]
    result = await store.collection.bulk_write(requests, ordered=False)
    return int(result.matched_count)


async def read_back(store: StoreBase, keys: Sequence[str]) -> dict[str, Document]:
    """The documents of ``keys`` (one read), by key: what a batch's writes left."""
    cursor = store.collection.find(q.by_keys(list(keys)))
    return {document["key"]: document async for document in cursor}


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
