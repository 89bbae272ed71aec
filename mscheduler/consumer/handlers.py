"""Handlers as a consumer runs them: async or sync, with the exceptions that retry.

A plain mapping ``{"email": send_email}`` works everywhere; `Handlers` is the registry with a
decorator for those who prefer it (Celery's ``@app.task``, arq's ``functions``), and the
place to say which exceptions deserve a retry.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pickle
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar

from ..errors import ConfigurationError
from ..models import Task, check_name
from ..retry_policy import ExceptionTypes

Handler = Callable[[Task], Any]
"""``async def handler(task) -> result``, or a plain ``def`` (run in a worker thread)."""
F = TypeVar("F", bound=Handler)


@dataclasses.dataclass(frozen=True)
class Isolated:
    """A plain ``def`` handler that a worker runs in a child process of its own pool (see
    `isolated`). Called directly, it runs in the calling process, as the function would."""

    function: Callable[[Task], Any]
    max_tasks_per_child: int | None = None
    max_memory_mb: float | None = None

    def __call__(self, task: Task) -> Any:
        return self.function(task)

    def wears_out(self, tasks_run: int, resident_bytes: int) -> bool:
        """Whether a child that has run ``tasks_run`` tasks, the last one of this handler, and
        holds ``resident_bytes`` now must be replaced before it runs another."""
        if self.max_tasks_per_child is not None and tasks_run >= self.max_tasks_per_child:
            return True
        limit = self.max_memory_mb
        return limit is not None and resident_bytes > limit * 1024 * 1024


def isolated(
    function: Callable[[Task], Any],
    *,
    max_tasks_per_child: int | None = None,
    max_memory_mb: float | None = None,
) -> Isolated:
    """Run a plain ``def`` handler in a child process of the worker's pool instead of a thread:
    a handler that blocks on the CPU, leaks memory, segfaults or calls ``os._exit`` cannot
    take the worker down, and ``timeout_ms`` kills it at the deadline.

    ``function`` must be a module-level ``def`` of an importable module (not ``__main__``):
    the child imports it by name, and the task and the result cross by pickling.
    ``ms.current_lease()`` works in the child, and progress is reported as from a thread:
    ``anyio.from_thread.run(ms.current_lease().progress, fraction, message)``; the worker
    keeps the lease and writes the outcome. A child that dies fails the attempt with
    `HandlerProcessDied`.

    ``max_tasks_per_child``: a child is replaced after running that many tasks;
    ``max_memory_mb``: a child whose resident memory passed this bound after a task is
    replaced (checked between tasks)."""
    where = f"isolated({getattr(function, '__qualname__', function)!r})"
    if isinstance(function, Isolated):
        raise ConfigurationError(f"{where}: the handler is isolated already")
    if not inspect.isfunction(function) or _is_async(function):
        raise ConfigurationError(
            f"{where}: expected a plain def function (task) -> result, got "
            f"{'an async function' if _is_async(function) else type(function).__name__}"
        )
    name = f"{function.__module__}.{function.__qualname__}"
    try:
        importable = function.__module__ != "__main__" and "<" not in function.__qualname__
        importable = importable and pickle.loads(pickle.dumps(function)) is function
    except (pickle.PicklingError, AttributeError, TypeError, ImportError):
        importable = False
    if not importable:  # a lambda, a nested function, a script's own function, a rebound name
        raise ConfigurationError(
            f"{where}: the handler's process imports it by name, and {name} names no "
            f"function of an importable module: define it at the top level of one"
        )
    if max_tasks_per_child is not None and (
        isinstance(max_tasks_per_child, bool)
        or not isinstance(max_tasks_per_child, int)
        or max_tasks_per_child < 1
    ):
        raise ConfigurationError(
            f"{where}: max_tasks_per_child must be a whole number of at least 1, got "
            f"{max_tasks_per_child!r}"
        )
    if max_memory_mb is not None and (
        isinstance(max_memory_mb, bool)
        or not isinstance(max_memory_mb, (int, float))
        or not math.isfinite(max_memory_mb)
        or max_memory_mb <= 0
    ):
        raise ConfigurationError(
            f"{where}: max_memory_mb must be a number of megabytes above 0, got {max_memory_mb!r}"
        )
    return Isolated(function, max_tasks_per_child, max_memory_mb)


@dataclasses.dataclass(frozen=True)
class HandlerSpec:
    function: Handler
    is_async: bool
    retry_on: ExceptionTypes | None  # None: every exception retries (`retry_policy`)
    isolated: Isolated | None = None  # runs in a child process (`isolated`)


def _is_async(function: Any) -> bool:
    call = getattr(function, "__call__", None)  # noqa: B004 - async callable objects too
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _spec(name: Any, function: Any, retry_on: Any, where: str) -> HandlerSpec:
    try:
        check_name(name)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    if not callable(function):
        raise ConfigurationError(
            f"{where}[{name!r}]: expected a function (task) -> result, got "
            f"{type(function).__name__}"
        )
    if retry_on is not None:
        types = tuple(retry_on) if isinstance(retry_on, (tuple, list)) else (retry_on,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
            raise ConfigurationError(
                f"{where}[{name!r}]: retry_on must be exception classes, got {retry_on!r}"
            )
        retry_on = types
    if isinstance(function, Isolated):
        return HandlerSpec(function, False, retry_on, function)
    return HandlerSpec(function, _is_async(function), retry_on)


class Handlers(Mapping[str, Handler]):
    """A registry of handlers by task name::

        handlers = ms.Handlers()

        @handlers.task("email", retry_on=(TimeoutError,))
        async def send_email(task: ms.Task) -> None: ...

    ``retry_on``: only these exceptions are retried (within ``max_unexpected_retries``);
    any other ends the task as failed at once, as `Abort` does, `TaskTimeout` included unless
    listed. Left out, every one retries.
    """

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}

    def task(
        self, name: str, *, retry_on: type[BaseException] | ExceptionTypes | None = None
    ) -> Callable[[F], F]:
        def register(function: F) -> F:
            self.add(name, function, retry_on=retry_on)
            return function

        return register

    def add(
        self,
        name: str,
        function: Handler,
        *,
        retry_on: type[BaseException] | ExceptionTypes | None = None,
    ) -> None:
        if name in self._specs:
            raise ConfigurationError(f"handlers: {name!r} is registered twice")
        self._specs[name] = _spec(name, function, retry_on, "handlers")

    def subset(self, names: Collection[str]) -> Handlers:
        """The handlers of ``names`` only, with their options."""
        kept = Handlers()
        kept._specs = {name: spec for name, spec in self._specs.items() if name in names}
        return kept

    def isolate_plain(self) -> Handlers:
        """The same registry with every plain ``def`` handler `isolated` (``retry_on`` kept);
        async handlers and those isolated already are left as they are."""
        kept = Handlers()
        kept._specs = {name: _isolate_spec(spec) for name, spec in self._specs.items()}
        return kept

    def spec(self, name: str) -> HandlerSpec:
        return self._specs[name]

    def __getitem__(self, name: str) -> Handler:
        return self._specs[name].function

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def _isolate_spec(spec: HandlerSpec) -> HandlerSpec:
    if not _is_plain(spec.function):
        return spec
    wrapped = isolated(spec.function)
    return HandlerSpec(wrapped, False, spec.retry_on, wrapped)


def _is_plain(function: Any) -> bool:
    return inspect.isfunction(function) and not _is_async(function)


def isolate_plain(handlers: Mapping[str, Handler]) -> Mapping[str, Handler]:
    """``handlers`` with every plain ``def`` handler `isolated` (``mscheduler worker
    --isolate``); a `Handlers` registry keeps its ``retry_on``."""
    if isinstance(handlers, Handlers):
        return handlers.isolate_plain()
    return {
        name: isolated(function) if _is_plain(function) else function
        for name, function in handlers.items()
    }


def handler_specs(handlers: Any) -> dict[str, HandlerSpec]:
    """What a consumer runs, from a `Handlers` registry or a plain mapping."""
    if not isinstance(handlers, Mapping) or not handlers:
        raise ConfigurationError(
            "handlers: expected a non-empty mapping of task name to function, or ms.Handlers()"
        )
    if isinstance(handlers, Handlers):
        return {name: handlers.spec(name) for name in handlers}
    return {name: _spec(name, function, None, "handlers") for name, function in handlers.items()}
