"""Several consumers in one task group: started together, stopped together."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import anyio

from ..worker_options import WorkerOptions
from .consumer import Consumer


def numbered(base: WorkerOptions, count: int) -> list[WorkerOptions]:
    """``count`` copies of ``base``; more than one get worker ids ``<id>-1``, ``<id>-2``..."""
    if count == 1:
        return [base]
    return [
        WorkerOptions.model_validate({**base.model_dump(), "worker_id": f"{base.worker_id}-{n}"})
        for n in range(1, count + 1)
    ]


@contextlib.asynccontextmanager
async def running(consumers: Sequence[Consumer]) -> AsyncIterator[list[Consumer]]:
    """Entered once every consumer listens (its stream open, its first fetch done); left
    once every one has stopped, gracefully (`Consumer.stop`), whatever ended the block.

    One task group for all, so the order in which they stop is ours to choose: nested
    ``async with consumer`` blocks tie each exit to the order the blocks close in."""
    group = list(consumers)
    async with anyio.create_task_group() as task_group:
        try:
            for consumer in group:
                await task_group.start(consumer.run)
            yield group
        finally:
            for consumer in group:
                consumer.stop()
