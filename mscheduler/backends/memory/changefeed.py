"""The memory backend's change stream: what MongoDB's ``watch()`` gives, for an in-process store.

Every write of `MemoryCollection` publishes one event (insert, update, replace, delete) with a
resume token; a `MemoryChangeStream` reads them with the server's semantics that the listener
relies on: ``$match`` pipelines, ``fullDocument: "updateLookup"``, ``resume_after`` and
``start_after``, a bounded history (an old token raises ``ChangeStreamHistoryLost``, code 286),
and errors that tests inject to exercise the listener's recovery.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from mongomock.filtering import filter_applies
from pymongo.errors import OperationFailure, PyMongoError

from ...clock import UTC
from .patches import document_copy

CHANGE_STREAM_HISTORY_LOST = 286
DEFAULT_HISTORY = 10_000


_PRIVATE = frozenset({"_seq", "_verdicts"})  # what an event keeps for the feed alone


def _token(sequence: int) -> dict[str, str]:
    return {"_data": f"{sequence:020d}"}


def _sequence(token: Mapping[str, Any]) -> int:
    try:
        return int(token["_data"])
    except (KeyError, TypeError, ValueError) as exc:
        raise OperationFailure(f"invalid resume token {token!r}", code=260) from exc


def _update_description(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What changed, by top-level field. MongoDB may name paths inside a changed subdocument
    or array instead (``worker_states.0.ping_expire_at``); a top-level scalar such as
    ``wakes`` is named the same way by both. The values are the event's own copies."""
    return {
        "updatedFields": {k: v for k, v in after.items() if k not in before or before[k] != v},
        "removedFields": [k for k in before if k not in after],
        "truncatedArrays": [],
    }


class ChangeFeed:
    """Events of one collection, kept in a bounded history so streams can resume."""

    def __init__(self, database: str, collection: str, history: int = DEFAULT_HISTORY) -> None:
        self._namespace = {"db": database, "coll": collection}
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self._sequence = 0
        self._forgotten_before = 1  # the oldest sequence a stream may still resume from
        self._changed = anyio.Event()
        self._pending_errors: list[PyMongoError] = []
        self._generation = 0  # bumped by end_streams(): older streams stop

    @property
    def last_token(self) -> dict[str, str]:
        return _token(self._sequence)

    def publish(
        self,
        operation: str,
        document_id: Any,
        full_document: Mapping[str, Any] | None,
        before: Mapping[str, Any] | None = None,
    ) -> None:
        self._sequence += 1
        if len(self._events) == self._events.maxlen:
            self._forgotten_before = self._events[0]["_seq"] + 1
        after = document_copy(full_document) if full_document else None
        event = {
            "_seq": self._sequence,
            "_verdicts": {},  # a stream's $match on this event, by `MemoryChangeStream._kind`
            "_id": _token(self._sequence),
            "operationType": operation,
            "ns": dict(self._namespace),
            "documentKey": {"_id": document_id},
            "wallTime": dt.datetime.now(UTC),
            "fullDocument": after,
        }
        if operation == "update" and before is not None and after is not None:
            event["updateDescription"] = _update_description(before, after)
        self._events.append(event)
        self._wake()

    def inject_error(self, error: PyMongoError) -> None:
        """The next read of every open stream raises ``error`` (a test's network fault)."""
        self._pending_errors.append(error)
        self._wake()

    def end_streams(self) -> None:
        """Every open stream ends (as after an invalidate event: the collection was dropped)."""
        self._generation += 1
        self._wake()

    def forget_history(self) -> None:
        """Drop every stored event, as an oplog that rolled over: old tokens can't resume."""
        self._events.clear()
        self._forgotten_before = self._sequence + 1

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

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
    ) -> MemoryChangeStream:
        matches: list[Mapping[str, Any]] = []
        for stage in pipeline or ():
            if set(stage) != {"$match"}:
                raise OperationFailure(
                    f"the memory backend's change streams support only $match stages, got "
                    f"{sorted(stage)}"
                )
            matches.append(stage["$match"])
        start = self._sequence if resume_after is None else _sequence(resume_after)
        self._events_after(start)  # raise now, as the server does, for a lost resume point
        return MemoryChangeStream(self, matches, full_document, start)


class MemoryChangeStream:
    """An async iterator of change events, shaped like pymongo's ``AsyncChangeStream``."""

    def __init__(
        self,
        feed: ChangeFeed,
        matches: list[Mapping[str, Any]],
        full_document: str | None,
        start: int,
    ) -> None:
        self._feed = feed
        self._matches = matches
        self._with_full_document = full_document in ("updateLookup", "required", "whenAvailable")
        self._position = start  # resume point: the last event returned (or passed over)
        self._scanned = start  # the last event read from the feed into the buffer
        self._errors_seen = len(feed._pending_errors)
        self._generation = feed._generation
        self._buffer: collections.deque[dict[str, Any]] = collections.deque()
        self._closed = False
        # Streams that show events alike and match them alike (the consumers of one set of
        # names) test each event once between them.
        self._kind = (self._with_full_document, repr(matches))

    @property
    def resume_token(self) -> dict[str, str]:
        return _token(self._position)

    @property
    def alive(self) -> bool:
        return not self._closed

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
        while True:
            event = await self.try_next()
            if event is not None:
                return event
            changed = self._feed._changed
            if self._nothing_new():
                await changed.wait()

    async def try_next(self) -> dict[str, Any] | None:
        if self._closed or self._generation != self._feed._generation:
            self._closed = True
            raise StopAsyncIteration
        await anyio.lowlevel.checkpoint()
        self._raise_injected_error()
        if not self._buffer:
            for event in self._feed._events_after(self._scanned):
                self._scanned = event["_seq"]
                if self._matched(event):  # $match first; copy only what the stream delivers
                    self._buffer.append(document_copy(self._view(event)))
        if not self._buffer:
            # Like the server's post-batch resume token: skip past events the $match dropped.
            self._position = self._scanned
            return None
        event = self._buffer.popleft()
        self._position = self._scanned if not self._buffer else _sequence(event["_id"])
        return event

    def _nothing_new(self) -> bool:
        return (
            not self._buffer
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

    def _matched(self, event: dict[str, Any]) -> bool:
        verdicts = event["_verdicts"]
        verdict = verdicts.get(self._kind)
        if verdict is None:
            seen = self._view(event)
            verdict = verdicts[self._kind] = all(filter_applies(m, seen) for m in self._matches)
        return bool(verdict)

    def _view(self, event: dict[str, Any]) -> dict[str, Any]:
        """The event as this stream shows it (a shallow view of the stored one: not to be
        changed, and copied before it is handed out)."""
        shaped = {k: v for k, v in event.items() if k not in _PRIVATE}
        if not self._with_full_document and shaped["operationType"] != "insert":
            shaped.pop("fullDocument", None)
        if shaped.get("fullDocument") is None:
            shaped.pop("fullDocument", None)
        return shaped
