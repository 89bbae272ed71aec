"""`Service`: how every loop-owning service of the process is run; `OneRunner`: one watch per
process, however many callers serve it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from ..worker_options import WorkerOptions


class Service(Protocol):
    """The one start/stop contract of a loop-owning service (the discovery hub, the control
    hub): it runs in its caller's task group, never in one of its own that would outlive the
    caller (a `Scheduler` needs no ``async with``). Started: ``await task_group.start(
    service.serve, options)`` returns once its loop is up (a first read after it misses no
    change); stopped: the caller cancels it (its scope, or its task group).

    Invariant: many callers may serve one service at once; one of them runs the loop and the
    others stand by to take over if it stops (`OneRunner`), so the process never holds two of
    the same loop, and never none while a caller still serves it."""

    async def serve(
        self, options: WorkerOptions, *, task_status: TaskStatus[None] = ...
    ) -> None: ...


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
