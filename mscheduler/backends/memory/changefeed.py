"""The memory backend's change stream: what MongoDB's ``watch()`` gives, for an in-process store.

One feed per database, as the oplog is one log for every collection. Every write of a
`MemoryCollection` publishes one event (insert, update, replace, delete) with a resume token,
and its namespace; a `MemoryChangeStream` on a collection reads that collection's events, one
on the database (``db.watch()``) every collection's, with the server's semantics that the
listener relies on: ``$match`` and exclusion ``$project`` pipelines, ``fullDocument:
"updateLookup"``, ``resume_after`` and ``start_after``, a bounded history (an old token raises
``ChangeStreamHistoryLost``, code 286), and errors that tests inject to exercise the listener's
recovery. And what only a real server would otherwise show:

- an event over 16 MiB as the pipeline leaves it fails the read with ``BSONObjectTooLarge``
  (10334), and the stream stays before it, so resuming from the same token meets it again;
- a drop or rename (`ChangeFeed.invalidate`) sends that event and then ``invalidate``, which
  closes every stream on that collection; ``resumeAfter`` that token is refused (260),
  ``startAfter`` it is not. A stream on the database reads the drop and goes on (a database
  stream is invalidated only when the database is dropped);
- a read that waits (``max_await_time_ms``, a getMore with awaitData) returns None once other
  writes passed by unmatched, its resume token advanced past them (``postBatchResumeToken``);
- ``lookups`` counts the ``updateLookup`` reads the server would make: the part of a ``$match``
  it can test on the oplog entry (`oplog_filter`) drops an update before its lookup.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from pymongo.errors import OperationFailure, PyMongoError

from ...clock import UTC
from .change_events import (
    MAX_EVENT_BYTES,
    event_bytes,
    oplog_filter,
    parse_pipeline,
    run_pipeline,
    update_description,
)
from .engine import filter_applies
from .fast_paths import document_copy

CHANGE_STREAM_HISTORY_LOST = 286
INVALID_RESUME_TOKEN = 260
BSON_OBJECT_TOO_LARGE = 10334
DEFAULT_HISTORY = 10_000


_PRIVATE = frozenset({"_seq", "_verdicts", "_coll"})  # what an event keeps for the feed alone


def _token(sequence: int) -> dict[str, str]:
    return {"_data": f"{sequence:020d}"}


def _sequence(token: Mapping[str, Any]) -> int:
    try:
        return int(token["_data"])
    except (KeyError, TypeError, ValueError) as exc:
        raise OperationFailure(f"invalid resume token {token!r}", code=260) from exc


class ChangeFeed:
    """Events of one database's collections, kept in a bounded history so streams can resume."""

    def __init__(self, database: str, history: int = DEFAULT_HISTORY) -> None:
        self._database = database
        self._namespaces: dict[str, dict[str, str]] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self._sequence = 0
        self._forgotten_before = 1  # the oldest sequence a stream may still resume from
        self._changed = anyio.Event()
        self._changed_loop: object = None  # the event loop `_changed` was first waited in
        self._pending_errors: list[PyMongoError] = []
        self._generation = 0  # bumped by end_streams(): older streams stop
        # Sequences of invalidate events, and the collection each ended the streams of.
        self._invalidated_at: dict[int, str] = {}
        self.max_event_bytes = MAX_EVENT_BYTES  # a test may lower it
        self.lookups = 0  # updateLookup reads the server would have made
        self._open_errors: list[PyMongoError] = []
        self._database_refusal: PyMongoError | None = None
        self.stalled = False  # streams stay open and deliver nothing (`stall`)

    @property
    def last_token(self) -> dict[str, str]:
        return _token(self._sequence)

    def publish(
        self,
        operation: str,
        document_id: Any,
        full_document: Mapping[str, Any] | None,
        before: Mapping[str, Any] | None = None,
        *,
        collection: str,
    ) -> None:
        after = document_copy(full_document) if full_document else None
        event: dict[str, Any] = {"operationType": operation, "documentKey": {"_id": document_id}}
        event["fullDocument"] = after
        if operation == "update" and before is not None and after is not None:
            event["updateDescription"] = update_description(before, after)
        self._append(event, collection)

    def invalidate(
        self, collection: str, operation: str = "drop", to: Mapping[str, str] | None = None
    ) -> None:
        """``collection`` was dropped or renamed (``operation``; ``to``: the new namespace):
        that event, then ``invalidate``, which ends every open stream on it after it is read."""
        event: dict[str, Any] = {"operationType": operation}
        if to is not None:
            event["to"] = dict(to)
        self._append(event, collection)
        self._append({"operationType": "invalidate"}, collection)
        self._invalidated_at[self._sequence] = collection

    def _namespace(self, collection: str) -> dict[str, str]:
        # One dict per collection for every event: what reads an event copies it first
        # (`run_pipeline` on write, `document_copy` on delivery), so no one changes it.
        namespace = self._namespaces.get(collection)
        if namespace is None:
            namespace = self._namespaces[collection] = {"db": self._database, "coll": collection}
        return namespace

    def _append(self, fields: dict[str, Any], collection: str) -> None:
        self._sequence += 1
        if len(self._events) == self._events.maxlen:
            forgotten = self._events[0]["_seq"]
            self._forgotten_before = forgotten + 1
            self._invalidated_at.pop(forgotten, None)
        event = {
            "_seq": self._sequence,
            "_verdicts": {},  # a stream's pipeline output for this event, by its `_kind`
            "_id": _token(self._sequence),
            "_coll": collection,
            "operationType": fields.pop("operationType"),
        }
        if event["operationType"] != "invalidate":
            event["ns"] = self._namespace(collection)
        event["wallTime"] = dt.datetime.now(UTC)
        event.update(fields)
        self._events.append(event)
        self._wake()

    def inject_error(self, error: PyMongoError) -> None:
        """The next read of every open stream raises ``error`` (a test's network fault)."""
        self._pending_errors.append(error)
        self._wake()

    def fail_opens(self, *errors: PyMongoError) -> None:
        """The next opens of a stream raise these, one each (an election, a revoked role)."""
        self._open_errors.extend(errors)

    def refuse_database_streams(self, error: PyMongoError | None) -> None:
        """Every open of a stream on the whole database raises ``error`` (None: no more), as
        for a user granted ``changeStream`` on some collections only."""
        self._database_refusal = error

    def stall(self, stalled: bool = True) -> None:
        """Open streams deliver nothing, and raise nothing, until ``stall(False)``: as a
        primary that lost its majority, or a sharded cluster waiting on a quiet shard."""
        self.stalled = stalled
        self._wake()

    def end_streams(self) -> None:
        """Every open stream ends without an event (a cursor the server closed)."""
        self._generation += 1
        self._wake()

    def forget_history(self) -> None:
        """Drop every stored event, as an oplog that rolled over: old tokens can't resume."""
        self._events.clear()
        self._invalidated_at.clear()
        self._forgotten_before = self._sequence + 1

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
        self._changed_loop = None

    def changed(self) -> anyio.Event:
        """The event the next write sets, for a waiter in the running event loop. An event
        serves the loop it was first waited in, and a blocking client (`SyncScheduler`) runs
        each call in a loop of its own, one after another on its thread: a waiter in another
        loop than the event's gets a fresh one (the waiters of the loop before are gone with
        the call that ran it; the backend serves one thread at a time)."""
        try:
            loop: object = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio: one loop for the process
            loop = None
        if self._changed_loop is None:
            self._changed_loop = loop
        elif self._changed_loop is not loop:
            self._changed = anyio.Event()
            self._changed_loop = loop
        return self._changed

    def _events_after(self, sequence: int) -> list[dict[str, Any]]:
        if sequence + 1 < self._forgotten_before:
            raise OperationFailure(
                "Resume of change stream was not possible, as the resume point may no longer "
                "be in the oplog.",
                code=CHANGE_STREAM_HISTORY_LOST,
            )
        # The history holds consecutive sequence numbers, oldest first: walk back from the
        # newest to the first one already seen, so a read costs the new events only, not the
        # whole history (up to DEFAULT_HISTORY events, for every stream on every read).
        newer: list[dict[str, Any]] = []
        for event in reversed(self._events):
            if event["_seq"] <= sequence:
                break
            newer.append(event)
        newer.reverse()
        return newer

    def open(
        self,
        pipeline: Sequence[Mapping[str, Any]] | None,
        full_document: str | None,
        resume_after: Mapping[str, Any] | None,
        *,
        start_after: Mapping[str, Any] | None = None,
        max_await_time_ms: int | None = None,
        collection: str | None,
    ) -> MemoryChangeStream:
        """A stream on ``collection``, or on the whole database when it is None."""
        if collection is None and self._database_refusal is not None:
            raise self._database_refusal
        if self._open_errors:
            raise self._open_errors.pop(0)
        stages = parse_pipeline(pipeline)
        if resume_after is not None and start_after is not None:
            raise OperationFailure("only one of resumeAfter and startAfter", code=40674)
        start = self._sequence
        if resume_after is not None or start_after is not None:
            start = _sequence(resume_after or start_after or {})
            # Only a stream on that collection was invalidated there; one on the database, or
            # on another collection, passed over that event and resumes after it.
            invalidated = self._invalidated_at.get(start)
            if resume_after is not None and invalidated is not None and invalidated == collection:
                raise OperationFailure(
                    "Attempting to resume a change stream using 'resumeAfter' is not allowed "
                    "from an invalidate notification.",
                    code=INVALID_RESUME_TOKEN,
                )
        self._events_after(start)  # raise now, as the server does, for a lost resume point
        return MemoryChangeStream(
            self, stages, full_document, start, max_await_time_ms, collection=collection
        )


class MemoryChangeStream:
    """An async iterator of change events, shaped like pymongo's ``AsyncChangeStream``."""

    def __init__(
        self,
        feed: ChangeFeed,
        stages: list[tuple[str, Any]],
        full_document: str | None,
        start: int,
        max_await_time_ms: int | None = None,
        *,
        collection: str | None,
    ) -> None:
        self._feed = feed
        self._collection = collection  # None: the whole database
        self._stages = stages
        self._with_full_document = full_document in ("updateLookup", "required", "whenAvailable")
        self._lookup = full_document == "updateLookup"
        pushed = [oplog_filter(m) for kind, m in stages if kind == "match"]
        self._oplog_filters = [f for f in pushed if f is not None]
        self._awaits = max_await_time_ms is not None
        self._position = start  # resume point: the last event returned (or passed over)
        self._scanned = start  # the last event read from the feed into the buffer
        self._errors_seen = len(feed._pending_errors)
        self._generation = feed._generation
        self._buffer: collections.deque[dict[str, Any]] = collections.deque()
        self._closed = False
        # Streams that show events alike and shape them alike (the consumers of one set of
        # names) run each event through the pipeline once between them.
        self._kind = (collection, self._with_full_document, repr(stages))

    @property
    def resume_token(self) -> dict[str, str]:
        return _token(self._position)

    @property
    def alive(self) -> bool:
        return not self._closed and self._generation == self._feed._generation

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> MemoryChangeStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __aiter__(self) -> MemoryChangeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        event = await self.next()
        return event

    async def next(self) -> dict[str, Any]:
        """The next event, waiting for it; `StopAsyncIteration` once the stream ended."""
        while True:
            if not self.alive:
                self._closed = True
                raise StopAsyncIteration
            event = await self.try_next()
            if event is not None:
                return event
            changed = self._feed.changed()
            if self._nothing_new():
                await changed.wait()

    async def try_next(self) -> dict[str, Any] | None:
        """One getMore: the next event, or None (always, once the stream ended: see `alive`).
        With ``max_await_time_ms`` it waits, as the server's awaitData does, until the feed
        changes (no timer: a quiet feed waits on)."""
        scanned = self._scanned
        event = await self._try_next()
        if event is None and self._awaits and scanned == self._scanned and self._nothing_new():
            await self._feed.changed().wait()
            event = await self._try_next()
        return event

    async def _try_next(self) -> dict[str, Any] | None:
        if not self.alive:
            self._closed = True
            return None
        await anyio.lowlevel.checkpoint()
        self._raise_injected_error()
        if self._feed.stalled:
            return None
        if not self._buffer:
            for event in self._feed._events_after(self._scanned):
                shaped = self._shaped(event)
                if shaped is not None and event_bytes(shaped) > self._feed.max_event_bytes:
                    if self._buffer:
                        break  # the events before it first, as in a batch of their own
                    self._closed = True  # the stream stays before it: a resume meets it again
                    raise OperationFailure(
                        f"BSONObj size is invalid: the change event {event['_id']} exceeds "
                        f"{self._feed.max_event_bytes} bytes",
                        code=BSON_OBJECT_TOO_LARGE,
                    )
                self._scanned = event["_seq"]
                if shaped is not None:  # copy only what the stream delivers
                    self._buffer.append(document_copy(shaped))
                    if event["operationType"] == "invalidate":
                        break  # its last event: the server closes the cursor after it
        if not self._buffer:
            # Like the server's post-batch resume token: skip past events the $match dropped.
            self._position = self._scanned
            return None
        event = self._buffer.popleft()
        self._position = self._scanned if not self._buffer else _sequence(event["_id"])
        if event["operationType"] == "invalidate":
            self._closed = True  # the server closes the cursor after it
        return event

    def _nothing_new(self) -> bool:
        if self._feed.stalled and self.alive:
            return len(self._feed._pending_errors) <= self._errors_seen
        return (
            not self._buffer
            and not self._closed
            and self._generation == self._feed._generation
            and self._feed._sequence <= self._scanned
            and len(self._feed._pending_errors) <= self._errors_seen
        )

    def _raise_injected_error(self) -> None:
        errors = self._feed._pending_errors
        if len(errors) > self._errors_seen:
            error = errors[self._errors_seen]
            self._errors_seen += 1
            self._closed = True  # a failed cursor is dead, as with the driver
            raise error

    def _shaped(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The event through this stream's pipeline (shared with streams of its kind: not to
        be changed), or None when a ``$match`` dropped it. An invalidate passes whatever the
        pipeline says, as the server's does; an update the oplog part of a ``$match`` keeps
        costs a lookup of the document. A stream on one collection reads its events only; one
        on the database every collection's, but not a collection's invalidate."""
        if self._collection is None:
            if event["operationType"] == "invalidate":
                return None
        elif event["_coll"] != self._collection:
            return None
        if (
            self._lookup
            and event["operationType"] == "update"
            and all(filter_applies(f, _oplog_view(event)) for f in self._oplog_filters)
        ):
            self._feed.lookups += 1
        verdicts = event["_verdicts"]
        if self._kind not in verdicts:
            verdicts[self._kind] = run_pipeline(self._stages, self._view(event))
        shaped: dict[str, Any] | None = verdicts[self._kind]
        return shaped

    def _view(self, event: dict[str, Any]) -> dict[str, Any]:
        """The event as this stream shows it (a shallow view of the stored one: not to be
        changed, and copied before it is handed out)."""
        shaped = {k: v for k, v in event.items() if k not in _PRIVATE}
        if not self._with_full_document and shaped["operationType"] != "insert":
            shaped.pop("fullDocument", None)
        if shaped.get("fullDocument") is None:
            shaped.pop("fullDocument", None)
        return shaped


def _oplog_view(event: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in _PRIVATE and k != "fullDocument"}
