"""The reconnect backoff: the growing waits, on the injectable clock, of an operation
retried while the database is unreachable: a change stream reopened, a poll, a finish, a
ping or a limited name's start sent again.

Every loop of the package that waits out an unreachable database goes through here: a test's
`ManualClock` drives its delays (no real sleep), and a change to how retries wait is made once.
Not a task's retry delay after its handler failed: that is `retry_policy`'s.

Not tenacity or stamina: their waits are measured on the real clock (stamina's testing mode
only turns them off), and the finish of every task passes through this code, where their
per-call bookkeeping would cost more than the loop itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .clock import Clock, sleep
from .errors import BackendUnavailable

T = TypeVar("T")

Delay = Callable[[int], float]
"""Seconds to wait after the ``attempt``-th failure in a row (0-based)."""


class Backoff:
    """The delays of one operation retried while it fails: the count of failures in a row,
    reset by a success. For loops that do more than retry one call (`retrying` does that)."""

    def __init__(self, clock: Clock, delay: Delay, *, attempt: int = 0) -> None:
        self._clock = clock
        self._delay = delay
        self.attempt = attempt  # failures in a row so far

    def next_delay(self) -> float:
        """The delay after one more failure (counted)."""
        seconds = self._delay(self.attempt)
        self.attempt += 1
        return seconds

    async def wait(self) -> None:
        """One more failure: wait its delay on the clock."""
        await sleep(self._clock, self.next_delay())

    def reset(self) -> None:
        self.attempt = 0


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    delay: Delay,
    logger: logging.Logger,
    action: str,
    retry_on: tuple[type[BaseException], ...] = (BackendUnavailable,),
    extra: Mapping[str, Any] | None = None,
) -> T:
    """``call()`` until it returns, waiting ``delay(attempt)`` after each error of
    ``retry_on`` (logged as a warning with ``action``, to the caller's ``logger``); any other
    error propagates at once, as does cancellation."""
    backoff = Backoff(clock, delay)
    while True:
        try:
            return await call()
        except retry_on as exc:
            logger.warning(str(exc), extra={"action": action, **(extra or {})})
            await backoff.wait()
