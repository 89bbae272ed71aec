"""Batch handlers (`mscheduler.handlers.batch`): one call of a handler for many tasks
claimed together.

A batch handler is still run by the executor once per task: each task keeps its own lease,
pings, time limit, local retries and fenced finish. What it changes is the call: each task's
run joins its name's open *group* and waits; the group is handed to the handler as a list once
it holds ``max_size`` tasks, or ``max_wait`` after its first task joined (on the consumer's
clock), and each task's run gets its own result back (or the handler's exception, which
fails that attempt of every task of the group, each then retried by its own rules).

The handler's call runs in the consumer's task group, not in any task's run: a task whose
handler is stopped (lease lost, cancelled, timed out) leaves the group before the call, or
has its result dropped after it, and the others' call goes on.

The consumer claims up to its free slots at once (one batched claim), so a group fills from
one claim when ``max_running`` is at least ``max_size``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from ..clock import Clock
from ..errors import ConfigurationError
from ..models import Task

log = logging.getLogger(__name__)

BatchFunction = Callable[[list[Task]], Any]
"""``async def handler(tasks) -> list of results`` (one per task, in order), or a plain ``def``
(run in a worker thread)."""


class Batch:
    """What `batch` returns: a handler of lists of tasks, for ``consumer(...)``."""

    def __init__(
        self, handler: BatchFunction, max_size: int, max_wait: dt.timedelta | float
    ) -> None:
        if not callable(handler):
            raise ConfigurationError(
                f"batch: expected a function (tasks) -> results, got {type(handler).__name__}"
            )
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ConfigurationError(f"max_size: expected an integer >= 1, got {max_size!r}")
        if isinstance(max_wait, int | float) and not isinstance(max_wait, bool):
            max_wait = dt.timedelta(seconds=max_wait)
        if not isinstance(max_wait, dt.timedelta) or max_wait < dt.timedelta(0):
            raise ConfigurationError(f"max_wait: expected a timedelta >= 0, got {max_wait!r}")
        self.handler = handler
        self.max_size = max_size
        self.max_wait: dt.timedelta = max_wait
        call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects too
        self.is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)

    async def __call__(self, task: Task) -> Any:
        raise ConfigurationError(
            "batch: a batch handler runs in a consumer (sched.consumer({name: batch(...)}))"
        )


def batch(
    handler: BatchFunction,
    *,
    max_size: int = 100,
    max_wait: dt.timedelta | float = dt.timedelta(seconds=1),
) -> Batch:
    """A consumer's handler that receives ``list[ms.Task]`` (claimed together, up to
    ``max_size``, waiting at most ``max_wait`` to fill) and returns one result per task, in
    order; an exception fails that attempt of every task of the batch. Each task keeps its own
    lease, pings and retries."""
    return Batch(handler, max_size, max_wait)


@dataclasses.dataclass(eq=False)
class _Group:
    name: str
    tasks: list[Task | None] = dataclasses.field(default_factory=list)  # None: left
    # Each task's: told as the handler's call begins (a start counts against a rate from then).
    started: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    results: list[Any] = dataclasses.field(default_factory=list)
    error: BaseException | None = None
    full: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    called: bool = False


class Batcher:
    """A batch handler as one consumer runs it (its clock, its task group): the open group
    of each name, and the calls of the closed ones."""

    def __init__(
        self, batch: Batch, clock: Clock, task_group: Callable[[], TaskGroup | None]
    ) -> None:
        self._batch = batch
        self._clock = clock
        self._task_group = task_group
        self._open: dict[str, _Group] = {}

    async def __call__(self, task: Task, started: Callable[[], None] = lambda: None) -> Any:
        """``task``'s result from its group's call; ``started`` is called as that call
        begins, which may be ``max_wait`` after the task joined."""
        group = self._open.get(task.name)
        if group is None:
            group = self._open[task.name] = _Group(task.name)
            self._start(self._flush_after_wait, group)
        index = len(group.tasks)
        group.tasks.append(task)
        group.started.append(started)
        if len(group.tasks) >= self._batch.max_size:
            self._close(group)
        try:
            await group.done.wait()
        except BaseException:
            if not group.called:
                group.tasks[index] = None  # stopped before the call: it is not handed over
            raise
        if group.error is not None:
            raise group.error
        return group.results[index]

    def _start(self, function: Callable[[_Group], Any], group: _Group) -> None:
        task_group = self._task_group()
        if task_group is None:
            raise ConfigurationError("batch: the consumer is not running")
        task_group.start_soon(function, group, name=f"mscheduler-batch:{group.name}")

    def _close(self, group: _Group) -> None:
        """No task joins ``group`` any more; its call starts."""
        if self._open.get(group.name) is group:
            del self._open[group.name]
            group.full.set()
            self._start(self._call, group)

    async def _flush_after_wait(self, group: _Group) -> None:
        deadline = self._clock.now() + self._batch.max_wait
        await self._clock.wait_until(deadline, group.full)
        self._close(group)

    async def _call(self, group: _Group) -> None:
        kept = [(index, task) for index, task in enumerate(group.tasks) if task is not None]
        group.called = True
        results: list[Any] = [None] * len(group.tasks)
        try:
            if kept:
                tasks = [task for _, task in kept]
                for index, _ in kept:
                    group.started[index]()
                returned = await self._run(tasks)
                if not isinstance(returned, Sequence) or isinstance(returned, str | bytes):
                    raise TypeError(
                        f"batch handler of {group.name!r}: expected a list of {len(tasks)} "
                        f"results, got {type(returned).__name__}"
                    )
                if len(returned) != len(tasks):
                    raise ValueError(
                        f"batch handler of {group.name!r}: {len(returned)} results for "
                        f"{len(tasks)} tasks"
                    )
                for (index, _), result in zip(kept, returned, strict=True):
                    results[index] = result
        except Exception as exc:
            group.error = exc
        except BaseException:
            group.error = RuntimeError("the batch's call was cancelled (the worker stopped)")
            raise
        finally:
            group.results = results
            group.done.set()

    async def _run(self, tasks: list[Task]) -> Any:
        if self._batch.is_async:
            return await self._batch.handler(tasks)
        result = await anyio.to_thread.run_sync(self._batch.handler, tasks)
        return await result if inspect.isawaitable(result) else result
