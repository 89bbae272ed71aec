"""When a task whose run did not succeed may be claimed again: its ``retry_at``.

- A handler failure (`lease.fail_update`) delays the next claim by the task's
  ``options.unexpected_retry_delay_ms``, grown by ``retry_backoff`` per failure up to
  ``retry_backoff_max_ms`` and spread by ``retry_jitter`` (`_failure_delay_ms`). The server
  computes it in the failure's own write, so the delay is the one of the options (and the
  failures) the task holds when it fails (`after_failure`).
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

from .. import constants as c
from ..clock import to_bson_time
from .stages import Document, failures, literal

# The options' defaults, read for a task that does not store them (`TaskOptions.to_document`
# leaves them out at their defaults): the same delay after every failure, no jitter.
_BACKOFF: Document = {"$ifNull": ["$options.retry_backoff", 1.0]}
_BACKOFF_MAX_MS: Document = {"$ifNull": ["$options.retry_backoff_max_ms", c.MAX_RETRY_DELAY_MS]}
_JITTER: Document = {"$ifNull": ["$options.retry_jitter", 0.0]}

# A backoff from this value up reaches `constants.MAX_RETRY_DELAY_MS` within
# `_STEEP_EXPONENT` failures from a delay of 1 ms (1.5 ** 64 > 2 ** 37), so its exponent is
# bounded there; a gentler one is bounded by `_EXPONENT_BOUND`, past every failure count a
# task can reach (``max_unexpected_retries`` + 1). Either way the power stays a finite double
# (10 ** 64, 1.5 ** 1100) and the delay it gives is the one the exact power gives.
_STEEP_BACKOFF = 1.5
_STEEP_EXPONENT = 64
_EXPONENT_BOUND = 1_100


def _smaller(a: Document | int, b: Document | int) -> Document:
    # Not {"$min": [a, b]}: the vocabulary keeps $min to $group (constants.OPERATORS).
    return {"$cond": [{"$lt": [a, b]}, a, b]}


def _backoff_power() -> Document:
    """``retry_backoff ** (n - 1)`` for the n-th unexpected failure (`stages.failures`, which
    already counts the failure being written), with the exponent bounded as the notes on
    `_STEEP_BACKOFF` say."""
    exponent = {"$add": [failures(), -1]}
    bound = {"$cond": [{"$gte": [_BACKOFF, _STEEP_BACKOFF]}, _STEEP_EXPONENT, _EXPONENT_BOUND]}
    return {"$pow": [_BACKOFF, _smaller(exponent, bound)]}


def _failure_delay_ms(spread: float) -> Document:
    """The delay after this failure, in whole milliseconds:
    ``min(retry_backoff_max_ms, unexpected_retry_delay_ms * _backoff_power())`` times
    ``1 + retry_jitter * spread`` (``spread``: the writer's draw, uniform in [-1, 1]).
    Without a maximum the delay stops growing at `constants.MAX_RETRY_DELAY_MS`. With the
    defaults it is ``unexpected_retry_delay_ms`` itself."""
    grown = {"$multiply": ["$options.unexpected_retry_delay_ms", _backoff_power()]}
    factor = {"$add": [1, {"$multiply": [_JITTER, literal(spread)]}]}
    # Whole milliseconds: engines differ on a fractional number of them added to a date.
    return {"$trunc": [{"$multiply": [_smaller(grown, _BACKOFF_MAX_MS), factor]}]}


def after_failure(now: dt.datetime, spread: float) -> Document:
    """The stage that sets a failed task's ``retry_at``: ``now`` plus `_failure_delay_ms`."""
    return {"$set": {"retry_at": {"$add": [now, _failure_delay_ms(spread)]}}}


def retry_later_at(now: dt.datetime, delay_s: float) -> dt.datetime:
    """The ``retry_at`` of a run that asked to be retried ``delay_s`` seconds from ``now``."""
    return to_bson_time(now + dt.timedelta(seconds=delay_s))
