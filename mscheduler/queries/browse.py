"""Filters of an operator's view of the tasks (the dashboard): pages of a list, a task's
dependents, and finished tasks by time. Each is served by a declared index, so a page costs
the same whatever the collection's size: keyset paging (after the last row shown), never
``skip``, and a sort that the index that selects the rows also gives.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from bson import ObjectId

Document = dict[str, Any]

# Rows of a key prefix, in key order: key_unique's range on the prefix gives both.
KEY_ORDER: list[tuple[str, int]] = [("key", 1)]
# Rows of some names and states, in the order they are claimed, sort by `tasks.CLAIM_SORT`:
# claim_order_v2 gives it after its equality on name and state (MongoDB merges the sorted runs
# of each name and state).
# Every row, newest first: the _id index.
NEWEST_ORDER: list[tuple[str, int]] = [("_id", -1)]
NAME_ORDER: list[tuple[str, int]] = [("name", 1)]
NAME_ONLY: Document = {"name": 1, "_id": 0}
KEY_AND_STATE: Document = {"key": 1, "state": 1, "_id": 0}
EVERY: Document = {}  # every document of a collection (the paused names)


def _prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (None: no bound)."""
    while prefix:
        last = ord(prefix[-1])
        # The next code point, past the surrogates (BSON strings are UTF-8: none stored).
        following = 0xE000 if last == 0xD7FF else last + 1
        if following <= 0x10FFFF:
            return prefix[:-1] + chr(following)
        prefix = prefix[:-1]
    return None


def prefix_page_filter(
    prefix: str, name: str | None, state: str | None, after_key: str | None
) -> Document:
    """Tasks whose key starts with ``prefix`` (after ``after_key``), in `KEY_ORDER`: a range
    of key_unique; name and state are checked on the rows of that range only."""
    bounds: Document = {"$gt": after_key} if after_key is not None else {"$gte": prefix}
    end = _prefix_end(prefix)
    if end is not None:
        bounds["$lt"] = end
    query: Document = {"key": bounds}
    if name is not None:
        query["name"] = name
    if state is not None:
        query["state"] = state
    return query


def claim_order_page_filter(
    names: Sequence[str],
    states: Sequence[str],
    after_position: tuple[int, dt.datetime, ObjectId] | None,
) -> Document:
    """Tasks of ``names`` in ``states`` that come after ``after_position`` (priority,
    created_at, _id of the last row shown) in `tasks.CLAIM_SORT`. The three branches of the
    ``$or`` are the three ways to come later in that order; all of them are bounds on keys of
    claim_order_v2, read from the index without fetching the rows they skip."""
    query: Document = {"name": {"$in": list(names)}, "state": {"$in": list(states)}}
    if after_position is not None:
        priority, created_at, task_id = after_position
        query["$or"] = [
            {"options.priority": {"$lt": priority}},
            {"options.priority": priority, "created_at": {"$gt": created_at}},
            {"options.priority": priority, "created_at": created_at, "_id": {"$gt": task_id}},
        ]
    return query


def newest_page_filter(after_id: ObjectId | None) -> Document:
    """Every task older than ``after_id``, in `NEWEST_ORDER`."""
    return {} if after_id is None else {"_id": {"$lt": after_id}}


def name_after_filter(after_name: str | None) -> Document:
    """The first task name after ``after_name`` in `NAME_ORDER`: one seek in claim_order_v2
    per name, so listing the names reads one row per name, not every task."""
    return {"name": {"$gt": after_name if after_name is not None else ""}}


def dependents_filter(key: str) -> Document:
    """Tasks that depend on ``key`` (the dependents index)."""
    return {"depends_on": key}


def finished_filter(state: str, since: dt.datetime, until: dt.datetime) -> Document:
    """Tasks that ended in ``state`` in (since, until]: a range of the finished index."""
    return {"state": state, "finished_at": {"$gt": since, "$lte": until}}
