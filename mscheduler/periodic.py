"""Periodic tasks: what a schedule is, and which occurrences are due (pure, no I/O); a
schedule is built from the API's arguments by `specs.new_schedule`.

A schedule is a document of its own (``<collection>.schedules``). Any consumer may publish its
due occurrences: each occurrence is a task whose key is the schedule's id and the
occurrence's time, so N workers publishing it make one task. Idempotent publish is the
cluster-wide dedupe: no leader, no lock. Cron expressions are read by cronsim, which follows
cron's own rules across daylight-saving changes (a time skipped in spring runs at the
change; one repeated in autumn runs once).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import zoneinfo
from typing import Any

from cronsim import CronSim, CronSimError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from . import constants as c
from .clock import UTC, to_bson_time
from .models import (
    CatchUp,
    TaskOptions,
    UtcDatetime,
    check_key,
    check_name,
)

# With catch_up="none", an occurrence is still run if found at most this late (a consumer
# busy for a moment is not downtime).
MISFIRE_GRACE = dt.timedelta(seconds=60)
# With catch_up="all", at most this many missed occurrences are published at once.
MAX_CATCH_UP = 1_000
_KEY_TIME = "%Y%m%dT%H%M%SZ"


class Schedule(BaseModel):
    """Stored as is (field names are the document's); ``_id`` is the schedule's id."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    id: str = Field(alias="_id")
    name: str
    cron: str | None = None
    every_ms: int | None = Field(default=None, ge=1_000, le=366 * 86_400_000)
    timezone: str = "UTC"
    payload: Any = None
    options: TaskOptions = Field(default_factory=TaskOptions)
    skip_if_running: bool = False
    catch_up: CatchUp = "latest"
    jitter_ms: int = Field(default=0, ge=0, le=86_400_000)
    anchor: UtcDatetime  # every_ms counts from here; cron ignores it
    next_at: UtcDatetime  # the next occurrence not yet handled
    last_key: str | None = None  # the task of the latest occurrence published
    created_at: UtcDatetime
    updated_at: UtcDatetime
    version: int = 0  # + 1 at every write: a registration writes only the version it read

    @field_validator("id")
    @classmethod
    def _id_is_a_key_prefix(cls, value: str) -> str:
        return check_schedule_id(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{value!r} is not an IANA timezone (Europe/Paris, UTC)") from exc
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                CronSim(value, dt.datetime(2030, 1, 1, tzinfo=UTC))
            except CronSimError as exc:
                raise ValueError(f"{value!r} is not a cron expression: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _cron_or_every(self) -> Schedule:
        if (self.cron is None) == (self.every_ms is None):
            raise ValueError("give either cron or every, not both and not neither")
        return self

    def after(self, moment: dt.datetime) -> dt.datetime:
        """The first occurrence strictly after ``moment``."""
        if self.cron is not None:
            local = moment.astimezone(zoneinfo.ZoneInfo(self.timezone))
            return to_bson_time(next(CronSim(self.cron, local)))
        assert self.every_ms is not None
        every = dt.timedelta(milliseconds=self.every_ms)
        periods = (moment - self.anchor) // every + 1 if moment >= self.anchor else 0
        return to_bson_time(self.anchor + periods * every)

    def key_of(self, occurrence: dt.datetime) -> str:
        return f"{self.id}@{occurrence.astimezone(UTC).strftime(_KEY_TIME)}"

    def start_of(self, occurrence: dt.datetime) -> dt.datetime:
        """When the occurrence's task may start: its time plus a jitter that every worker
        computes alike (from the key), so whichever publishes it, the task is the same."""
        if not self.jitter_ms:
            return occurrence
        digest = hashlib.sha256(self.key_of(occurrence).encode()).digest()
        return occurrence + dt.timedelta(
            milliseconds=int.from_bytes(digest[:8], "big") % (self.jitter_ms + 1)
        )


def due(schedule: Schedule, now: dt.datetime) -> tuple[list[dt.datetime], dt.datetime]:
    """The occurrences to publish at ``now`` (by the catch-up policy) and the next one
    after them. Occurrences from ``next_at`` up to ``now`` were missed or are due now:
    ``latest`` runs the last one, ``all`` each of them (at most `MAX_CATCH_UP`), ``none``
    only one that is less than `MISFIRE_GRACE` late."""
    missed: list[dt.datetime] = []
    moment = schedule.next_at
    while moment <= now:
        missed.append(moment)
        if len(missed) > MAX_CATCH_UP:
            missed.pop(0)
        moment = schedule.after(moment)
    if schedule.catch_up == "all":
        return missed, moment
    latest = missed[-1:]
    if schedule.catch_up == "none":
        latest = [m for m in latest if now - m <= MISFIRE_GRACE]
    return latest, moment


# An occurrence's key is "<id>@<time>", the time in at most this many characters.
_OCCURRENCE_SUFFIX = 1 + 16


def check_schedule_id(value: str) -> str:
    """A schedule's id, which its occurrences' keys start with (``<id>@<time>``): a key
    without the room the time takes, and without ``@``."""
    field = "schedule_id"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field}: must be a non-empty string")
    if len(value) + _OCCURRENCE_SUFFIX > c.MAX_KEY_LENGTH:
        raise ValueError(
            f"{field}: {len(value)} characters long; the limit is "
            f"{c.MAX_KEY_LENGTH - _OCCURRENCE_SUFFIX} (its occurrences' keys add the time)"
        )
    if "@" in value:
        raise ValueError(f"{field}: must not contain '@' (it separates the time)")
    check_key(value)
    return value


# What a registration defines; the other fields are the schedule's state, which it keeps.
_DEFINITION = (
    "name",
    "cron",
    "every_ms",
    "timezone",
    "payload",
    "options",
    "skip_if_running",
    "catch_up",
    "jitter_ms",
)


def _times(schedule: Schedule) -> tuple[Any, ...]:
    """What decides the occurrences' times (cron ignores the anchor, every the timezone)."""
    if schedule.cron is not None:
        return ("cron", schedule.cron, schedule.timezone)
    return ("every", schedule.every_ms)


def reregistered(stored: Schedule, wanted: Schedule, now: dt.datetime) -> Schedule:
    """``wanted`` (`specs.new_schedule`, anchored at ``now``) registered over ``stored``, the
    same id: ``stored`` itself when nothing of the definition changed. A change keeps the
    schedule's state: its ``anchor`` (an ``every`` keeps its phase), ``last_key``
    (``skip_if_running`` still sees the occurrence that runs) and ``next_at`` (occurrences
    missed meanwhile are caught up). Only a change of the occurrences' times (``cron``,
    ``timezone`` of a cron, ``every``) moves ``next_at``: to the new times' first one not
    before the first unhandled occurrence, or after ``now`` if that one is still to come."""
    before, after = schedule_document(stored), schedule_document(wanted)
    if all(before[field] == after[field] for field in _DEFINITION):
        return stored
    kept = {
        "anchor": stored.anchor,
        "last_key": stored.last_key,
        "created_at": stored.created_at,
        "next_at": stored.next_at,
        "updated_at": now,
        "version": stored.version,
    }
    merged = wanted.model_copy(update=kept)
    if _times(merged) != _times(stored):
        # ``after`` is strictly after: one millisecond back keeps an occurrence at next_at.
        since = min(stored.next_at - dt.timedelta(milliseconds=1), now)
        merged = merged.model_copy(update={"next_at": merged.after(since)})
    return merged


def schedule_document(schedule: Schedule) -> dict[str, Any]:
    document = schedule.model_dump(by_alias=True)
    document["options"] = schedule.options.to_document()
    return document


__all__ = [
    "MAX_CATCH_UP",
    "MISFIRE_GRACE",
    "CatchUp",
    "Schedule",
    "due",
    "reregistered",
]
