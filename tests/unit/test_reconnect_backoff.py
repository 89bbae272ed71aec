"""Retrying while the database is unreachable: the delays a consumer waits between tries
(doubling, capped, on the injectable clock), which errors it retries, and how it stops."""

from __future__ import annotations

import logging

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import BackendUnavailable, StoreError
from mscheduler.reconnect_backoff import Backoff, retrying
from mscheduler.testing import ManualClock

pytestmark = pytest.mark.anyio

OPTIONS = ms.WorkerOptions(reconnect_backoff_ms=500, reconnect_backoff_max_ms=3_000)
LOG = logging.getLogger("tests.retry_backoff")


class Flaky:
    """Fails ``failures`` times with ``error``, then returns ``"done"``."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


async def _waits(clock: ManualClock, count: int) -> list[float]:
    """Step ``clock`` through ``count`` sleeps of the retry loop; the seconds of each."""
    waits = []
    for _ in range(count):
        await anyio.wait_all_tasks_blocked()
        deadline = clock.next_deadline
        assert deadline is not None, "the loop should be waiting out a delay"
        waits.append((deadline - clock.now()).total_seconds())
        clock.set(deadline)
    return waits


async def test_waits_double_up_to_the_cap_then_the_result_is_returned(clock, caplog):
    call = Flaky(5, BackendUnavailable("MongoDB is unreachable"))
    results = []

    async def run() -> None:
        results.append(
            await retrying(
                call, clock=clock, delay=OPTIONS.reconnect_delay, logger=LOG, action="x_retry"
            )
        )

    with caplog.at_level(logging.WARNING, logger=LOG.name):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(run)
            assert await _waits(clock, 5) == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert results == ["done"]
    assert call.calls == 6
    retries = [r for r in caplog.records if r.name == LOG.name]
    assert [r.getMessage() for r in retries] == ["MongoDB is unreachable"] * 5
    assert {r.levelno for r in retries} == {logging.WARNING}
    assert {getattr(r, "action", None) for r in retries} == {"x_retry"}


async def test_an_error_it_does_not_retry_propagates_at_once(clock):
    call = Flaky(1, StoreError("the server refused the write"))
    with pytest.raises(StoreError):
        await retrying(
            call, clock=clock, delay=OPTIONS.reconnect_delay, logger=LOG, action="x_retry"
        )
    assert call.calls == 1
    assert clock.next_deadline is None  # no wait was started


async def test_the_errors_retried_are_the_callers_choice(clock):
    call = Flaky(2, ConnectionError("reset"))

    async def run() -> None:
        await retrying(
            call,
            clock=clock,
            delay=lambda attempt: 0.1 * (attempt + 1),
            logger=LOG,
            action="x_retry",
            retry_on=(ConnectionError,),
        )

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(run)
        assert await _waits(clock, 2) == [0.1, 0.2]
    assert call.calls == 3


async def test_cancelling_gives_up_during_a_wait(clock):
    call = Flaky(1_000, BackendUnavailable("MongoDB is unreachable"))

    async def run() -> None:
        await retrying(
            call, clock=clock, delay=OPTIONS.reconnect_delay, logger=LOG, action="x_retry"
        )

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(run)
        await _waits(clock, 3)
        await anyio.wait_all_tasks_blocked()
        task_group.cancel_scope.cancel()
    assert call.calls == 4
    assert clock.next_deadline is None  # the cancelled wait left nothing behind


async def test_a_backoff_counts_failures_in_a_row_and_a_success_resets_it(clock):
    backoff = Backoff(clock, OPTIONS.reconnect_delay)
    assert [backoff.next_delay() for _ in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert backoff.attempt == 4
    backoff.reset()
    assert backoff.next_delay() == 0.5

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(backoff.wait)  # the second failure in a row: one second
        assert await _waits(clock, 1) == [1.0]
