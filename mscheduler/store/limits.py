"""Limits per task name in the database: the limits themselves, and the tokens a claim of a
limited name takes first (see `queries.limits` for the protocol and its invariant)."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence

from pymongo import ReturnDocument
from pymongo.errors import ConnectionFailure

from .. import layout
from ..clock import to_bson_time
from ..models import Limit, WorkerStateKind, check_name, checked
from ..queries import limits as lq
from ..queries import tasks as q
from ..specs import LimitSpec
from .base import BesideTasks
from .driver import driver_errors

# A consumer held back by max_running asks again this often: a slot frees when a task ends,
# which no write tells it of (a consumer of the same process is told at once).
RUNNING_RECHECK = dt.timedelta(seconds=1)
# A full window whose freeing start is still held (its handler about to start) is asked again
# after ``per``, as that start will likely count until then, and never sooner than this.
_HELD_RECHECK = dt.timedelta(milliseconds=50)
# How long a start is held beyond its window until its handler's start confirms it
# (`queries.limits`): a handler that starts later than this after it takes a start of its own.
START_HOLD = dt.timedelta(seconds=10)


def free_at(limit: Limit, now: dt.datetime) -> dt.datetime:
    """When to ask for a token of ``limit``'s name again: for a full window, when its oldest
    start leaves it (known in advance); for ``max_running``, when a slot expires or
    `RUNNING_RECHECK` from now, whichever is first (a task may end, and free its slot, at any
    moment)."""
    # A start counting beyond ``per`` from now is held: no write tells us when its
    # handler's start confirms it (which ends it sooner), so it is looked at again then.
    held = now + max(dt.timedelta(milliseconds=limit.per_ms or 0), _HELD_RECHECK)
    times = []
    for most, entries in ((limit.rate, limit.starts), (limit.max_running, limit.slots)):
        live = sorted(
            min(e.until, held) if entries is limit.starts else e.until
            for e in entries
            if e.until is not None and e.until > now
        )
        if most is not None and len(live) >= most:
            free = live[len(live) - most]
            times.append(free if entries is limit.starts else min(free, now + RUNNING_RECHECK))
    # Not full when read: a slot freed between the refused write and this read. Asked
    # again after the recheck, never at once (a loop of requests), never dropped.
    return max(times, default=now + RUNNING_RECHECK)


def partitions_running(limit: Limit, now: dt.datetime) -> dict[str, int]:
    """Live slots per partition at ``now``."""
    counts: dict[str, int] = {}
    for entry in limit.slots:
        if entry.partition is not None and entry.until is not None and entry.until > now:
            counts[entry.partition] = counts.get(entry.partition, 0) + 1
    return counts


def full_partitions(limit: Limit, now: dt.datetime) -> list[str]:
    """The partitions at their ``partition_max_running`` at ``now``: a claim leaves out their
    tasks (`consumer.limits.Limiter.take`)."""
    most = limit.partition_max_running
    if most is None:
        return []
    return sorted(p for p, count in partitions_running(limit, now).items() if count >= most)


def _ms(duration: dt.timedelta) -> int:
    return round(duration.total_seconds() * 1000)


class Limits(BesideTasks):
    SUFFIX = layout.LIMITS

    @driver_errors
    async def set(self, spec: LimitSpec) -> Limit:
        """Replace the limits of ``spec.name`` (set anew: a field not given is removed). A
        ``max_running`` counts the attempts running now (`adopt_running`), wherever they
        were claimed: no start beyond it from now on."""
        update = lq.set_limit(
            spec.name, spec.rate, spec.per_ms, spec.max_running, spec.partition_max_running
        )
        await self.collection.update_one(*update, upsert=True)
        if spec.max_running is not None or spec.partition_max_running is not None:
            await self.adopt_running(spec.name)
        await self._tasks.control_changed()
        found = await self.collection.find_one(lq.by_name(spec.name))
        return Limit.model_validate(found)

    @driver_errors
    async def adopt_running(self, name: str) -> None:
        """The live attempts of ``name`` take slots (their run_ids), each until its lease
        ends (one read of its running tasks, one write). A claim whose token request found no
        limit and that lands after the read is adopted by its holder as it hears of the
        limit (`consumer.limits.Limiter.apply`), or lapses with its lease's first end."""
        now = self._tasks.clock.now()
        untils: dict[str, dt.datetime] = {}
        partitions: dict[str, str] = {}
        cursor = self._tasks.collection.find(q.running_of(name), q.RUNNING_ATTEMPTS)
        async for document in cursor:
            partition = (document.get("options") or {}).get("partition")
            for ws in document.get("worker_states") or []:
                expires = ws.get("ping_expire_at")
                if ws.get("state") == WorkerStateKind.RUNNING.value and expires is not None:
                    expires = to_bson_time(expires)
                    if expires > now:
                        untils[ws["run_id"]] = expires
                        if partition is not None:
                            partitions[ws["run_id"]] = partition
        if untils:
            await self.collection.update_one(*lq.adopt(name, untils, partitions))

    @driver_errors
    async def remove(self, name: str) -> bool:
        """True if ``name`` had a limit. The document stays, with the slots of the runs that
        still hold them (`queries.limits.remove_limit`): a limit set again counts them. The
        control version is bumped either way (`store.controls`)."""
        removal = lq.remove_limit(checked(check_name, name), self._tasks.clock.now())
        result = await self.collection.update_one(*removal)
        await self._tasks.control_changed()
        return bool(result.matched_count)

    @driver_errors
    async def of(self, names: Sequence[str] | None = None) -> dict[str, Limit]:
        """The limits (of ``names``); a removed limit's document is none."""
        cursor = self.collection.find(lq.limited(names))
        return {d["_id"]: Limit.model_validate(d) async for d in cursor}

    @driver_errors
    async def acquire(
        self, name: str, until: dt.datetime, token: str | None = None
    ) -> str | dt.datetime | None:
        """A token for one claim of ``name`` (``token`` if given, else a fresh one; its start
        held, `confirm` it as the handler starts); or when one may be had (its limit is
        reached); or None: ``name`` was never limited. A removed limit's document gives a
        token always (its slot counts if the limit is set again)."""
        token, now = token or uuid.uuid4().hex, self._tasks.clock.now()
        update = lq.acquire(name, token, now, until, _ms(START_HOLD))
        try:
            taken = await self.collection.find_one_and_update(
                *update, return_document=ReturnDocument.AFTER
            )
        except ConnectionFailure:
            # The token may have been taken with the reply lost: nobody would hold its slot.
            with contextlib.suppress(ConnectionFailure):
                await self.collection.update_one(*lq.give_back(name, token))
            raise
        if taken is not None:
            taken_limit = Limit.model_validate(taken)
            given = Token(token)
            if taken_limit.partition_max_running is not None:
                given.partitioned = True
                given.full_partitions = tuple(full_partitions(taken_limit, now))
            return given
        found = await self.collection.find_one(lq.by_name(name))
        return None if found is None else free_at(Limit.model_validate(found), now)

    @driver_errors
    async def bind_partition(
        self, name: str, token: str, partition: str, until: dt.datetime
    ) -> bool:
        """The slot of ``token`` counts in ``partition`` and lives until ``until``, if the
        partition is below its ``partition_max_running`` (`queries.limits.bind_partition`);
        False if it is not (the caller gives its task back)."""
        update = lq.bind_partition(name, token, partition, until, self._tasks.clock.now())
        return bool((await self.collection.update_one(*update)).matched_count)

    @driver_errors
    async def start(self, name: str) -> str | dt.datetime | None:
        """Take a start of ``name`` (a slot held already): its token when taken (held,
        `confirm` it as the handler starts), when its rate window frees if full, or None:
        ``name`` has no limit."""
        token, now = uuid.uuid4().hex, self._tasks.clock.now()
        update = lq.start(name, token, now, _ms(START_HOLD))
        taken = await self.collection.find_one_and_update(*update)
        if taken is not None:
            return token
        found = await self.collection.find_one(lq.by_name(name))
        if found is None:
            return None
        limit = Limit.model_validate(found)
        return free_at(limit.model_copy(update={"max_running": None}), now)

    @driver_errors
    async def confirm(self, name: str, tokens: Sequence[str]) -> None:
        """The handlers of these held starts have started: each counts ``per`` from now."""
        await self.collection.update_one(*lq.confirm(name, tokens, self._tasks.clock.now()))

    @driver_errors
    async def started(
        self,
        name: str,
        tokens: Sequence[str],
        leases: Mapping[str, dt.datetime],
        partitions: Mapping[str, str] | None = None,
    ) -> None:
        """Leases handed out for work that starts now: their held starts ``tokens``
        confirmed, and their slots (run_id -> the lease's end) living as long as they do,
        counting in their tasks' ``partitions`` (`queries.limits.extend`)."""
        update = lq.started(name, tokens, leases, self._tasks.clock.now(), partitions)
        await self.collection.update_one(*update)

    @driver_errors
    async def give_back(self, name: str, token: str) -> None:
        await self.collection.update_one(*lq.give_back(name, token))

    @driver_errors
    async def adopt(
        self,
        name: str,
        untils: Mapping[str, dt.datetime],
        partitions: Mapping[str, str] | None = None,
    ) -> None:
        await self.collection.update_one(*lq.adopt(name, untils, partitions))

    @driver_errors
    async def release(self, name: str, token: str) -> None:
        """A run of ``name`` ended: its slot is free, for this process or another."""
        await self.collection.update_one(*lq.release(name, token))
        await self._tasks.work_written()

    @driver_errors
    async def extend(
        self,
        name: str,
        untils: Mapping[str, dt.datetime],
        partitions: Mapping[str, str] | None = None,
    ) -> None:
        """Each slot of ``untils`` (token -> time) lives until its time, counting in its
        task's partition if ``partitions`` names one (`queries.limits.extend`)."""
        await self.collection.update_one(*lq.extend(name, untils, partitions))


class Token(str):
    """A token taken for a claim (`Limits.acquire`), and the partitions of its name at their
    ``partition_max_running`` as it was taken, whose tasks the claim leaves out; when the
    name counts partitions (``partitioned``), the claim binds its slot to the partition of
    the task it won (`Limits.bind_partition`)."""

    full_partitions: tuple[str, ...] = ()
    partitioned: bool = False
