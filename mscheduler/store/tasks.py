"""`TaskStore`: runs the queries of `mscheduler.queries` against a collection.

It turns results into models and driver errors into mscheduler errors, and counts nothing it
does not need to: publish, claim, ping, succeed, fail and release are one round trip each.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Sequence
from typing import Any, Protocol

from pymongo import ReturnDocument, UpdateOne
from pymongo.errors import ConnectionFailure

from .. import constants as c
from .. import retry_policy
from ..clock import Clock
from ..collection import TasksCollection
from ..encoding import check_result
from ..errors import ClaimUncertain, ConfigurationError, LeaseLost
from ..liveness import lease_is_live
from ..models import (
    ErrorInfo,
    Lease,
    Task,
    TaskState,
    WorkerStateKind,
    check_worker_id,
    checked,
    new_run_id,
)
from ..queries import lease as lq
from ..queries import tasks as q
from . import claims
from .base import StoreBase
from .driver import driver_errors
from .finishes import FinishWrites, Quiet, lease_lost
from .flows import Flows

log = logging.getLogger(__name__)


def _draw_spread() -> float:
    """A failure's draw of its retry's jitter: uniform in [-1, 1], scaled on the server by the
    task's ``retry_jitter`` (`queries.retry_delay`). Drawn here, by the writer, because the
    server's ``$rand`` is not evaluated by every engine the queries run on."""
    return random.uniform(-1.0, 1.0)


class DependentsOwed(Protocol):
    """Where a write that ended tasks, whose dependents it then failed to tell, says so: the
    process's record of them (`services.dependents.OwedDependents`), which wakes what tells
    them (`recover_dependents`)."""

    def owe(self, *tasks: str) -> None: ...


class _Unattached:
    """What a `TaskStore` sends finishes through, owes dependents to and takes claim turns
    of, before the composition root attaches the process's services: a clear error, never a
    silent drop."""

    def _refuse(self) -> RuntimeError:
        return RuntimeError(
            "this store's services are not attached: build it through services.root.Services"
        )

    async def write(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse()

    def owe(self, *tasks: str) -> None:
        raise self._refuse()

    async def __aenter__(self) -> claims.Window:
        raise self._refuse()

    async def __aexit__(self, *exc_info: object) -> None:
        raise self._refuse()


class TaskStore:
    """The store's task part (``store.tasks``): claim, the lease's fenced writes, and what a
    write that ended a task owes its dependents; each a fenced or conditional write on one
    document, through the store's collection (so inside `StoreBase.bound`, through its
    session). It keeps no process state: its finishes, the dependents it owes and its turns
    at batched claims go to the services `attach` hands it."""

    def __init__(self, base: StoreBase, flows: Flows) -> None:
        self._base = base
        self._flows = flows
        self._finishes: FinishWrites = _Unattached()
        self._owed: DependentsOwed = _Unattached()
        self._claim_turns: claims.ClaimTurns = _Unattached()

    @property
    def collection(self) -> TasksCollection:
        return self._base.collection

    @property
    def clock(self) -> Clock:
        return self._base.clock

    @property
    def sharded(self) -> bool:
        return self._base.sharded

    @property
    def in_transaction(self) -> bool:
        return self._base.in_transaction

    async def ready(self) -> None:
        await self._base.ready()

    def attach(
        self, finishes: FinishWrites, owed: DependentsOwed, claim_turns: claims.ClaimTurns
    ) -> None:
        """Called once, by the composition root, with the services built over this store:
        what sends its finishes, what records the dependents its writes failed to tell, and
        the process's turns at batched claims (with how wide they read)."""
        self._finishes = finishes
        self._owed = owed
        self._claim_turns = claim_turns

    # ------------------------------------------------------------ after a write: the dependents

    async def after_write(self, task: Task) -> Task:
        """A write that ended a task with dependents tells them (only then: no extra call);
        one that left it claimable again (a retry, a release) signals the processes that poll
        (`StoreBase.work_written`).

        If telling them fails on the network, the write itself has landed: raising would make
        the caller retry a write that is done (a finish would then see `LeaseLost`). The task
        stays ``dependents_notified: false`` and is owed instead: `recover_dependents` retries it (a
        consumer does, with backoff, without waiting for a restart, so none stays owed)."""
        if task.state is TaskState.PENDING:  # a retry, a release: claimable again
            await self._base.work_written()
        if task.dependents_notified is False:
            try:
                await self._flows.notify(task)
            except ConnectionFailure as exc:
                if self.in_transaction:
                    raise  # the transaction is retried whole
                log.warning(
                    "task %r ended but its dependents were not told yet: %s",
                    task.key,
                    exc,
                    extra={"action": "dependents_owed", "key": task.key},
                )
                self._owed.owe(task.key)
        return task

    # ------------------------------------------------------------ claim and the lease

    @driver_errors
    async def claim(
        self,
        worker_id: str,
        *,
        names: Sequence[str] | None = None,
        key: str | None = None,
        exclude_keys: Sequence[str] = (),
        run_id: str | None = None,
        until: dt.datetime | None = None,
        exclude_partitions: Sequence[str] = (),
    ) -> Lease | None:
        """Claim one task: ``key`` if given, else the best of ``names`` (priority, then age)
        other than ``exclude_keys`` and tasks of ``exclude_partitions``. ``run_id``: the
        claim's token, when the caller chose it (a fresh one otherwise); ``until``: the
        lease's end, when not the task's ``worker_timeout_ms`` from now.

        None when nothing is claimable, or when the only write was recording timeouts that
        exhausted the task's retries (the task is then ``fail``)."""
        worker_id = checked(check_worker_id, worker_id)
        if key is None and not names:
            raise ConfigurationError("claim: give a key or at least one task name")
        if key is None and names and (self.sharded or len(names) > c.MAX_NAMES_PER_QUERY):
            # A mongos refuses a findAndModify without the shard key; one per group of names
            # would take each group's best, not the best of all: candidates, then the best.
            leases = await self.claim_many(
                worker_id,
                names=names,
                limit=1,
                exclude_keys=exclude_keys,
                until=until,
                exclude_partitions=exclude_partitions,
            )
            return leases[0] if leases else None
        await self.ready()
        run_id = run_id or new_run_id()
        now = self.clock.now()
        try:
            found = await self.collection.find_one_and_update(
                q.claim_filter(
                    worker_id,
                    now,
                    names=names,
                    key=key,
                    exclude_keys=exclude_keys,
                    exclude_partitions=exclude_partitions,
                ),
                q.claim_update(worker_id, run_id, now, until),
                sort=q.CLAIM_SORT if key is None else None,
                return_document=ReturnDocument.AFTER,
            )
        except ConnectionFailure as exc:
            if self.in_transaction:
                raise
            # The reply may be lost after the claim was applied: a lease nobody knows of would
            # expire unrun and count as a failure (with max_unexpected_retries=0, fail the task
            # without it ever running). The run_id is ours alone, so one read tells.
            return await self._lease_from(
                await self._lookup_claim(worker_id, run_id, exc), worker_id, run_id
            )
        if found is None:
            return None
        return await self._lease_from(Task.model_validate(found), worker_id, run_id)

    @driver_errors
    async def claim_many(
        self,
        worker_id: str,
        *,
        names: Sequence[str],
        limit: int,
        exclude_keys: Sequence[str] = (),
        until: dt.datetime | None = None,
        exclude_partitions: Sequence[str] = (),
    ) -> list[Lease]:
        """Claim up to ``limit`` of the best tasks of ``names`` in three round trips
        (`claims`); fewer than three: one task is claimed, in one round trip, which costs
        less (the caller claims again for a second).
        ``until``: the leases' end, when not each task's ``worker_timeout_ms`` from now."""
        worker_id = checked(check_worker_id, worker_id)
        if limit < 3 and len(names) <= c.MAX_NAMES_PER_QUERY and not self.sharded:
            lease = await self.claim(
                worker_id,
                names=names,
                exclude_keys=exclude_keys,
                until=until,
                exclude_partitions=exclude_partitions,
            )
            return [] if lease is None else [lease]
        await self.ready()
        async with self._claim_turns as window:  # this process's batches take turns
            return await claims.claim_many(
                self._base,
                worker_id,
                names,
                limit,
                exclude_keys,
                self.notify_if_ended,
                until,
                window,
                exclude_partitions,
            )

    async def notify_if_ended(self, task_ids: Sequence[Any]) -> None:
        """After a write that may have ended these tasks without returning them: tell the
        dependents of those that ended.

        The write has landed, and the caller holds what it won: a network error here must
        not lose that (a batch's leases would expire unrun), so the tasks are owed instead,
        as in `after_write`."""
        try:
            async for document in self.collection.find(q.by_ids(task_ids)):
                task = Task.model_validate(document)
                if task.state.is_terminal:
                    await self.after_write(task)
        except ConnectionFailure as exc:
            if self.in_transaction:
                raise  # the transaction is retried whole
            log.warning(
                "claims may have ended %d tasks whose dependents were not told yet: %s",
                len(task_ids),
                exc,
                extra={"action": "dependents_owed"},
            )
            self._owed.owe(*(str(task_id) for task_id in task_ids))

    async def _claimed_by(self, worker_id: str, run_id: str) -> Task | None:
        """The task that a claim of ``worker_id`` with ``run_id`` went to, if it was applied."""
        found = await self.collection.find_one(lq.by_run(run_id))
        if found is None:
            return None
        task = Task.model_validate(found)
        own = next(ws for ws in task.worker_states if ws.run_id == run_id)
        return task if own.worker_id == worker_id else None

    async def _lookup_claim(self, worker_id: str, run_id: str, lost: ConnectionFailure) -> Task:
        try:
            task = await self._claimed_by(worker_id, run_id)
        except ConnectionFailure as exc:
            raise ClaimUncertain(
                f"MongoDB is unreachable: a claim's reply was lost ({lost}) and so was the "
                f"read of run {run_id} ({exc})",
                worker_id=worker_id,
                run_ids=[run_id],
            ) from exc
        if task is None:
            raise lost  # not applied: an ordinary network error
        log.info(
            "claim reply lost; the claim was applied and is recovered by its run_id",
            extra={"action": "claim_recovered", "run_id": run_id},
        )
        return task

    @driver_errors
    async def find_claims(self, worker_id: str, run_ids: Sequence[str]) -> list[Lease]:
        """After `ClaimUncertain`: the live leases those claims took, in one read (a run_id
        missing: its claim was not applied, or its lease expired and another claim records
        that)."""
        now = self.clock.now()
        wanted = set(run_ids)
        leases = []
        async for document in self.collection.find(lq.by_runs(list(run_ids))):
            task = Task.model_validate(document)
            for ws in task.worker_states:
                if ws.run_id in wanted and ws.worker_id == worker_id and lease_is_live(ws, now):
                    lease = Lease(key=task.key, worker_id=worker_id, run_id=ws.run_id, task=task)
                    leases.append(lease)
        return leases

    async def _lease_from(self, task: Task, worker_id: str, run_id: str) -> Lease | None:
        task = await self.after_write(task)
        if not any(ws.run_id == run_id for ws in task.worker_states):
            log.info(
                "task failed: an attempt timed out with no retry or try left",
                extra={"action": "task_failed", "key": task.key},
            )
            return None
        log.debug(
            "task claimed",
            extra={"action": "task_claimed", "key": task.key, "worker_id": worker_id},
        )
        return Lease(key=task.key, worker_id=worker_id, run_id=run_id, task=task)

    async def fenced_document(
        self, lease: Lease, update: list[dict[str, Any]], now: Any
    ) -> dict[str, Any]:
        """The document after a write only the live holder of ``lease`` can make, or
        `LeaseLost`."""
        found = await self.collection.find_one_and_update(
            lq.lease_filter(lease.key, lease.worker_id, lease.run_id, now),
            update,
            return_document=ReturnDocument.AFTER,
        )
        if found is None:
            raise await self._lost(lease)
        return dict(found)

    async def _fenced_write(self, lease: Lease, update: list[dict[str, Any]], now: Any) -> Task:
        found = await self.fenced_document(lease, update, now)
        return await self.after_write(Task.model_validate(found))

    async def _finish_write(
        self, lease: Lease, update: list[dict[str, Any]], now: Any, wrote: WorkerStateKind
    ) -> Task:
        """A fenced write that ends the run: sent with the finishes in flight (`finishes`)."""
        found = await self._finishes.write(lease, update, now, wrote)
        assert found is not None
        return await self.after_write(Task.model_validate(found))

    async def _lost(self, lease: Lease) -> LeaseLost:
        """Only on the failure path: one read to tell the worker what happened."""
        return lease_lost(lease, await self.collection.find_one(q.by_key(lease.key)))

    @driver_errors
    async def ping(self, lease: Lease, until: dt.datetime | None = None) -> Task:
        """Extend the lease by its task's ``worker_timeout_ms``, or to ``until``."""
        now = self.clock.now()
        update = lq.ping_update(lease.worker_id, lease.run_id, now, lease.reported_progress, until)
        return await self._fenced_write(lease, update, now)

    @driver_errors
    async def ping_many(self, leases: Sequence[Lease]) -> list[Lease]:
        """Extend many leases in one bulk write; returns those that were lost."""
        if not leases:
            return []
        now = self.clock.now()
        requests = [
            UpdateOne(
                lq.lease_filter(lease.key, lease.worker_id, lease.run_id, now),
                lq.ping_update(lease.worker_id, lease.run_id, now, lease.reported_progress),
            )
            for lease in leases
        ]
        result = await self.collection.bulk_write(requests, ordered=False)
        if result.matched_count == len(leases):
            return []
        # Some did not match: one read to find which (only on this path).
        cursor = self.collection.find(q.by_keys([lease.key for lease in leases]))
        live = {
            (ws.worker_id, ws.run_id)
            async for document in cursor
            for ws in Task.model_validate(document).worker_states
            if lease_is_live(ws, now)
        }
        return [lease for lease in leases if (lease.worker_id, lease.run_id) not in live]

    @driver_errors
    async def succeed(self, lease: Lease, result: Any = None) -> Task:
        task = await self._succeed(lease, result, quiet=False)
        assert task is not None  # only a quiet write may come back without its document
        return task

    @driver_errors
    async def record_success(self, lease: Lease, result: Any = None) -> None:
        """`succeed` for a caller that reads nothing back (the consumer): in a batch of
        finishes, its write then needs no read after it (`finishes`: quiet)."""
        # Quiet only where the task had no dependents when claimed: one that had would miss
        # and be sent again alone (`finishes`), a round trip more than the plain write's read.
        await self._succeed(lease, result, quiet=lease.task.dependent_count == 0)

    async def _succeed(self, lease: Lease, result: Any, *, quiet: bool) -> Task | None:
        stored = check_result(result, lease.task.options)
        now = self.clock.now()
        update = lq.success_update(lease.worker_id, lease.run_id, stored, now)
        how = None
        if quiet:
            fence = lq.lease_filter(lease.key, lease.worker_id, lease.run_id, now)
            how = Quiet({**fence, "dependent_count": 0}, update)
            if lq.quick_success_possible(lease.task, lease.run_id):
                fence = lq.quick_success_filter(lease.key, lease.worker_id, lease.run_id, now)
                how = Quiet(fence, lq.quick_success(stored, now))
        found = await self._finishes.write(lease, update, now, WorkerStateKind.SUCCESS, quiet=how)
        # A quiet write that came back without its document left no dependents to tell.
        task = None if found is None else await self.after_write(Task.model_validate(found))
        extra = {"action": "success_recorded", "key": lease.key}
        if task is not None:
            extra["state"] = task.state.value
        # the consumer logs the finished task at INFO, with its worker and time
        log.debug("attempt succeeded", extra=extra)
        return task

    @driver_errors
    async def fail(
        self, lease: Lease, error: BaseException | ErrorInfo, *, final: bool = False
    ) -> Task:
        """Record a failed attempt; ``final`` fails the task whatever retries are left."""
        info = error if isinstance(error, ErrorInfo) else ErrorInfo.from_exception(error)
        now = self.clock.now()
        task = await self._finish_write(
            lease,
            lq.fail_update(
                lease.worker_id,
                lease.run_id,
                info,
                now,
                spread=_draw_spread(),
                final=final,
            ),
            now,
            WorkerStateKind.FAIL,
        )
        log.debug(  # the consumer logs it as a WARNING, with the handler's error
            "attempt failed",
            extra={"action": "task_attempt_failed", "key": lease.key, "state": task.state.value},
        )
        return task

    @driver_errors
    async def retry_later(self, lease: Lease, delay: float, reason: str = "retry later") -> Task:
        now = self.clock.now()
        retry_at = retry_policy.retry_later_at(now, delay)
        update = lq.retry_later_update(lease.worker_id, lease.run_id, reason, retry_at, now)
        return await self._finish_write(lease, update, now, WorkerStateKind.RELEASED)

    @driver_errors
    async def unclaim(self, lease: Lease) -> Task:
        """Undo the claim of ``lease``, whose handler never started: the task is claimable
        at once, as if never claimed by it (`queries.lease.unclaim_update`: no attempt
        counted). A fenced write, as a release is."""
        now = self.clock.now()
        update = lq.unclaim_update(lease.worker_id, lease.run_id, now)
        return await self._fenced_write(lease, update, now)

    @driver_errors
    async def release(self, lease: Lease, reason: str = "released by the worker") -> Task:
        now = self.clock.now()
        update = lq.release_update(lease.worker_id, lease.run_id, reason, now)
        return await self._finish_write(lease, update, now, WorkerStateKind.RELEASED)

    @driver_errors
    async def recover_dependents(self) -> int:
        """Tell the dependents of every finished task whose writer did not (owed by this
        process, or left by a crashed writer anywhere); returns how many tasks were caught
        up."""
        await self.ready()
        return await self._flows.recover()
