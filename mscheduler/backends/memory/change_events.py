"""What the server does to a change event between the oplog and the reply, for the memory
backend's streams (`changefeed`): the stages a stream's pipeline may hold (``$match``, an
exclusion ``$project``), the part of a ``$match`` it tests on the oplog entry before any look-up
of the document (`oplog_filter`), and the size a reply's document may have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import bson
import bson.errors
from pymongo.errors import OperationFailure

from .engine import filter_applies

MAX_EVENT_BYTES = 16 * 1024 * 1024  # BSONObjMaxUserSize: a reply's document, as the server's
# Event fields the server can test on the oplog entry, before any lookup of the document
# (its change_stream_rewrite_helpers); anything under fullDocument needs the lookup.
_OPLOG_FIELDS = ("operationType", "documentKey", "ns", "updateDescription", "to")

Stages = list[tuple[str, Any]]


def parse_pipeline(pipeline: Sequence[Mapping[str, Any]] | None) -> Stages:
    """``("match", filter)`` and ``("project", [paths])``, in order; other stages refused."""
    stages: Stages = []
    for stage in pipeline or ():
        if set(stage) == {"$match"}:
            stages.append(("match", stage["$match"]))
        elif set(stage) == {"$project"} and all(
            v in (0, False) for v in stage["$project"].values()
        ):
            if "_id" in stage["$project"]:  # the server: the resume token was modified
                raise OperationFailure("a change stream may not project away _id", code=280)
            stages.append(("project", sorted(stage["$project"])))
        else:
            raise OperationFailure(
                f"the memory backend's change streams support only $match and exclusion "
                f"$project stages, got {dict(stage)!r}"
            )
    return stages


def run_pipeline(stages: Stages, event: dict[str, Any]) -> dict[str, Any] | None:
    """``event`` through ``stages`` (a shallow copy where a projection changes it), or None
    when a ``$match`` drops it. An invalidate passes whatever the pipeline says: the server
    sends it as it closes the cursor."""
    if event["operationType"] == "invalidate":
        return event
    copied = False
    for kind, argument in stages:
        if kind == "match":
            if not filter_applies(argument, event):
                return None
            continue
        if not copied:
            event, copied = dict(event), True
        for path in argument:
            _excluded(event, path)
    return event


def oplog_filter(match: Mapping[str, Any]) -> dict[str, Any] | None:
    """The part of ``match`` the server tests on the oplog entry; None when no part of it can
    be (then every event goes on to the lookup). Like the server's rewrite: an ``$and`` (or a
    document's implicit one) keeps what it can, an ``$or`` only if every branch keeps some."""
    kept: dict[str, Any] = {}
    for field, condition in match.items():
        if field == "$and":
            parts = [p for p in (oplog_filter(c) for c in condition) if p is not None]
            if parts:
                kept["$and"] = parts
        elif field == "$or":
            branches = [oplog_filter(c) for c in condition]
            if branches and all(b is not None for b in branches):
                kept["$or"] = branches
        elif field.split(".")[0] in _OPLOG_FIELDS:
            kept[field] = condition
    return kept or None


def _excluded(document: dict[str, Any], path: str) -> None:
    """Drop ``path`` (dotted; through arrays, as ``$project`` does) from ``document``."""
    head, _, rest = path.partition(".")
    if not rest:
        document.pop(head, None)
        return
    inner = document.get(head)
    if isinstance(inner, dict):
        inner = document[head] = dict(inner)
        _excluded(inner, rest)
    elif isinstance(inner, list):
        items = document[head] = [dict(i) if isinstance(i, dict) else i for i in inner]
        for item in items:
            if isinstance(item, dict):
                _excluded(item, rest)


def event_bytes(event: Mapping[str, Any]) -> int:
    try:
        return len(bson.encode(event))
    except (bson.errors.InvalidDocument, TypeError, OverflowError):
        return 0  # not BSON at all: not this check's business


def update_description(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What changed, by top-level field. MongoDB may name paths inside a changed subdocument
    or array instead (``worker_states.0.ping_expire_at``); a top-level scalar such as
    ``wakes`` is named the same way by both. The values are the event's own copies."""
    return {
        "updatedFields": {k: v for k, v in after.items() if k not in before or before[k] != v},
        "removedFields": [k for k in before if k not in after],
        "truncatedArrays": [],
    }
