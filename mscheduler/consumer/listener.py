"""The consumer's change-stream listener: the reason an idle consumer costs the database nothing.

Opened before the first fetch, so no task published in between is missed. Keeps the resume
token after every batch (`ResumePoint`); after an error it reopens from that token (after an
``invalidate``, a drop or rename of the collection, with ``startAfter`` it); if the server can
no longer resume (the oplog rolled past it), or reads keep failing at one token (an event too
large to send), it opens a fresh stream *first* and then asks for a full re-fetch, so again
nothing is missed. Its events carry only what a consumer reads (`CONSUMER_NEEDLESS` is
projected away), so a large payload or result does not make them too large to send.

A server that refuses to open a change stream (`refuses_streams`: a standalone mongod, a
DocumentDB or Cosmos DB without them, a user without the ``changeStream`` privilege, an engine
that lacks them) makes it report "polling" with one warning naming the server's error; with
``discovery="auto"`` it then tries the stream again every ``stream_retry_interval_ms`` and
takes over from polling once one opens. The same holds when the refusal comes later (the
privilege revoked while running). Other errors (an election) are retried with backoff.
``discovery="stream"`` makes a refusal an error, ``discovery="poll"`` never opens a stream.
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
    CONSUMER_NEEDLESS,
    MAX_AWAIT_MS,
    RESUME_IMPOSSIBLE,
    ResumePoint,
    close_quietly,
    open_change_stream,
    open_unless_refused,
    refuses_streams,
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
        self._pipeline = task_changes(wakes_only=True, needless=CONSUMER_NEEDLESS, name=self._names)
        self.position = ResumePoint()
        self.backstops = 0
        self.polling = False
        self.reopened = 0
        self.resyncs = 0

    @property
    def resume_token(self) -> Any:
        return self.position.token

    async def _open(self, **start: Any) -> Any:
        return await open_change_stream(
            self._store, self._pipeline, max_await_time_ms=MAX_AWAIT_MS, **start
        )

    async def run(self, *, task_status: TaskStatus[bool] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reports True once the stream is open, or False when polling must replace it."""
        stream = await self._open_first()
        if stream is None:
            task_status.started(False)
            stream = await self._poll_until_streamed()
        else:
            task_status.started(True)
            self.position.opened(stream)
        attempt = 0
        while True:
            opened_at = self._clock.now()
            try:
                await self._read(stream)
                # The server ended the stream (after an invalidate: the collection was dropped
                # or renamed); reopen it after that event.
                log.warning("change stream ended, reopening", extra={"action": "stream_ended"})
            except PyMongoError as exc:
                log.warning(
                    "change stream failed, reopening: %s", exc, extra={"action": "stream_error"}
                )
                if isinstance(exc, OperationFailure) and self.position.read_failed():
                    log.warning(
                        "change stream keeps failing at one resume token; opening a fresh "
                        "one and re-fetching all tasks",
                        extra={"action": "stream_resync"},
                    )
                    self.position = ResumePoint()  # nothing to resume from: afresh
            finally:
                await close_quietly(stream)
            # The backoff grows while the stream keeps failing; a stream that stayed up for
            # the longest backoff was healthy, so an isolated error later starts from the base.
            healthy_for = (self._clock.now() - opened_at).total_seconds()
            if healthy_for >= self._options.reconnect_backoff_max_ms / 1000:
                attempt = 0
            stream = await self._reopen(attempt)
            if stream is None:  # refused now (the privilege revoked): poll until it is back
                stream = await self._poll_until_streamed()
            attempt += 1

    async def poll_loop(self) -> None:
        """Work found besides the stream's events: a full fetch every poll interval while
        polling (no stream, or one refused since); with a stream, the backstop: a page every
        ``backstop_interval_ms``, as a stream can stall without an error (a primary that lost
        its majority beside an arbiter; a quiet shard delays a sharded cluster's events), and
        this bounds how long claimable work then waits. No call on the ticks in between."""
        poll_s = self._options.poll_interval_ms / 1000
        backstop_s = self._options.backstop_interval_ms / 1000
        last = self._clock.now()
        while True:
            await sleep(self._clock, min(poll_s, backstop_s))
            now = self._clock.now()
            if self.polling:
                last = now
                await self._on_resync()
            elif (now - last).total_seconds() >= backstop_s:
                last = now
                self.backstops += 1
                await self._on_resync()  # one page, as every fetch

    async def _open_first(self) -> Any:
        """The stream, or None to poll; a network error or a transient refusal (an election)
        is retried with backoff, as the fetch is, so a consumer started while the database
        is away waits for it."""
        attempt = 0
        while True:
            try:
                stream, refusal = await open_unless_refused(
                    self._store,
                    self._pipeline,
                    self._options.discovery,
                    max_await_time_ms=MAX_AWAIT_MS,
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

    async def _poll_until_streamed(self) -> Any:
        """Report "polling" (the consumer polls meanwhile) until a stream opens; then one full
        fetch, after the stream is open, so nothing is missed."""
        self.polling = True
        stream = await self._stream_again()
        self.position.opened(stream)
        self.polling = False
        await self._on_resync()
        return stream

    async def _stream_again(self) -> Any:
        """While polling (``auto`` only): try the stream now and then; return it once open."""
        if self._options.discovery != "auto":
            await anyio.sleep_forever()
        while True:
            await sleep(self._clock, self._options.stream_retry_interval_ms / 1000)
            try:
                stream = await self._open()
            except PyMongoError as exc:
                log.debug("change stream still refused: %s", exc, extra={"action": "polling"})
                continue
            log.info("the change stream opened; polling stops", extra={"action": "stream_restored"})
            return stream

    async def _read(self, stream: Any) -> None:
        """Until the server ends the stream; the resume point moves after every batch."""
        while stream.alive:
            event = await stream.try_next()
            self.position.read(stream, event)
            if event is None:
                continue  # an empty batch: its token is kept, nothing else to do
            document = event.get("fullDocument")
            if document is None:
                continue  # deleted before the lookup, or not a write (invalidate)
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
        """The stream again, after a backoff. None when the server now refuses streams and
        ``discovery="auto"`` may poll."""
        while True:
            await sleep(self._clock, self._options.reconnect_delay(attempt))
            try:
                stream = await self._resume()
                self.reopened += 1
                return stream
            except OperationFailure as exc:
                if refuses_streams(exc) and self._options.discovery == "auto":
                    self._warn_polling(exc)
                    return None
                log.warning(
                    "change stream reopen failed: %s", exc, extra={"action": "stream_error"}
                )
            except PyMongoError as exc:
                log.warning(
                    "change stream reopen failed: %s", exc, extra={"action": "stream_error"}
                )
            attempt += 1

    async def _resume(self) -> Any:
        """From the resume point; if there is none or the server cannot resume from it,
        afresh plus a full re-fetch."""
        if self.position.token is not None:
            try:
                return await self._open(**self.position.open_options())
            except OperationFailure as exc:
                if exc.code not in RESUME_IMPOSSIBLE:
                    raise
                log.warning(
                    "change stream cannot resume (%s); re-fetching all tasks",
                    exc,
                    extra={"action": "stream_resync"},
                )
        stream = await self._open()
        self.position.opened(stream)
        self.resyncs += 1
        await self._on_resync()
        return stream
