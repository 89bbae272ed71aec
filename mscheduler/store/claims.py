"""Batched claims: up to k tasks in two round trips, whatever k (not one per task).

1. read the best ``k`` candidates in claim order (the claim index), whole, by
   `queries.tasks.candidate_filter` (the claim filter less its arithmetic over the worker
   states, which each write of step 2 keeps);
2. one unordered ``bulk_write``: for each candidate, a conditional write with a ``run_id`` of
   its own. A candidate nobody has claimed yet, run by one worker (`queries.tasks.
   quick_claimable`, nearly every task), is claimed by a compare-and-set on its ``version``
   and a classic ``$set`` computed from the read (`queries.tasks.quick_claim`); any other, by
   the full claim filter on that ``_id`` and the claim pipeline (`queries.tasks.claim_one_of`);
3. only when a write did not match or was not quick: read what was won, by the candidates'
   keys and those ``run_id``\\ s (`queries.lease.runs_of`). When every write was quick and
   matched, the documents after them are those computed in step 2: nothing to read.

Per task this is the single claim's conditional write, so the claim invariants hold as they
do for `TaskStore.claim`. What differs, and why it is safe:
- a candidate taken meanwhile matches nothing: the batch wins fewer, never a wrong one;
- the priority order is the candidates' order; a task published between steps 1 and 2 waits
  for the next claim, as it would behind a single claim sent a moment earlier;
- a reply lost on the network (step 2) is resolved by step 3, which finds every claim that
  was applied; if step 3 fails (whether or not step 2's reply came), every ``run_id`` is
  uncertain (`ClaimUncertain`) and the consumer looks them up before claiming again, as for a
  single claim: a landed claim is never left to expire unrun.

The batches of one store take turns (`TaskStore.claim_many`, holding the process's
`ClaimTurns`, a service the composition root attaches). Consumers sharing a store free
their slots together (their finishes share a bulk write), so at once they would read the same
best candidates and split them: rounds of three round trips for a few tasks each, many of
them winning nothing. In turn, each reads past what the one before it won.
Taking a free turn does not yield: the memory backend's calls never do, so its consumers'
claims and finishes stay in one turn of the event loop, and their finishes in one batch
(yielding there would split them into a batch per consumer, and more round trips per task).

Other processes race: several that free their slots at once read the same best candidates,
and the first write takes them all, so the others' reads win nothing. So a store that lost
candidates to others reads a wider window of the best candidates (`Window`) and claims a
random ``limit`` of it: processes that read the same window then mostly claim different
tasks, and a lost race costs a few candidates, not a whole round. Priority holds: every
candidate of a higher priority than the ``limit``-th is claimed, and only among the
candidates of that priority (oldest first, within the window) does the choice spread. A
store that does not lose reads exactly ``limit``: the window costs the documents it examines
only while others race it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure

from ..errors import ClaimUncertain
from ..models import Lease, Task, new_run_id
from ..queries import lease as lq
from ..queries import tasks as q
from .base import name_groups

if TYPE_CHECKING:
    from .base import StoreBase

log = logging.getLogger(__name__)


def _claim_order(document: dict[str, Any]) -> tuple[Any, ...]:
    """`queries.tasks.CLAIM_SORT` as a key in Python: candidates read in groups of names
    merge in the order one query would give."""
    return (-document["options"]["priority"], document["created_at"], document["_id"])


# Rounds a batch may lose every candidate to other workers before it reports nothing won.
_CONTENDED_ROUNDS = 8
# The widest window of candidates a contended store reads, in batches.
MAX_WINDOW = 4
# Rounds in a row without a lost candidate after which the window narrows by one batch.
_CALM_ROUNDS = 16


@dataclasses.dataclass
class Window:
    """How wide a store reads its candidates, in batches, from what its rounds lost to other
    processes; and the counts of those rounds, which the benchmarks print.

    Widened by one batch after each round that lost a candidate, up to `MAX_WINDOW`, and
    narrowed by one after `_CALM_ROUNDS` rounds in a row that lost none: a process alone keeps
    reading exactly what it claims."""

    batches: int = 1
    calm: int = 0
    reads: int = 0  # candidate reads
    lost_reads: int = 0  # reads of which every candidate was taken by another
    lost_candidates: int = 0  # candidates written and not won

    def after_round(self, asked: int, won: int | None) -> None:
        self.reads += 1
        lost = asked - (won or 0) if won is not None else 0
        if won == 0:
            self.lost_reads += 1
        self.lost_candidates += lost
        if lost:
            self.batches = min(self.batches + 1, MAX_WINDOW)
            self.calm = 0
        else:
            self.calm += 1
            if self.calm >= _CALM_ROUNDS and self.batches > 1:
                self.batches -= 1
                self.calm = 0


class ClaimTurns(Protocol):
    """The process's turns at batched claims (`services.claim_turns.ClaimTurns`), held for
    one batch: its batches take turns, and each reads the window it returns. Invariant: one
    batch of the process holds it at a time."""

    async def __aenter__(self) -> Window: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


def choose(documents: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """``limit`` of ``documents`` (a window of candidates in claim order) to claim: every one
    of a higher priority than the ``limit``-th, and a random choice among those of its
    priority, returned in claim order. A window no wider than ``limit`` is taken whole."""
    if len(documents) <= limit:
        return documents
    boundary = documents[limit - 1]["options"]["priority"]
    above = [d for d in documents if d["options"]["priority"] > boundary]
    level = [d for d in documents if d["options"]["priority"] == boundary]
    chosen = {id(d) for d in above} | {id(d) for d in random.sample(level, limit - len(above))}
    return [d for d in documents if id(d) in chosen]


async def claim_many(
    store: StoreBase,
    worker_id: str,
    names: Sequence[str],
    limit: int,
    exclude_keys: Sequence[str],
    notify_if_ended: Callable[[list[Any]], Awaitable[None]],
    until: dt.datetime | None = None,
    window: Window | None = None,
    exclude_partitions: Sequence[str] = (),
) -> list[Lease]:
    """``window``: the store's (`Window`), which each round reads by and tells what it lost.
    ``notify_if_ended``: `TaskStore.notify_if_ended`, for candidates whose claim ended the
    task instead.
    ``until``: the leases' end, when not each task's ``worker_timeout_ms`` from now.

    Returns no lease only when nothing is claimable: losing every candidate to other workers
    is not that (a single claim picks and claims at once, and never loses so), and the
    consumer takes "no lease" to mean it may forget what it thought was due. So a batch that
    lost them all reads again: each such round others took tasks, so this ends.

    The first round reads by `queries.tasks.candidate_filter`, which admits a task whose
    derived ``next_claim_at`` says due while its worker states, as they are now, refuse
    every claim (a lease expired beside a live one after its task's slots were cut, until
    that one pings). Such a candidate is a write of the claim filter that misses, not a lost
    race: after a round where such a write missed, the rounds read by the whole claim
    filter, so the refused ones are not read again and the batch takes what is behind."""
    window = window or Window()
    batch = _Batch(
        store,
        worker_id,
        names,
        limit,
        exclude_keys,
        notify_if_ended,
        until,
        window,
        exclude_partitions,
    )
    exact = False
    for _ in range(_CONTENDED_ROUNDS):
        leases, contended, refused = await batch.round(exact)
        if leases or not contended:
            return leases
        exact = exact or refused
    return []


@dataclasses.dataclass(frozen=True)
class _Batch:
    store: StoreBase
    worker_id: str
    names: Sequence[str]
    limit: int
    exclude_keys: Sequence[str]
    notify_if_ended: Callable[[list[Any]], Awaitable[None]]
    until: dt.datetime | None
    window: Window
    exclude_partitions: Sequence[str] = ()

    async def round(self, exact: bool) -> tuple[list[Lease], bool, bool]:
        """(leases won, whether there were candidates, whether a write of the claim filter
        may have missed). ``exact``: read by the claim filter whole."""
        now = self.store.clock.now()
        claim = q.claim_filter(
            self.worker_id,
            now,
            names=self.names,
            exclude_keys=self.exclude_keys,
            exclude_partitions=self.exclude_partitions,
        )
        documents = await self._candidates(now, exact)
        if not documents:
            return [], False, False
        candidates = [document["_id"] for document in documents]
        run_ids = [new_run_id() for _ in candidates]
        requests = []
        claimed: list[dict[str, Any]] = []  # the documents after the quick claims
        for document, run_id in zip(documents, run_ids, strict=True):
            if q.quick_claimable(document):
                query, update, after = q.quick_claim(
                    document, self.worker_id, run_id, now, self.until
                )
                requests.append(UpdateOne(query, update))
                claimed.append(after)
            else:
                query = q.claim_one_of(claim, document["_id"], document["key"])
                requests.append(
                    UpdateOne(query, q.claim_update(self.worker_id, run_id, now, self.until))
                )
        matched: int | None = None
        lost: ConnectionFailure | None = None
        try:
            matched = (
                await self.store.collection.bulk_write(requests, ordered=False)
            ).matched_count
        except BulkWriteError as exc:  # some writes refused: the others stand
            matched = exc.details.get("nMatched")
        except ConnectionFailure as exc:
            if self.store.in_transaction:
                raise
            lost = exc  # some may have been applied: the read below finds them
        self.window.after_round(len(requests), matched)
        refused = matched != len(requests) and len(claimed) < len(requests)
        if matched == 0:  # every candidate was taken meanwhile, or refused: nothing to read
            return [], True, refused
        if matched == len(requests) == len(claimed):  # all quick, all landed: as computed
            return (
                [
                    Lease(
                        key=after["key"],
                        worker_id=self.worker_id,
                        run_id=run_id,
                        task=Task.model_validate(after),
                    )
                    for after, run_id in zip(claimed, run_ids, strict=True)
                ],
                True,
                False,
            )
        try:
            found = [
                Task.model_validate(doc)
                async for doc in self.store.collection.find(
                    lq.runs_of([document["key"] for document in documents], run_ids)
                )
            ]
        except ConnectionFailure as exc:
            if self.store.in_transaction:
                raise
            # Claims may have landed (the write said so, or its reply was lost): leases of ours
            # that nobody knows of would expire unrun. Each run_id is looked up before the
            # consumer claims again, as for a single claim.
            what = "its reply was lost" if matched is None else f"{matched} were applied"
            raise ClaimUncertain(
                f"MongoDB is unreachable: a batched claim's read of its {len(run_ids)} runs "
                f"failed ({exc}) and {what}",
                worker_id=self.worker_id,
                run_ids=run_ids,
            ) from exc
        if lost is not None and not found:
            # Nothing was applied: an ordinary network error, as for a single claim. Returning no
            # leases instead would tell the consumer nothing is claimable, and it would drop the
            # due keys from its heap until they change.
            raise lost
        leases = []
        ours = set(run_ids)
        for task in found:
            own = next(ws for ws in task.worker_states if ws.run_id in ours)
            if own.worker_id == self.worker_id:
                leases.append(
                    Lease(key=task.key, worker_id=self.worker_id, run_id=own.run_id, task=task)
                )
        if matched is not None and matched > len(leases):
            # A claim whose sweep exhausted the retries fails the task instead (no lease): its
            # dependents are told here, as `TaskStore.claim` does.
            won = {lease.task.id for lease in leases}
            await self.notify_if_ended([task_id for task_id in candidates if task_id not in won])
        if lost is not None and leases:
            log.info(
                "batched claim reply lost; %d claims were applied and are recovered by run_id",
                len(leases),
                extra={"action": "claim_recovered"},
            )
        order = {task_id: place for place, task_id in enumerate(candidates)}
        return sorted(leases, key=lambda lease: order[lease.task.id]), True, refused

    async def _candidates(self, now: Any, exact: bool) -> list[dict[str, Any]]:
        """``limit`` candidates chosen (`choose`) from the best of the store's window (``limit``
        of them, while no other process takes them from under it), whole (a quick claim's
        document after it is computed from them): one read per group of names
        (`base.name_groups`), merged by the claim order's fields; one read in all for up to
        100 names."""
        wide = self.limit * self.window.batches
        found: list[dict[str, Any]] = []
        for names in name_groups(self.names):
            read = q.claim_filter if exact else q.candidate_filter
            wanted = read(
                self.worker_id,
                now,
                names=names,
                exclude_keys=self.exclude_keys,
                exclude_partitions=self.exclude_partitions,
            )
            cursor = self.store.collection.find(wanted, sort=q.CLAIM_SORT, limit=wide)
            found += [document async for document in cursor]
        if not exact and any(q.written_newer(document) for document in found):
            # A task of a newer document format, which the candidate filter does not test
            # for (a fleet mid-upgrade): read again by the claim filter, which leaves it out.
            return await self._candidates(now, exact=True)
        found.sort(key=_claim_order)
        return choose(found[:wide], self.limit)
