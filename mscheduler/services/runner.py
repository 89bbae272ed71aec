"""`OneRunner`: one watch per process, however many callers serve it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskStatus


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
