"""The consumer's change-stream listener: the reason an idle consumer costs the database nothing.

Opened before the first fetch, so no task published in between is missed. Keeps the resume
token; after an error it reopens from that token; if the server can no longer resume (the
oplog rolled past it), it opens a fresh stream *first* and then asks for a full re-fetch, so
again nothing is missed.

A server that refuses to open a change stream, for whatever reason (a standalone mongod, a
DocumentDB or Cosmos DB without them, a user without the ``changeStream`` privilege, an engine
that lacks them), makes it report "polling" with one warning naming the server's error; with
``discovery="auto"`` it then tries the stream again every ``stream_retry_interval_ms`` and
takes over from polling once one opens. ``discovery="stream"`` makes a refusal an error,
``discovery="poll"`` never opens a stream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from anyio.abc import TaskStatus
from pydantic import ValidationError
from pymongo.errors import OperationFailure, PyMongoError

from ..clock import Clock, sleep
from ..models import Task
from ..store.streams import (
    RESUME_IMPOSSIBLE,
    close_quietly,
    open_change_stream,
    open_unless_refused,
    task_changes,
)
from ..store.tasks import TaskStore
from ..worker_options import WorkerOptions

log = logging.getLogger(__name__)


class ChangeListener:
    def __init__(
        self,
        store: TaskStore,
        names: Sequence[str],
        options: WorkerOptions,
        clock: Clock,
        on_change: Callable[[Task], None],
        on_resync: Callable[[], Awaitable[None]],
    ) -> None:
        self._store = store
        self._names = list(names)
        self._options = options
        self._clock = clock
        self._on_change = on_change
        self._on_resync = on_resync
        # Only writes that may give us work (not pings, claims or finishes): see task_changes.
        self._pipeline = task_changes(wakes_only=True, name=self._names)
        self.resume_token: Any = None
        self.polling = False
        self.reopened = 0
        self.resyncs = 0

    async def _open(self, resume_token: Any) -> Any:
        return await open_change_stream(self._store, self._pipeline, resume_token)

    async def run(self, *, task_status: TaskStatus[bool] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reports True once the stream is open, or False when polling must replace it."""
        stream = await self._open_first()
        if stream is None:
            self.polling = True
            task_status.started(False)
            stream = await self._stream_again()
            self.polling = False
            await self._on_resync()  # the stream is open: one fetch, and nothing is missed
        else:
            task_status.started(True)
        self.resume_token = stream.resume_token
        attempt = 0
        while True:
            opened_at = self._clock.now()
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
            # The backoff grows while the stream keeps failing; a stream that stayed up for
            # the longest backoff was healthy, so an isolated error later starts from the base.
            healthy_for = (self._clock.now() - opened_at).total_seconds()
            if healthy_for >= self._options.reconnect_backoff_max_ms / 1000:
                attempt = 0
            stream = await self._reopen(attempt)
            attempt += 1

    async def _open_first(self) -> Any:
        """The stream, or None to poll; a network error is retried with backoff, as the
        fetch is, so a consumer started while the database is away waits for it."""
        attempt = 0
        while True:
            try:
                stream, refusal = await open_unless_refused(
                    self._store, self._pipeline, self._options.discovery
                )
            except PyMongoError as exc:
                log.warning(
                    "cannot open the change stream yet: %s", exc, extra={"action": "stream_error"}
                )
                await sleep(self._clock, self._options.reconnect_delay(attempt))
                attempt += 1
                continue
            if stream is None:
                self._warn_polling(refusal)
            return stream

    def _warn_polling(self, refusal: OperationFailure | None) -> None:
        interval = self._options.poll_interval_ms / 1000
        if refusal is None:
            log.info(
                "discovery='poll': polling for tasks every %.1f s",
                interval,
                extra={"action": "polling"},
            )
            return
        log.warning(
            "the server refused to open a change stream (%s); polling for tasks every %.1f s "
            "instead, which reacts more slowly and costs a query per interval; trying the "
            "stream again every %.0f s",
            refusal,
            interval,
            self._options.stream_retry_interval_ms / 1000,
            extra={"action": "polling_fallback"},
        )

    async def _stream_again(self) -> Any:
        """While polling (``auto`` only): try the stream now and then; return it once open."""
        if self._options.discovery != "auto":
            await anyio.sleep_forever()
        while True:
            await sleep(self._clock, self._options.stream_retry_interval_ms / 1000)
            try:
                stream = await self._open(None)
            except PyMongoError as exc:
                log.debug("change stream still refused: %s", exc, extra={"action": "polling"})
                continue
            log.info("the change stream opened; polling stops", extra={"action": "stream_restored"})
            return stream

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
