"""The start delay of a published task: a relative start (``publish(delay=...)``,
``debounce=``) turned into ``not_before``. Not a retry delay (`retry_policy`) nor the
wait while the database is unreachable (`reconnect_backoff`)."""

from __future__ import annotations

import datetime as dt
import math

from .errors import ConfigurationError
from .models import TaskOptions

MAX_DELAY = dt.timedelta(days=366 * 100)  # far, yet no date computed from it overflows


def with_start_delay(
    options: TaskOptions | None,
    delay: dt.timedelta | float | None,
    now: dt.datetime,
    field: str = "delay",
) -> TaskOptions | None:
    """``options`` with ``not_before = now + delay`` (Celery's ``countdown``, procrastinate's
    ``schedule_in``): a relative delay needs no timezone, so it cannot be misread."""
    if delay is None:
        return options
    if isinstance(delay, bool) or not isinstance(delay, (dt.timedelta, int, float)):
        raise ConfigurationError(
            f"{field}: expected a timedelta or a number of seconds, got {type(delay).__name__}"
        )
    if isinstance(delay, dt.timedelta):
        span = delay
    elif math.isfinite(delay) and 0 <= delay <= MAX_DELAY.total_seconds():
        span = dt.timedelta(seconds=delay)
    else:
        raise ConfigurationError(f"{field}: {delay!r} seconds is not between 0 and 100 years")
    if not dt.timedelta(0) <= span <= MAX_DELAY:
        raise ConfigurationError(f"{field}: {span} is not between 0 and 100 years")
    if options is not None and options.not_before is not None:
        raise ConfigurationError(f"{field}: give either {field} or options.not_before, not both")
    fields = options.model_dump() if options is not None else {}
    return TaskOptions.model_validate({**fields, "not_before": now + span})
