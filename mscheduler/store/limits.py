"""Limits per task name in the database: the limits themselves, and the tokens a claim of a
limited name takes first (see `queries.limits` for the protocol and its invariant)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import ConnectionFailure

from .. import layout
from ..clock import to_bson_time
from ..errors import ConfigurationError
from ..models import Limit, WorkerStateKind, check_name, checked
from ..queries import limits as lq
from ..queries import tasks as q
from .base import BesideTasks
from .driver import driver_errors

# A consumer held back by max_running asks again this often: a slot frees when a task ends,
# which no write tells it of (a consumer of the same process is told at once).
RUNNING_RECHECK = dt.timedelta(seconds=1)
# How long a start is held beyond its window until its handler's start confirms it
# (`queries.limits`): a handler that starts later than this after it takes a start of its own.
START_HOLD = dt.timedelta(seconds=10)


def _ms(duration: dt.timedelta) -> int:
    return round(duration.total_seconds() * 1000)


def _checked_limits(
    rate: Any, per: Any, max_running: Any, partition_max_running: Any = None
) -> int | None:
    """``per`` in milliseconds, once every value is one a limit can have."""
    counts = (
        ("rate", rate),
        ("max_running", max_running),
        ("partition_max_running", partition_max_running),
    )
    for field, value in counts:
        number = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and not (number and 1 <= value <= 1_000_000):
            raise ConfigurationError(
                f"{field}: expected an integer from 1 to 1000000, got {value!r}"
            )
    if (rate is None) != (per is None):
        raise ConfigurationError("per: give rate and per together (rate=100, per=1 minute)")
    if rate is None and max_running is None and partition_max_running is None:
        raise ConfigurationError(
            "set_limit: give rate and per, max_running, partition_max_running, or several"
        )
    if per is None:
        return None
    longest = dt.timedelta(days=366)
    if not isinstance(per, dt.timedelta) or not dt.timedelta(milliseconds=1) <= per <= longest:
        raise ConfigurationError(f"per: expected a timedelta from 1 ms to a year, got {per!r}")
    return round(per.total_seconds() * 1000)


@dataclasses.dataclass(frozen=True)
class LimitSpec:
    """The limits of one name, checked (`limit_spec`): what `Limits.set` writes."""

    name: str
    rate: int | None
    per_ms: int | None
    max_running: int | None
    partition_max_running: int | None = None


def limit_spec(
    name: str,
    *,
    rate: int | None = None,
    per: dt.timedelta | None = None,
    max_running: int | None = None,
    partition_max_running: int | None = None,
) -> LimitSpec:
    """The spec of `Scheduler.set_limit`'s arguments; a bad one raises a `ConfigurationError`
    naming its field."""
    name = checked(check_name, name)
    per_ms = _checked_limits(rate, per, max_running, partition_max_running)
    return LimitSpec(
        name=name,
        rate=rate,
        per_ms=per_ms,
        max_running=max_running,
        partition_max_running=partition_max_running,
    )


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
                given.full_partitions = tuple(taken_limit.full_partitions(now))
            return given
        found = await self.collection.find_one(lq.by_name(name))
        return None if found is None else Limit.model_validate(found).free_at(now)

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
        return limit.model_copy(update={"max_running": None}).free_at(now)

    @driver_errors
    async def confirm(self, name: str, tokens: Sequence[str]) -> None:
        """The handlers of these held starts have started: each counts ``per`` from now."""
        await self.collection.update_one(*lq.confirm(name, tokens, self._tasks.clock.now()))

    @driver_errors
    async def started(
        self, name: str, tokens: Sequence[str], leases: Mapping[str, dt.datetime]
    ) -> None:
        """Leases handed out for work that starts now: their held starts ``tokens``
        confirmed, and their slots (run_id -> the lease's end) living as long as they do."""
        update = lq.started(name, tokens, leases, self._tasks.clock.now())
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
    async def extend(self, name: str, untils: Mapping[str, dt.datetime]) -> None:
        """Each slot of ``untils`` (token -> time) lives until its time."""
        await self.collection.update_one(*lq.extend(name, untils))


class Token(str):
    """A token taken for a claim (`Limits.acquire`), and the partitions of its name at their
    ``partition_max_running`` as it was taken, whose tasks the claim leaves out; when the
    name counts partitions (``partitioned``), the claim binds its slot to the partition of
    the task it won (`Limits.bind_partition`)."""

    full_partitions: tuple[str, ...] = ()
    partitioned: bool = False
