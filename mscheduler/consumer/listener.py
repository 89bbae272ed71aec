"""A consumer's view of the process's discovery hub (`services.discovery.TaskHub`): the writes
that may give it work on its names, into its heap, and its running tasks' changes, into its
executor; a resync (the hub's stream could not resume, or this consumer fell behind) reads
both again: a page of the claimable tasks and the running ones. The hub, not the consumer,
keeps the resume token, the reopening after errors, the polling fallback (one poll per
interval for the whole process, said once) and the stream taken back when the server offers
it again: one stream per process, however many consumers.

Besides the hub's events, `poll_loop` is the backstop: a page of claimable tasks every
``backstop_interval_ms``, as a stream can stall without an error (a primary that lost its
majority beside an arbiter; a quiet shard delays a sharded cluster's events), and a poll
reads only the first page of the tasks due.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
from anyio.abc import TaskStatus

from ..clock import Clock, sleep
from ..models import Task
from ..services.discovery import RESYNC, Subscription, TaskHub
from ..worker_options import WorkerOptions

log = logging.getLogger(__name__)


class Changes(Protocol):
    """Where the listener hands what it hears (`intake.Intake`). Invariant: `heard` takes a
    write of the consumer's names, or of a task it runs, as the task after it; `resync` reads
    again everything the hub may have lost for this consumer (its claimable tasks and its
    running ones); `fetch` reads a page of the claimable tasks, the backstop's read; `holds`
    says whether the consumer runs ``key`` (its every change is heard, whatever woke)."""

    def heard(self, task: Task) -> None: ...

    async def resync(self) -> None: ...

    async def fetch(self) -> None: ...

    def holds(self, key: str) -> bool: ...


class ChangeListener:
    def __init__(
        self,
        hub: TaskHub,
        names: Sequence[str],
        options: WorkerOptions,
        clock: Clock,
        changes: Changes,
    ) -> None:
        self._hub = hub
        self._options = options
        self._clock = clock
        self._changes = changes
        # Only writes that may give us work (not pings, claims or finishes): see hub_pipeline.
        # And every change of a task we run (its options, a cancel), whatever woke.
        self.subscription = Subscription(
            options, wakes=names, holds=changes.holds, worker_id=options.worker_id
        )
        self.backstops = 0

    @property
    def polling(self) -> bool:
        return self._hub.polling

    @property
    def reopened(self) -> int:
        return self._hub.reopened

    @property
    def resyncs(self) -> int:
        return self.subscription.resyncs

    @property
    def resume_token(self) -> Any:
        return self._hub.position.token

    async def run(self, *, task_status: TaskStatus[bool] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reports True once the hub's stream covers our names (False: the process polls)."""
        async with self._hub.subscription(self.subscription) as subscription:
            task_status.started(not self._hub.polling)
            while True:
                item = await subscription.next()
                if item is RESYNC:
                    await self._changes.resync()
                else:
                    self._changes.heard(item)

    async def poll_loop(self) -> None:
        """The backstop: one page of claimable tasks every ``backstop_interval_ms``, streaming
        or polling alike (a key a limit holds back waits in the heap for its window: no
        write need bring it back)."""
        backstop_s = self._options.backstop_interval_ms / 1000
        while True:
            await sleep(self._clock, backstop_s)
            self.backstops += 1
            await self._changes.fetch()  # one page, as every fetch
