"""Whether and when a task runs again after an attempt that did not succeed: every retry rule,
named once, with where it is applied.

The rules decided in this process (pure, here):

- **A failure that ends the task** (`ends_the_task`): `Abort`, or an exception the handler's
  ``retry_on`` does not list (`consumer.handlers.Handlers`); the consumer writes it as a
  final failure (`consumer.executor`, `store.tasks.fail`'s ``final``). `RetryLater` is no
  failure at all.
- **Local retries** (`retries_locally`): within its claim, a consumer calls a failed
  handler again up to ``WorkerOptions.handler_retries`` times, never after `Abort`,
  `RetryLater` or `TaskTimeout` (the time limit bounds how long the task is held), waiting
  `doubling_delay_s` of ``retry_backoff_ms`` up to ``retry_backoff_max_ms`` between calls
  (`WorkerOptions.handler_retry_delay`); only the last call's failure is written.
- **The retry's time after `RetryLater`** (`retry_later_at`): the delay the handler named,
  written as the task's ``retry_at`` (`store.tasks.retry_later`); not a failure, so it
  counts against ``max_tries`` only.
- **The backoff options a task need not store** (`BACKOFF_DEFAULTS`): a task that keeps
  them at their defaults stores none (`TaskOptions.to_document`), and the server reads a
  missing one as its default (`queries.retry_delay`).

The rules decided on the server, inside every write of a task (query builders, so the
counts and the decision are those of the document the write changes):

- **How many failures a task survives**: ``max_unexpected_retries`` unexpected failures
  (attempts ended ``fail`` or ``timeout``, `queries.stages.failures`), so it runs
  `attempts_on_failures` times when every attempt fails;
  `queries.stages.retries_left` in the claim filter and the claim's write
  (`queries.tasks`), `queries.stages.out_of_retries` in `queries.derived.recompute`, which
  fails the task.
- **How many attempts**: ``max_tries`` counts every attempt, ``RetryLater`` ones included
  (`queries.stages.tries_left`, `queries.stages.tries_exhausted`).
- **The delay after a failure**: ``unexpected_retry_delay_ms``, grown by ``retry_backoff``
  per failure up to ``retry_backoff_max_ms`` and spread by ``retry_jitter``, computed in
  the failure's own write (`queries.retry_delay.after_failure`; the jitter's draw is the
  writer's, `store.tasks`).
- **A lease that expired** is an unexpected failure with no delay of its own: the worker
  timeout was the delay (`queries.stages.sweep_expired`).
- **When the retry may be claimed**: ``max(not_before, retry_at)``
  (`queries.derived.recompute`'s ``next_claim_at``).

Not retries of a task: the waits while the database is unreachable
(`mscheduler.reconnect_backoff`) and a publish's start delay (`mscheduler.start_delay`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from .clock import to_bson_time
from .errors import Abort, RetryLater, TaskTimeout

ExceptionTypes = tuple[type[BaseException], ...]

# The backoff options of `TaskOptions` at their defaults: the same delay after every
# failure, no maximum of its own, no jitter.
BACKOFF_DEFAULTS: Final[dict[str, Any]] = {
    "retry_backoff": 1.0,
    "retry_backoff_max_ms": None,
    "retry_jitter": 0.0,
}


def ends_the_task(error: BaseException, retry_on: ExceptionTypes | None) -> bool:
    """Whether a handler's ``error`` fails its task whatever retries are left: `Abort`, or an
    exception ``retry_on`` does not list (None: every exception retries). `RetryLater` is
    not a failure."""
    if isinstance(error, RetryLater):
        return False
    if isinstance(error, Abort):
        return True
    return retry_on is not None and not isinstance(error, retry_on)


def retries_locally(error: BaseException, attempt: int, handler_retries: int) -> bool:
    """Whether a handler call that raised ``error`` on local ``attempt`` (0-based) is called
    again within the same claim: a failure the task's rules retry (see `ends_the_task`,
    decided first), not a `TaskTimeout`, while ``handler_retries`` lasts."""
    if isinstance(error, (Abort, RetryLater, TaskTimeout)):
        return False
    return attempt < handler_retries


def attempts_on_failures(max_unexpected_retries: int) -> int:
    """How many attempts a task makes when each one fails: the first and its retries (the
    server fails the task at the failure past ``max_unexpected_retries``)."""
    return max_unexpected_retries + 1


def doubling_delay_s(base_ms: int, max_ms: int, attempt: int) -> float:
    """Seconds before try ``attempt + 1`` (``attempt`` 0-based): ``base_ms`` doubled per
    attempt, capped at ``max_ms``."""
    delay_ms: int = min(base_ms * 2 ** min(attempt, 32), max_ms)
    return delay_ms / 1000


def retry_later_at(now: dt.datetime, delay_s: float) -> dt.datetime:
    """The ``retry_at`` of a run that asked to be retried ``delay_s`` seconds from ``now``."""
    return to_bson_time(now + dt.timedelta(seconds=delay_s))
