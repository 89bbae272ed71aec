"""The retry rules a consumer decides itself (`mscheduler.retry_policy`): which failure ends
its task at once, which one a handler is called again for within its claim, and how long it
waits. The server's rules (retries and tries counted in every write) are shown by the
scenarios (`test_task_lifecycle.py`, `test_consumer.py`)."""

from __future__ import annotations

import datetime as dt

import pytest

import mscheduler as ms
from mscheduler import retry_policy
from mscheduler.errors import TaskTimeout
from mscheduler.models import TaskOptions


@pytest.mark.parametrize(
    ("error", "retry_on", "ends"),
    [
        (ms.Abort(), None, True),
        (ms.Abort(), (ms.Abort,), True),  # an abort is the handler's decision, listed or not
        (ms.RetryLater(1), (KeyError,), False),  # not a failure: never ends the task
        (ValueError("x"), None, False),  # no retry_on: every exception retries
        (ValueError("x"), (ValueError,), False),
        (ValueError("x"), (KeyError,), True),  # not listed: the task fails at once
        (TaskTimeout("late"), (KeyError,), True),  # a timeout too, unless listed
        (TaskTimeout("late"), (TaskTimeout,), False),
    ],
)
def test_which_failure_ends_its_task(error, retry_on, ends):
    assert retry_policy.ends_the_task(error, retry_on) is ends


def test_a_handler_is_called_again_within_its_claim_while_its_local_retries_last():
    failure = ConnectionError("flaky")
    assert [retry_policy.retries_locally(failure, attempt, 2) for attempt in range(3)] == [
        True,
        True,
        False,
    ]
    assert not retry_policy.retries_locally(failure, 0, 0)  # none by default
    # The handler's own decisions, and a timed-out call, are never retried locally.
    for decided in (ms.Abort(), ms.RetryLater(5), TaskTimeout("late")):
        assert not retry_policy.retries_locally(decided, 0, 5)


def test_local_retries_wait_twice_as_long_each_time_up_to_the_maximum():
    options = ms.WorkerOptions(retry_backoff_ms=200, retry_backoff_max_ms=1_000)
    assert [options.handler_retry_delay(n) for n in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert options.handler_retry_delay(10_000) == 1.0  # a huge count does not overflow


def test_a_retry_later_is_claimable_after_the_delay_it_named():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert retry_policy.retry_later_at(now, 1.5) == now + dt.timedelta(seconds=1.5)


def test_a_task_at_the_backoff_defaults_stores_none_of_them():
    """A task that keeps the backoff options at their defaults pays nothing for them in its
    document; one that chose a value keeps it."""
    assert not set(retry_policy.BACKOFF_DEFAULTS) & set(TaskOptions().to_document())
    chosen = TaskOptions(retry_backoff=2.0).to_document()
    assert chosen["retry_backoff"] == 2.0 and "retry_jitter" not in chosen
