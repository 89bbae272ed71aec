"""The store's border with the driver: pymongo's exceptions become mscheduler's here.

Only the store talks to MongoDB (tests/unit/test_layout.py), so only the store translates
what the driver raises; the exception classes themselves live in `mscheduler.errors`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from pymongo.errors import ConnectionFailure, DocumentTooLarge, PyMongoError

from ..errors import BackendUnavailable, PayloadError, StoreError

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


async def driver_result(result: Awaitable[T] | T) -> T:
    """What a call that the drivers answer differently gives: pymongo's async API returns a
    coroutine of it, Motor the thing itself (an aggregation's cursor, a change stream)."""
    if inspect.isawaitable(result):
        return await result
    return result


def driver_errors(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Driver errors become mscheduler errors, the original kept as ``__cause__``."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if getattr(args[0], "in_transaction", False):
            # Raw inside a transaction: the driver retries it on transient errors by label.
            return await method(*args, **kwargs)
        try:
            return await method(*args, **kwargs)
        except ConnectionFailure as exc:
            raise BackendUnavailable(f"MongoDB is unreachable: {exc}") from exc
        except DocumentTooLarge as exc:
            raise PayloadError(f"the task document is too large: {exc}") from exc
        except PyMongoError as exc:
            raise StoreError(f"{method.__name__} failed: {exc}") from exc

    return wrapper
