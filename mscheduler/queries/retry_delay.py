"""When a task whose run did not succeed may be claimed again: its ``retry_at``.

- A handler failure (`lease.fail_update`) delays the next claim by the task's
  ``options.unexpected_retry_delay_ms``, added by the server in the failure's own write, so
  the delay is the one of the options the task holds when it fails (`after_failure`).
- A handler that raised `RetryLater` names its own delay (`retry_later_at`); it is not a
  failure and counts against no retries.
- A timeout or a lost lease adds nothing: the worker timeout was the delay.

``recompute`` (`derived`) then makes the task claimable from ``max(not_before, retry_at)``.
Before any of these, a consumer may retry a failed handler call within its claim
(``WorkerOptions.handler_retries``), waiting `WorkerOptions.handler_retry_delay` (doubling
from ``retry_backoff_ms``). Neither is the wait while the database is unreachable
(`mscheduler.reconnect_backoff`) nor a publish's start delay (`mscheduler.start_delay`).
"""

from __future__ import annotations

import datetime as dt

from ..clock import to_bson_time
from .stages import Document


def after_failure(now: dt.datetime) -> Document:
    """The stage that sets a failed task's ``retry_at``: ``now`` plus its
    ``unexpected_retry_delay_ms``."""
    return {"$set": {"retry_at": {"$add": [now, "$options.unexpected_retry_delay_ms"]}}}


def retry_later_at(now: dt.datetime, delay_s: float) -> dt.datetime:
    """The ``retry_at`` of a run that asked to be retried ``delay_s`` seconds from ``now``."""
    return to_bson_time(now + dt.timedelta(seconds=delay_s))
