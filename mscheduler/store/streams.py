"""Change streams: the only place one is opened or closed (a `watch` on the collection).

The consumer's listener and `waiting` use these. `task_changes` builds the stream's pipeline
(pure, like `mscheduler.queries`, but an aggregation of change events, not a query of tasks);
`ResumePoint` keeps where a stream resumes, the rules of which come from the server:

- a stream's resume token moves on with every batch, empty ones included (the server's
  ``postBatchResumeToken``, which pymongo keeps as ``resume_token``): a quiet stream saved
  at its last event would rescan, or lose to the oplog window, what it skipped since;
- after an ``invalidate`` (its collection dropped or renamed) ``resumeAfter`` is refused,
  ``startAfter`` the invalidate's token opens the stream again;
- an event the server cannot send (over 16 MiB: ``BSONObjectTooLarge``) fails every read
  from the token before it: after a few failed reads at one token, start afresh.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import anyio
from anyio.abc import TaskStatus
from pymongo.errors import OperationFailure, PyMongoError

from ..errors import ConfigurationError
from ..worker_options import Discovery
from .collection import TasksCollection

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
# What a consumer or a waiter needs of an event: not what was changed (``updateDescription``
# repeats the written values: with the document after the write, a large result is sent
# twice), nor what the handler alone reads. Kept out after the ``$match``, which may test them.
CONSUMER_NEEDLESS = (
    "updateDescription",
    "fullDocument.payload",
    "fullDocument.result",
    "fullDocument.worker_states.result",
)
WAITER_NEEDLESS = ("updateDescription",)


def refuses_streams(exc: OperationFailure) -> bool:
    """Whether the server said "no change streams here" (as opposed to "not now")."""
    return exc.code is None or exc.code in NO_STREAMS_HERE


def without(fields: Sequence[str]) -> dict[str, Any]:
    """An exclusion ``$project`` stage; it never removes ``_id``, the resume token."""
    return {"$project": dict.fromkeys(fields, 0)}


def task_changes(
    *,
    wakes_only: bool = False,
    state_changes_of: Sequence[Any] | None = None,
    needless: Sequence[str] = (),
    **fields: Sequence[str],
) -> list[dict[str, Any]]:
    """Server-side filter: writes to tasks whose ``field`` is one of the values given (e.g.
    ``name=[...]``, ``key=[...]``). Deletes are left out: a deleted task's claim or ping
    simply matches nothing.

    ``wakes_only`` (a consumer's stream): only inserts, replaces and the updates that bumped
    ``wakes`` (`queries.derived.wakes_consumers`), so pings, claims and finishes wake nobody.
    That part tests the event alone, not ``fullDocument``: MongoDB (5.1+) moves such a
    predicate into its oplog scan, so a ping is dropped there, before any ``updateLookup``.
    A pipeline update's ``updatedFields`` names ``wakes`` on every engine, as it is a
    top-level number (a changed subdocument may be reported by paths inside it instead).

    ``state_changes_of`` (a waiter's stream): only inserts, replaces, and updates of those
    ``_id`` values that changed ``state``, again on the event alone: without it every update
    of the collection (pings included) costs each waiter one lookup of the document.
    ``needless``: event fields projected away after the ``$match`` (`CONSUMER_NEEDLESS`)."""
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
    elif state_changes_of is not None:
        match = {
            "$or": [
                {"operationType": {"$in": ["insert", "replace"]}},
                {
                    "operationType": "update",
                    "documentKey._id": {"$in": list(state_changes_of)},
                    "updateDescription.updatedFields.state": {"$exists": True},
                },
            ]
        }
    for field, values in fields.items():
        match[f"fullDocument.{field}"] = {"$in": list(values)}
    pipeline: list[dict[str, Any]] = [{"$match": match}]
    if needless:
        pipeline.append(without(needless))
    return pipeline


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
    stream = watched.watch(pipeline, **kwargs)
    return await stream if inspect.isawaitable(stream) else stream


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
        try:
            result = stream.close()
            if inspect.isawaitable(result):
                await result
        except PyMongoError:
            pass


class OneRunner:
    """One watch per process for many callers: the first caller runs it, the others stand by
    (reported started at once, since the runner's watch is up) and the first of them to see
    it end takes over. So a process never holds two of the same watch, and never none while a
    caller still waits on it."""

    def __init__(self) -> None:
        self._running = False
        self._stopped = anyio.Event()

    async def serve(
        self,
        run: Callable[[TaskStatus[None]], Awaitable[None]],
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        while True:
            if self._running:
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
                await self._stopped.wait()
                continue
            self._running, self._stopped = True, anyio.Event()
            try:
                await run(task_status)
            finally:
                self._running = False
                self._stopped.set()
