"""The delay after a failure, computed on the server in the failure's own write
(`lease.fail_update`): the task's ``options.unexpected_retry_delay_ms``, grown by
``retry_backoff`` per failure up to ``retry_backoff_max_ms`` and spread by ``retry_jitter``
(`_failure_delay_ms`), so the delay is the one of the options (and the failures) the task
holds when it fails (`after_failure`). Every other retry rule, and where each is applied, is
listed in `mscheduler.retry_policy`.
"""

from __future__ import annotations

import datetime as dt

from .. import constants as c
from ..retry_policy import BACKOFF_DEFAULTS
from .stages import Document, failures, literal

# The options' defaults, read for a task that does not store them (`TaskOptions.to_document`
# leaves them out at their defaults); no maximum of its own is the largest delay.
_BACKOFF: Document = {"$ifNull": ["$options.retry_backoff", BACKOFF_DEFAULTS["retry_backoff"]]}
_BACKOFF_MAX_MS: Document = {"$ifNull": ["$options.retry_backoff_max_ms", c.MAX_RETRY_DELAY_MS]}
_JITTER: Document = {"$ifNull": ["$options.retry_jitter", BACKOFF_DEFAULTS["retry_jitter"]]}

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
