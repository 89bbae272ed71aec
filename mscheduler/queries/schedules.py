"""Schedule documents (``<collection>.schedules``): the filters and updates, pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from .stages import Document


def by_id(schedule_id: str) -> Document:
    return {"_id": schedule_id}


def of_names(names: Sequence[str]) -> Document:
    return {"name": {"$in": list(names)}}


def due_filter(names: Sequence[str], now: dt.datetime) -> Document:
    """Schedules of ``names`` with an occurrence due (served by the ``name_next_at`` index)."""
    return {"name": {"$in": list(names)}, "next_at": {"$lte": now}}


NEXT_SORT: list[tuple[str, int]] = [("next_at", 1)]
INDEXES = [("name_next_at", [("name", 1), ("next_at", 1)])]


def advance(
    schedule_id: str,
    handled: dt.datetime,
    next_at: dt.datetime,
    last_key: str | None,
    now: dt.datetime,
) -> tuple[Document, Document]:
    """Move past the occurrences up to ``handled``, unless another worker did already (the
    filter names the ``next_at`` this worker read): the occurrences' tasks were published
    first, so a worker that dies in between leaves them to the next one, which publishes
    the same keys again, idempotently."""
    update: Document = {"next_at": next_at, "updated_at": now}
    if last_key is not None:
        update["last_key"] = last_key
    return {"_id": schedule_id, "next_at": handled}, {"$set": update}
