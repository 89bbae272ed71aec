"""The live workers (``<collection>.workers``, `store.workers`) and the remote stops asked of
them (``<collection>.stops``, `store.stops`): filters and updates, pure. Both are keyed by the
worker's id."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from .stages import Document


def by_id(worker_id: str) -> Document:
    return {"_id": worker_id}


def put(worker_id: str, fields: Mapping[str, Any]) -> tuple[Document, Document]:
    """The document of ``worker_id`` written whole (an upsert): its entry's heartbeat, or a
    stop request that replaces an earlier one."""
    return {"_id": worker_id}, {"$set": dict(fields)}


FOUND_DEAD = "found_dead"


def heartbeat(worker_id: str, fields: Mapping[str, Any]) -> tuple[Document, Document]:
    """A worker's entry written whole at a heartbeat (an upsert): a worker that beats is
    alive, so a death recorded before is void."""
    return {"_id": worker_id}, {"$set": dict(fields), "$unset": {FOUND_DEAD: ""}}


def record_death(
    worker_id: str, last_seen_at: dt.datetime, since: dt.datetime, because: str
) -> tuple[Document, Document]:
    """A death found on a read, recorded once: only where none is, and only if the worker
    has not beaten since that read (a beat changes ``last_seen_at``)."""
    return (
        {"_id": worker_id, "last_seen_at": last_seen_at, FOUND_DEAD: {"$exists": False}},
        {"$set": {FOUND_DEAD: {"since": since, "because": because}}},
    )


def serving(names: Sequence[str] | None) -> Document:
    """The workers that serve any of ``names`` (None: every worker)."""
    return {} if names is None else {"names": {"$in": list(names)}}


def this_request(worker_id: str, request: str) -> Document:
    """A stop request, unless another replaced it (each request draws its own token)."""
    return {"_id": worker_id, "request": request}
