"""Calling a handler: in an asyncio task of its own, so that one that ignores cancellation
can be left behind instead of holding the consumer (issue 10 #7)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from ..clock import Clock
from ..models import Task
from ..worker_options import WorkerOptions
from .stats import ConsumerStats

log = logging.getLogger(__name__)

Handler = Callable[[Task], Awaitable[Any]]


def _retrieved(call: asyncio.Task[Any]) -> None:
    """Marks a handler's exception as seen: a run stopped while its handler was failing
    would otherwise have asyncio report "exception was never retrieved"."""
    if not call.cancelled():
        call.exception()


class HandlerCancelled(RuntimeError):
    """The handler raised ``CancelledError`` though nothing cancelled it: a failure of that
    task like any other exception (it used to end the whole consumer)."""


class HandlerCalls:
    """Runs handler calls; keeps the abandoned ones until they return."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        options: WorkerOptions,
        clock: Clock,
        stats: ConsumerStats,
    ) -> None:
        self._handlers = handlers
        self._options = options
        self._clock = clock
        self._stats = stats
        # Handlers left running after ignoring cancellation, by key: this worker does not
        # claim those keys again until they return.
        self.abandoned: dict[str, asyncio.Task[Any]] = {}

    async def call(self, task: Task, may_start: Callable[[], bool]) -> Any:
        """One call of the handler, in an asyncio task of its own (it inherits the lease in
        its context). Why not just ``await handler(task)``: a handler that ignores
        cancellation would then hold the consumer's task group, and `stop()`, for ever
        (issue 10 #7). Here it gets ``cancel_timeout_ms`` to unwind once cancelled; past that
        it is abandoned (left to run, its outcome never written, its key not claimed again by
        this worker until it returns) and the stop goes on. ``may_start`` is asked first, in
        that task: False (the lease ran out while the task waited to run) and the handler
        never starts."""
        done = anyio.Event()
        scope = anyio.CancelScope()  # anyio's own cancellation: shields in the handler hold

        async def call_handler() -> Any:
            with scope:
                if not may_start():
                    await anyio.sleep_forever()  # the stop that refused it cancels this
                return await self._handlers[task.name](task)
            return None  # cancelled by us: the caller re-raises its own cancellation

        call: asyncio.Task[Any] = asyncio.ensure_future(call_handler())
        call.set_name(f"mscheduler-handler:{task.key}")
        call.add_done_callback(_retrieved)  # read below, unless a stop came first
        call.add_done_callback(lambda _: done.set())
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            scope.cancel()
            with anyio.CancelScope(shield=True):
                timeout = dt.timedelta(milliseconds=self._options.cancel_timeout_ms)
                deadline = self._clock.now() + timeout
                while not call.done() and self._clock.now() < deadline:
                    await self._clock.wait_until(deadline, done)
            if not call.done():
                self._abandon(task, call)
            raise
        if call.cancelled():
            raise HandlerCancelled(
                "the handler raised CancelledError without being cancelled (or was "
                "cancelled by code of its own)"
            )
        return call.result()

    def _abandon(self, task: Task, call: asyncio.Task[Any]) -> None:
        self._stats.record("abandoned", task.name)
        log.error(
            "handler of task %r ignored cancellation for %d ms: abandoned, still running; "
            "its outcome will not be recorded",
            task.key,
            self._options.cancel_timeout_ms,
            extra={"action": "handler_abandoned", "key": task.key},
        )
        self.abandoned[task.key] = call

        def returned(_: asyncio.Task[Any]) -> None:
            if self.abandoned.get(task.key) is call:
                del self.abandoned[task.key]
            log.warning(
                "the abandoned handler of task %r returned",
                task.key,
                extra={"action": "abandoned_handler_returned", "key": task.key},
            )

        call.add_done_callback(returned)
