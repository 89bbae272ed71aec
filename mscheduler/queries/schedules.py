"""Schedule documents (``<collection>.schedules``): the filters and updates, pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from .stages import Document, Pipeline


def by_id(schedule_id: str) -> Document:
    return {"_id": schedule_id}


def of_names(names: Sequence[str]) -> Document:
    return {"name": {"$in": list(names)}}


def listed(names: Sequence[str] | None) -> Document:
    """The schedules of ``names`` (None or none: every schedule)."""
    return of_names(names) if names else {}


def due_filter(names: Sequence[str], now: dt.datetime) -> Document:
    """Schedules of ``names`` with an occurrence due (served by the ``name_next_at`` index)."""
    return {"name": {"$in": list(names)}, "next_at": {"$lte": now}}


NEXT_SORT: list[tuple[str, int]] = [("next_at", 1)]
ID_ORDER: list[tuple[str, int]] = [("_id", 1)]


def at_version(schedule_id: str, version: int) -> Document:
    """A registration writes the schedule it read, or nothing: an occurrence advanced or a
    registration made meanwhile (each bumps ``version``) is never undone by it. A document
    written before schedules had a version has none: it is read as version 0."""
    if version == 0:
        return {"_id": schedule_id, "version": {"$in": [0, None]}}  # null matches a missing field
    return {"_id": schedule_id, "version": version}


def advance(
    schedule_id: str,
    handled: dt.datetime,
    next_at: dt.datetime,
    last_key: str | None,
    now: dt.datetime,
) -> tuple[Document, Pipeline]:
    """Move past the occurrences up to ``handled``, unless another worker did already
    (``next_at`` is no longer the ``handled`` this worker read): the occurrences' tasks were
    published first, so a worker that dies in between leaves them to the next one, which
    publishes the same keys again, idempotently.

    ``last_key`` is recorded even by a worker that lost the advance: two workers at once may
    disagree on an occurrence (one saw the previous one still running and skipped it, the
    other saw it ended and published it), and ``skip_if_running`` must see the one published.
    So ``last_key`` only moves to a later occurrence, whoever writes it (keys of one schedule
    order as their times: the same id, then a fixed-width UTC time)."""
    advanced = {"$eq": ["$next_at", handled]}
    later = (
        False
        if last_key is None
        else {"$lt": [{"$ifNull": ["$last_key", ""]}, {"$literal": last_key}]}
    )
    changed = {"$or": [advanced, later]}
    return by_id(schedule_id), [
        {
            "$set": {
                "next_at": {"$cond": [advanced, next_at, "$next_at"]},
                "last_key": {"$cond": [later, {"$literal": last_key}, "$last_key"]},
                "updated_at": {"$cond": [changed, now, "$updated_at"]},
                "version": {
                    "$cond": [changed, {"$add": [{"$ifNull": ["$version", 0]}, 1]}, "$version"]
                },
            }
        }
    ]
