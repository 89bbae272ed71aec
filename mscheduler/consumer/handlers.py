"""Handlers as a consumer runs them: async or sync, with the exceptions that retry.

A plain mapping ``{"email": send_email}`` works everywhere; `Handlers` is the registry with a
decorator for those who prefer it (Celery's ``@app.task``, arq's ``functions``), and the
place to say which exceptions deserve a retry.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar

from ..errors import ConfigurationError
from ..models import Task, check_name

Handler = Callable[[Task], Any]
"""``async def handler(task) -> result``, or a plain ``def`` (run in a worker thread)."""
F = TypeVar("F", bound=Handler)
ExceptionTypes = tuple[type[BaseException], ...]


@dataclasses.dataclass(frozen=True)
class HandlerSpec:
    function: Handler
    is_async: bool
    retry_on: ExceptionTypes | None  # None: every exception retries

    def retries(self, error: BaseException) -> bool:
        """Whether a failure with ``error`` may be retried (else it ends the task)."""
        return self.retry_on is None or isinstance(error, self.retry_on)


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

    def spec(self, name: str) -> HandlerSpec:
        return self._specs[name]

    def __getitem__(self, name: str) -> Handler:
        return self._specs[name].function

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def handler_specs(handlers: Any) -> dict[str, HandlerSpec]:
    """What a consumer runs, from a `Handlers` registry or a plain mapping."""
    if not isinstance(handlers, Mapping) or not handlers:
        raise ConfigurationError(
            "handlers: expected a non-empty mapping of task name to function, or ms.Handlers()"
        )
    if isinstance(handlers, Handlers):
        return {name: handlers.spec(name) for name in handlers}
    return {name: _spec(name, function, None, "handlers") for name, function in handlers.items()}
