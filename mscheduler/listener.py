"""The consumer's change-stream listener: the reason an idle consumer costs the database nothing.

Opened before the first fetch, so no task published in between is missed. Keeps the resume
token; after an error it reopens from that token; if the server can no longer resume (the
oplog rolled past it), it opens a fresh stream *first* and then asks for a full re-fetch, so
again nothing is missed. A server without change streams (a standalone mongod) makes it report
"polling" once, with a warning, and return.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from anyio.abc import TaskStatus
from pydantic import ValidationError
from pymongo.errors import OperationFailure, PyMongoError

from .clock import Clock, sleep
from .models import Task, WorkerOptions

log = logging.getLogger(__name__)

# The server cannot run change streams at all: poll instead.
CHANGE_STREAMS_UNSUPPORTED = frozenset({40573, 40324, 115})
# The stream cannot be resumed from our token: start afresh and re-fetch everything.
RESUME_IMPOSSIBLE = frozenset({286, 280, 260})


def task_changes(**fields: Sequence[str]) -> list[dict[str, Any]]:
    """Server-side filter: writes to tasks whose ``field`` is one of the values given (e.g.
    ``name=[...]``, ``key=[...]``). Deletes are left out: a deleted task's claim or ping
    simply matches nothing."""
    match: dict[str, Any] = {"operationType": {"$in": ["insert", "update", "replace"]}}
    for field, values in fields.items():
        match[f"fullDocument.{field}"] = {"$in": list(values)}
    return [{"$match": match}]


async def open_change_stream(
    collection: Any, pipeline: list[dict[str, Any]], resume_after: Any = None
) -> Any:
    """``watch`` with the document after each write; pymongo's async API returns a coroutine,
    Motor the stream itself."""
    kwargs: dict[str, Any] = {"full_document": "updateLookup"}
    if resume_after is not None:
        kwargs["resume_after"] = resume_after
    stream = collection.watch(pipeline, **kwargs)
    return await stream if inspect.isawaitable(stream) else stream


async def close_quietly(stream: Any) -> None:
    """Close a stream even while being cancelled; a failure to close changes nothing."""
    with anyio.CancelScope(shield=True):
        try:
            result = stream.close()
            if inspect.isawaitable(result):
                await result
        except PyMongoError:
            pass


class ChangeListener:
    def __init__(
        self,
        collection: Any,
        names: Sequence[str],
        options: WorkerOptions,
        clock: Clock,
        on_change: Callable[[Task], None],
        on_resync: Callable[[], Awaitable[None]],
    ) -> None:
        self._collection = collection
        self._names = list(names)
        self._options = options
        self._clock = clock
        self._on_change = on_change
        self._on_resync = on_resync
        self.resume_token: Any = None
        self.polling = False
        self.reopened = 0
        self.resyncs = 0

    async def _open(self, resume_token: Any) -> Any:
        return await open_change_stream(
            self._collection, task_changes(name=self._names), resume_token
        )

    async def run(self, *, task_status: TaskStatus[bool] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reports True once the stream is open, or False when polling must replace it."""
        try:
            stream = await self._open(None)
        except OperationFailure as exc:
            if exc.code not in CHANGE_STREAMS_UNSUPPORTED:
                raise
            self.polling = True
            log.warning(
                "change streams are not available (%s); polling for tasks every %.1f s "
                "instead, which reacts more slowly and costs a query per interval",
                exc,
                self._options.poll_interval_ms / 1000,
                extra={"action": "polling_fallback"},
            )
            task_status.started(False)
            return
        self.resume_token = stream.resume_token
        task_status.started(True)
        attempt = 0
        while True:
            try:
                await self._read(stream)
            except PyMongoError as exc:
                log.warning(
                    "change stream failed, reopening: %s", exc, extra={"action": "stream_error"}
                )
            except StopAsyncIteration:
                # The server ended the stream (an invalidate: the collection was dropped or
                # renamed); reopen it like a failed one.
                log.warning("change stream ended, reopening", extra={"action": "stream_ended"})
            finally:
                await close_quietly(stream)
            stream = await self._reopen(attempt)
            attempt += 1

    async def _read(self, stream: Any) -> None:
        while True:
            event = await stream.next()
            self.resume_token = stream.resume_token or event.get("_id")
            document = event.get("fullDocument")
            if document is None:
                continue  # deleted before the lookup: nothing to claim
            try:
                task = Task.model_validate(document)
            except ValidationError as exc:
                log.warning(
                    "ignoring a document that is not a task: %s",
                    exc,
                    extra={"action": "foreign_document"},
                )
                continue
            self._on_change(task)

    async def _reopen(self, attempt: int) -> Any:
        """Reopen from the resume token; if that is impossible, afresh plus a full re-fetch."""
        while True:
            await sleep(self._clock, self._options.reconnect_delay(attempt))
            try:
                try:
                    stream = await self._open(self.resume_token)
                except OperationFailure as exc:
                    if exc.code not in RESUME_IMPOSSIBLE:
                        raise
                    log.warning(
                        "change stream cannot resume (%s); re-fetching all tasks",
                        exc,
                        extra={"action": "stream_resync"},
                    )
                    stream = await self._open(None)
                    self.resume_token = stream.resume_token
                    self.resyncs += 1
                    await self._on_resync()
                self.reopened += 1
                return stream
            except PyMongoError as exc:
                log.warning(
                    "change stream reopen failed: %s", exc, extra={"action": "stream_error"}
                )
                attempt += 1
