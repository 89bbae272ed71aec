"""Change streams: the only place one is opened or closed (a `watch` on the collection).

The consumer's listener and `waiting` use these. `task_changes` builds the stream's pipeline
(pure, like `mscheduler.queries`, but an aggregation of change events, not a query of tasks).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
from pymongo.errors import OperationFailure, PyMongoError

from ..errors import ConfigurationError
from ..worker_options import Discovery

# The stream cannot be resumed from our token: start afresh and re-fetch everything.
RESUME_IMPOSSIBLE = frozenset({286, 280, 260})


def task_changes(*, wakes_only: bool = False, **fields: Sequence[str]) -> list[dict[str, Any]]:
    """Server-side filter: writes to tasks whose ``field`` is one of the values given (e.g.
    ``name=[...]``, ``key=[...]``). Deletes are left out: a deleted task's claim or ping
    simply matches nothing.

    ``wakes_only`` (a consumer's stream): only inserts, replaces and the updates that bumped
    ``wakes`` (`queries.derived.wakes_consumers`), so pings, claims and finishes wake nobody.
    That part tests the event alone, not ``fullDocument``: MongoDB (5.1+) moves such a
    predicate into its oplog scan, so a ping is dropped there, before any ``updateLookup``.
    A pipeline update's ``updatedFields`` names ``wakes`` on every engine, as it is a
    top-level number (a changed subdocument may be reported by paths inside it instead)."""
    match: dict[str, Any] = {"operationType": {"$in": ["insert", "update", "replace"]}}
    if wakes_only:
        match = {
            "$or": [
                {"operationType": {"$in": ["insert", "replace"]}},
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.wakes": {"$exists": True},
                },
            ]
        }
    for field, values in fields.items():
        match[f"fullDocument.{field}"] = {"$in": list(values)}
    return [{"$match": match}]


class Watched(Protocol):
    """What a stream is opened on: a store part with a ``collection`` (tasks, paused names)."""

    @property
    def collection(self) -> Any: ...


async def open_change_stream(
    store: Watched, pipeline: list[dict[str, Any]], resume_after: Any = None
) -> Any:
    """``watch`` with the document after each write; pymongo's async API returns a coroutine,
    Motor the stream itself."""
    kwargs: dict[str, Any] = {"full_document": "updateLookup"}
    if resume_after is not None:
        kwargs["resume_after"] = resume_after
    stream = store.collection.watch(pipeline, **kwargs)
    return await stream if inspect.isawaitable(stream) else stream


async def open_unless_refused(
    store: Watched, pipeline: list[dict[str, Any]], discovery: Discovery
) -> tuple[Any, OperationFailure | None]:
    """``(stream, None)``, or ``(None, refusal)`` when the caller must poll instead.

    The server's refusal is an `OperationFailure`, whatever its code: the codes differ by
    server and reason (40573 on a standalone mongod, 13 without the privilege, 115 or none
    elsewhere), and any of them means "no stream here". Network errors are not refusals and
    propagate. With ``discovery="stream"`` a refusal is a `ConfigurationError`."""
    if discovery == "poll":
        return None, None
    try:
        return await open_change_stream(store, pipeline), None
    except OperationFailure as exc:
        if discovery == "stream":
            raise ConfigurationError(
                f"discovery: 'stream' was asked for, but the server refused to open a change "
                f"stream: {exc}"
            ) from exc
        return None, exc


async def close_quietly(stream: Any) -> None:
    """Close a stream even while being cancelled; a failure to close changes nothing."""
    with anyio.CancelScope(shield=True):
        try:
            result = stream.close()
            if inspect.isawaitable(result):
                await result
        except PyMongoError:
            pass
