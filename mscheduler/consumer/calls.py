"""Calling a handler: in an asyncio task of its own, so that one that ignores cancellation
can be left behind instead of holding the consumer's stop for ever; a sync handler in a worker
thread; and the hard time limit (``TaskOptions.timeout_ms``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.to_thread

from .. import context
from ..clock import Clock
from ..errors import TaskTimeout
from ..models import ErrorInfo, Lease, Task
from ..worker_options import WorkerOptions
from .batching import Batcher
from .handlers import HandlerSpec
from .isolation import ProcessPool
from .stats import ConsumerStats

log = logging.getLogger(__name__)


def _retrieved(call: asyncio.Task[Any]) -> None:
    """Marks a handler's exception as seen: a run stopped while its handler was failing
    would otherwise have asyncio report "exception was never retrieved"."""
    if not call.cancelled():
        call.exception()


def _set(event: anyio.Event, _: object) -> None:
    event.set()


class HandlerCancelled(RuntimeError):
    """The handler raised ``CancelledError`` though nothing cancelled it: a failure of that
    task like any other exception, never the end of the consumer that ran it (its other tasks
    go on)."""


class HandlerCalls:
    """Runs handler calls; keeps the abandoned ones until they return."""

    def __init__(
        self,
        handlers: Mapping[str, HandlerSpec],
        options: WorkerOptions,
        clock: Clock,
        stats: ConsumerStats,
    ) -> None:
        self._handlers = handlers
        # Sync handlers' threads: max_running already bounds the running ones, and a thread
        # left behind by a stop must not take a token a new handler needs.
        self._threads = anyio.CapacityLimiter(math.inf)
        self._options = options
        self._clock = clock
        self._stats = stats
        # Isolated handlers' children: started by the first call that needs one.
        self.children = ProcessPool()
        # Handlers left running after ignoring cancellation, by key: this worker does not
        # claim those keys again until they return.
        self.abandoned: dict[str, asyncio.Task[Any]] = {}

    async def prepare(self, task: Task) -> None:
        """Before the start of ``task``'s handler is taken: an isolated handler's child is
        started now if none is idle (a cold start takes long, and must not come between)."""
        if self._handlers[task.name].isolated is not None:
            await self.children.warm()

    async def call(
        self, task: Task, may_start: Callable[[], bool], started: Callable[[], None]
    ) -> Any:
        """One call of the handler, in an asyncio task of its own (it inherits the lease in
        its context). Why not just ``await handler(task)``: a handler that ignores
        cancellation would then hold the consumer's task group, and `stop()`, for ever.
        Here it gets ``cancel_timeout_ms`` to unwind once cancelled; past that
        it is abandoned (left to run, its outcome never written, its key not claimed again by
        this worker until it returns) and the stop goes on. ``may_start`` is asked first, in
        that task: False (the lease ran out while the task waited to run) and the handler
        never starts. ``started`` is called as the handler really begins (here, or in its child
        process once the child says so): a start counts against its name's rate from then.

        A sync handler runs in a worker thread, which cannot be killed: cancelling it (a
        stop, a lost lease, a remote cancel, ``timeout_ms``) means its outcome is discarded
        and, past ``cancel_timeout_ms``, it is abandoned as above. It may stop early by
        calling ``anyio.from_thread.check_cancelled()`` now and then.

        An isolated handler runs in a child process (`ProcessPool`): cancelling it kills the
        child, so it returns at once and is never abandoned.

        ``timeout_ms`` past, the handler is cancelled the same way and `TaskTimeout` raised."""
        scope = anyio.CancelScope()  # anyio's own cancellation: shields in the handler hold
        spec = self._handlers[task.name]

        async def call_handler() -> Any:
            with scope:
                if not may_start():
                    await anyio.sleep_forever()  # the stop that refused it cancels this
                if spec.isolated is not None:
                    lease = context.current_lease()
                    return await self.children.run(spec.isolated, lease, started)
                if isinstance(spec.function, Batcher):  # its group's call is its start
                    return await spec.function(task, started)
                started()
                if spec.is_async:
                    return await spec.function(task)
                result = await anyio.to_thread.run_sync(spec.function, task, limiter=self._threads)
                # A plain function that returns an awaitable (a lambda around a coroutine).
                return await result if inspect.isawaitable(result) else result
            return None  # cancelled by us: the caller re-raises its own cancellation

        call: asyncio.Task[Any] = asyncio.ensure_future(call_handler())
        call.set_name(f"mscheduler-handler:{task.key}")
        call.add_done_callback(_retrieved)  # read below, unless a stop came first
        limit = task.options.timeout_ms
        deadline = None if limit is None else self._clock.now() + dt.timedelta(milliseconds=limit)
        try:
            await self._until_done(call, deadline)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._stop(task, call, scope)
            raise
        if not call.done():
            await self._stop(task, call, scope)
            raise TaskTimeout(f"the handler ran past timeout_ms={limit} and was cancelled")
        if call.cancelled():
            raise HandlerCancelled(
                "the handler raised CancelledError without being cancelled (or was "
                "cancelled by code of its own)"
            )
        return call.result()

    async def _until_done(self, call: asyncio.Task[Any], deadline: dt.datetime | None) -> None:
        """Wait for the call to end, or the clock to reach ``deadline``. A fresh event each
        time: the clock sets the one it is given when the deadline comes."""
        while not call.done() and (deadline is None or self._clock.now() < deadline):
            wake = anyio.Event()
            call.add_done_callback(functools.partial(_set, wake))
            await self._clock.wait_until(deadline, wake)

    async def _stop(self, task: Task, call: asyncio.Task[Any], scope: anyio.CancelScope) -> None:
        """Cancel the call; give it ``cancel_timeout_ms`` to unwind, then abandon it."""
        scope.cancel()
        timeout = dt.timedelta(milliseconds=self._options.cancel_timeout_ms)
        await self._until_done(call, self._clock.now() + timeout)
        if not call.done():
            self._abandon(task, call)

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


def _finished_fields(lease: Lease, outcome: str, seconds: float | None) -> dict[str, Any]:
    """What every line about a finished attempt carries, for a log shipper to group by."""
    return {
        "key": lease.key,
        "task_name": lease.task.name,
        "worker_id": lease.worker_id,
        "attempt": lease.task.attempts,
        "duration_s": None if seconds is None else round(seconds, 3),
        "outcome": outcome,
    }


def log_finished(lease: Lease, outcome: str, seconds: float | None) -> None:
    """One INFO line per attempt that ended without failing (``success``, ``retry_later``),
    as Celery, arq and RQ log each job: a success otherwise leaves no trace. A failure is
    `log_failure`'s WARNING, with the same fields."""
    if not log.isEnabledFor(logging.INFO):  # its fields are not built for nothing
        return
    took = "" if seconds is None else f" in {seconds:.3f} s"
    log.info(
        "task %r (%s) attempt %d %s%s",
        lease.key,
        lease.task.name,
        lease.task.attempts,
        "succeeded" if outcome == "success" else "will run again later",
        took,
        extra={
            "action": "task_succeeded" if outcome == "success" else "task_deferred",
            **_finished_fields(lease, outcome, seconds),
        },
    )


def log_failure(
    lease: Lease, error: BaseException, info: ErrorInfo, task: Task, seconds: float | None = None
) -> None:
    """A failed attempt is a WARNING naming the task, the attempt and the error (``info``, as
    stored: a ``str()`` that raises is handled there), with the traceback once the task has
    failed for good (before that, a retry may still fix it)."""
    final = task.state.is_terminal
    log.warning(
        "task %r (%s) attempt %d failed%s: %s: %s",
        lease.key,
        lease.task.name,
        task.attempts,
        ", no retry left" if final else ", will retry",
        info.type,
        info.message,
        extra={
            **_finished_fields(lease, "fail", seconds),
            "action": "task_failed" if final else "attempt_failed",
            "attempt": task.attempts,
            "error": f"{info.type}: {info.message}",
            "state": task.state.value,
        },
        exc_info=error if final else None,
    )
