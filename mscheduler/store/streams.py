"""Change streams: the only place one is opened or closed (a `watch` on the collection).

The discovery hub, the control hub and a watch use these (their pipelines come from
`queries.changes`). `ResumePoint` keeps where a stream resumes, the rules of which come from
the server:

- a stream's resume token moves on with every batch, empty ones included (the server's
  ``postBatchResumeToken``, which pymongo keeps as ``resume_token``): a quiet stream saved
  at its last event would rescan, or lose to the oplog window, what it skipped since;
- after an ``invalidate`` (its collection dropped or renamed) ``resumeAfter`` is refused,
  ``startAfter`` the invalidate's token opens the stream again;
- an event the server cannot send (over 16 MiB: ``BSONObjectTooLarge``) fails every read
  from the token before it: after a few failed reads at one token, start afresh.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import anyio
from pymongo.errors import OperationFailure, PyMongoError

from ..collection import TasksCollection
from ..errors import ConfigurationError
from ..worker_options import Discovery
from .driver import driver_result

# The stream cannot be resumed from our token: start afresh and re-fetch everything.
RESUME_IMPOSSIBLE = frozenset({286, 280, 260})
# The server will not give a change stream here, whatever we retry: not a replica set
# (40573), no ``changeStream`` privilege (13), not supported (115: Cosmos DB, DocumentDB),
# an engine that does not know the stage (40324, or an error without a code, as mongoeco's).
# Any other code (an election's 6, 7, 89, 91, 133, 134, 189, 262, 9001, 10107, 11600...)
# is transient: retried with backoff, never taken for "no streams here".
NO_STREAMS_HERE = frozenset({40573, 13, 115, 40324})
# Refused a stream on the whole database, where one on the tasks collection may still be
# granted (``changeStream`` and ``find`` given on some collections only).
UNAUTHORIZED = 13
# How long a read waits for events before it returns an empty batch (and a new resume
# token): the server's default for a change stream's getMore, said aloud.
MAX_AWAIT_MS = 1_000
# Reads that fail in a row at one resume token before the stream is opened afresh.
FAILURES_BEFORE_FRESH = 3


def refuses_streams(exc: OperationFailure) -> bool:
    """Whether the server said "no change streams here" (as opposed to "not now")."""
    return exc.code is None or exc.code in NO_STREAMS_HERE


class ResumePoint:
    """Where a stream resumes, kept after every batch; self-contained, so any reader of a
    stream (a consumer's listener, a process-wide one) keeps it the same way."""

    def __init__(self) -> None:
        self.token: Any = None
        self.invalidated = False  # the token is an invalidate's: startAfter, not resumeAfter
        self._failed_at: Any = None
        self._failures = 0

    def opened(self, stream: Any) -> None:
        """A fresh stream: its own starting point."""
        self.token, self.invalidated = stream.resume_token, False

    def read(self, stream: Any, event: dict[str, Any] | None) -> None:
        """After every read, empty or not: the stream's token (an empty batch's included)."""
        if event is not None and event.get("operationType") == "invalidate":
            self.token, self.invalidated = event["_id"], True
            return
        token = stream.resume_token
        if token is None and event is not None:
            token = event.get("_id")
        if token is not None:
            self.token, self.invalidated = token, False

    def open_options(self) -> dict[str, Any]:
        if self.token is None:
            return {}
        return {"start_after" if self.invalidated else "resume_after": self.token}

    def read_failed(self) -> bool:
        """A read failed at the current token: True when that keeps happening there (an
        event the server cannot send, say) and only a fresh stream gets past it."""
        if self._failed_at == self.token and self.token is not None:
            self._failures += 1
        else:
            self._failed_at, self._failures = self.token, 1
        if self._failures >= FAILURES_BEFORE_FRESH:
            self._failed_at, self._failures = None, 0
            return True
        return False


class Watched(Protocol):
    """What a stream is opened on: a store part with a ``collection`` (the tasks, the control
    version), or that collection's database."""

    @property
    def collection(self) -> TasksCollection: ...


async def open_change_stream(
    store: Watched,
    pipeline: list[dict[str, Any]],
    resume_after: Any = None,
    *,
    start_after: Any = None,
    max_await_time_ms: int | None = None,
    whole_database: bool = False,
) -> Any:
    """``watch`` with the document after each write, on the collection or (``whole_database``)
    on its database; pymongo's async API returns a coroutine, Motor the stream itself."""
    kwargs: dict[str, Any] = {"full_document": "updateLookup"}
    if resume_after is not None:
        kwargs["resume_after"] = resume_after
    if start_after is not None:
        kwargs["start_after"] = start_after
    if max_await_time_ms is not None:
        kwargs["max_await_time_ms"] = max_await_time_ms
    watched = store.collection.database if whole_database else store.collection
    return await driver_result(watched.watch(pipeline, **kwargs))


async def open_unless_refused(
    store: Watched, pipeline: list[dict[str, Any]], discovery: Discovery, **options: Any
) -> tuple[Any, OperationFailure | None]:
    """``(stream, None)``, or ``(None, refusal)`` when the caller must poll instead.

    Only a refusal (`refuses_streams`) means "no stream here"; any other error, a transient
    one from a server in an election included, propagates for the caller to retry with
    backoff. With ``discovery="stream"`` a refusal is a `ConfigurationError`. On the whole
    database (``whole_database``) a refusal propagates: the caller may still be granted a
    stream on the collection (a role that grants it there alone refuses with 13)."""
    if discovery == "poll":
        return None, None
    try:
        return await open_change_stream(store, pipeline, **options), None
    except OperationFailure as exc:
        if not refuses_streams(exc):
            raise
        if options.get("whole_database"):
            raise  # the caller tries the collection before it takes this for "no streams"
        if discovery == "stream":
            raise ConfigurationError(
                f"discovery: 'stream' was asked for, but the server refused to open a change "
                f"stream: {exc}"
            ) from exc
        return None, exc


async def close_quietly(stream: Any) -> None:
    """Close a stream even while being cancelled; a failure to close changes nothing."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(PyMongoError):
            await driver_result(stream.close())
