"""Handlers as users write them: a relative delay, a hard time limit, sync handlers, a handler
registry with ``retry_on``, several consumers at once, and failures that are visible in the
log. Every engine; a manual clock, no sleeps."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError
from mscheduler.testing import ManualClock
from tests.engines import FAST, POLL_MS, until_idle, worker

pytestmark = pytest.mark.anyio
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]


async def finished(sched: ms.Scheduler, key: str, clock: ManualClock) -> ms.Task:
    """The task once it ended; a sync handler runs in a thread, so real time must pass, and
    on the wire the clock must move for the poll. Ten real seconds at most."""
    with anyio.fail_after(10):
        while True:
            task = await sched.get(key)
            assert task is not None
            if task.state.is_terminal:
                return task
            clock.advance(POLL_MS / 1000)
            await anyio.sleep(0.01)


# ------------------------------------------------------------------------ delay


async def test_delay_sets_not_before_from_the_schedulers_clock(
    scheduler: ms.Scheduler, clock: ManualClock
):
    now = clock.now()
    first = await scheduler.publish("in-30s", None, name="job", delay=30)
    assert first.task.not_before == now + dt.timedelta(seconds=30)
    second = await scheduler.publish(
        "in-2m", None, name="job", delay=dt.timedelta(minutes=2), options=ms.TaskOptions(priority=3)
    )
    assert second.task.not_before == now + dt.timedelta(minutes=2)
    assert second.task.options.priority == 3
    assert await scheduler.store.tasks.claim("w", names=["job"]) is None  # not due yet
    clock.advance(30)
    lease = await scheduler.store.tasks.claim("w", names=["job"])
    assert lease is not None and lease.key == "in-30s"


@pytest.mark.parametrize(
    ("delay", "options", "message"),
    [
        (-1, None, "delay: -1 seconds is not between 0 and 100 years"),
        (float("nan"), None, "delay: nan seconds"),
        ("30s", None, "delay: expected a timedelta or a number of seconds, got str"),
        (
            5,
            ms.TaskOptions(not_before=dt.datetime(2031, 1, 1, tzinfo=dt.timezone.utc)),
            "delay: give either delay or options.not_before, not both",
        ),
    ],
)
async def test_a_bad_delay_is_refused_and_nothing_written(
    scheduler: ms.Scheduler, delay: Any, options: ms.TaskOptions | None, message: str
):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        await scheduler.publish("k", None, name="job", delay=delay, options=options)
    assert await scheduler.get("k") is None


# ------------------------------------------------------------------------ time limit


async def test_a_hung_handler_is_cancelled_at_timeout_ms_and_the_attempt_fails(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    cancelled: list[str] = []

    async def hang(task: ms.Task) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(task.key)

    options = ms.TaskOptions(timeout_ms=3_000, max_unexpected_retries=1, **FAST)
    await scheduler.publish("hung", None, name="job", options=options)
    async with scheduler.consumer({"job": hang}, options=worker()) as consumer:
        await discover()
        assert consumer.running == ["hung"]
        clock.advance(2.9)  # pinged meanwhile: the lease alone would hold it for ever
        await until_idle()
        assert consumer.running == ["hung"] and cancelled == []
        clock.advance(0.2)
        await until_idle()
        assert cancelled == ["hung"]
        task = await scheduler.get("hung")
        assert task is not None and task.state is S.PENDING  # one retry left
        assert task.worker_states[-1].error is not None
        assert task.worker_states[-1].error.type == "TaskTimeout"
        clock.advance(options.unexpected_retry_delay_ms / 1000)
        await discover()
        clock.advance(3.1)
        await until_idle()
    task = await scheduler.get("hung")
    assert task is not None and task.state is S.FAIL
    assert task.error is not None and task.error.type == "TaskTimeout"
    assert "timeout_ms=3000" in task.error.message
    assert consumer.stats.failed == 2


# ------------------------------------------------------------------------ sync handlers


async def test_a_sync_handler_runs_in_a_worker_thread_with_its_lease(
    scheduler: ms.Scheduler, clock: ManualClock
):
    seen: dict[str, Any] = {}

    def resize(task: ms.Task) -> dict[str, Any]:
        seen["thread"] = threading.get_ident()
        seen["run_id"] = ms.current_lease().run_id
        return {"size": task.payload["size"] * 2}

    await scheduler.publish("img", {"size": 21}, name="resize")
    async with scheduler.consumer({"resize": resize}, options=worker()):
        task = await finished(scheduler, "img", clock)
    assert task.state is S.SUCCESS and task.result == {"size": 42}
    assert seen["thread"] != threading.get_ident(), "the sync handler blocked the event loop"
    assert seen["run_id"] == task.worker_states[-1].run_id


async def test_a_sync_handler_that_checks_for_cancellation_stops_at_its_time_limit(
    scheduler: ms.Scheduler, clock: ManualClock
):
    stopped, running = threading.Event(), threading.Event()

    def busy(task: ms.Task) -> None:
        running.set()
        try:
            while True:
                anyio.from_thread.check_cancelled()
                time.sleep(0.005)
        finally:
            stopped.set()

    options = ms.TaskOptions(timeout_ms=1_000, max_unexpected_retries=0, **FAST)
    await scheduler.publish("busy", None, name="job", options=options)
    async with scheduler.consumer({"job": busy}, options=worker()):
        with anyio.fail_after(10):
            while not (await scheduler.get("busy") or ms.Task).worker_states:  # type: ignore[union-attr]
                clock.advance(POLL_MS / 1000)
                await anyio.sleep(0.01)
        assert await anyio.to_thread.run_sync(running.wait, 10), "the handler started"
        clock.advance(1.1)
        task = await finished(scheduler, "busy", clock)
    # The thread sees the cancellation at its next check, which may come after the consumer
    # has gone on: it stops, soon (a bounded real wait, not a timing).
    assert await anyio.to_thread.run_sync(stopped.wait, 10)
    assert task.state is S.FAIL and task.error is not None and task.error.type == "TaskTimeout"


# ------------------------------------------------------------------------ registry, retry_on


async def test_a_registry_retries_only_the_listed_exceptions(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    handlers = ms.Handlers()

    @handlers.task("fetch", retry_on=(TimeoutError,))
    async def fetch(task: ms.Task) -> None:
        raise (TimeoutError if task.payload == "slow" else KeyError)(task.key)

    assert dict(handlers) == {"fetch": fetch}
    await scheduler.publish("slow", "slow", name="fetch")
    await scheduler.publish("broken", "broken", name="fetch")
    async with scheduler.consumer(handlers, options=worker()):
        await discover()
    broken, slow = await scheduler.get("broken"), await scheduler.get("slow")
    assert broken is not None and broken.state is S.FAIL  # KeyError: not in retry_on
    assert broken.attempts == 1 and broken.error is not None and broken.error.type == "KeyError"
    assert slow is not None and slow.state is S.PENDING and slow.attempts == 1  # retried


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda h: h.task("x", retry_on=("ValueError",))(print), "retry_on must be exception"),
        (lambda h: h.task("")(print), "name: must be a non-empty string"),
        (lambda h: [h.add("x", print), h.add("x", print)], "'x' is registered twice"),
        (lambda h: h.add("x", 3), r"handlers\['x'\]: expected a function"),
    ],
)
def test_a_bad_registration_names_the_problem(build: Any, message: str):
    with pytest.raises(ConfigurationError, match=message):
        build(ms.Handlers())


# ------------------------------------------------------------------------ logs


async def test_failures_are_warnings_with_key_name_attempt_and_the_final_traceback(
    scheduler: ms.Scheduler, discover: Any, caplog: pytest.LogCaptureFixture
):
    async def broken(task: ms.Task) -> None:
        raise RuntimeError("smtp refused")

    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    await scheduler.publish("mail:7", None, name="email", options=options)
    with caplog.at_level(logging.WARNING, logger="mscheduler"):
        async with scheduler.consumer({"email": broken}, options=worker()):
            await discover()
            await discover()
    failures = [r for r in caplog.records if getattr(r, "key", None) == "mail:7"]
    assert [r.action for r in failures] == ["attempt_failed", "task_failed"]  # type: ignore[attr-defined]
    first, last = failures
    assert first.levelno == logging.WARNING and first.exc_info is None
    assert (first.task_name, first.attempt) == ("email", 1)  # type: ignore[attr-defined]
    assert first.error == "RuntimeError: smtp refused"  # type: ignore[attr-defined]
    assert "'mail:7' (email) attempt 1 failed, will retry: RuntimeError" in first.getMessage()
    assert last.attempt == 2 and last.exc_info is not None  # type: ignore[attr-defined]


# ------------------------------------------------------------------------ several consumers


async def test_consumers_runs_n_consumers_and_stops_them_all(
    scheduler: ms.Scheduler, discover: Any
):
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(ms.current_lease().worker_id)

    for n in range(30):
        await scheduler.publish(f"t{n}", None, name="job")
    async with scheduler.consumers({"job": job}, count=3, options=worker("box")) as group:
        assert [c.worker_id for c in group] == ["box-1", "box-2", "box-3"]
        await discover()
        await discover()
    assert len(ran) == 30 and set(ran) <= {"box-1", "box-2", "box-3"}
    assert all(c.stop_requested for c in group)
    with pytest.raises(ConfigurationError, match="count: expected an integer from 1"):
        async with scheduler.consumers({"job": job}, count=0):
            pass


async def test_a_handler_raising_cancelled_error_fails_only_its_task(
    scheduler: ms.Scheduler, discover: Discover
):
    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("weird", None, name="job", options=once)
    await scheduler.publish("fine", None, name="job")

    async def handler(task: ms.Task) -> str:
        if task.key == "weird":
            raise anyio.get_cancelled_exc_class()()  # its own, nothing cancelled it
        return "ok"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": handler}, options=options) as consumer:
        await discover()
    weird, fine = await scheduler.get("weird"), await scheduler.get("fine")
    assert weird is not None and weird.state is S.FAIL and weird.error is not None
    assert weird.error.type == "HandlerCancelled"
    assert fine is not None and fine.state is S.SUCCESS
    assert consumer.stats.failed == 1


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


class _Unserialisable(ms.TaskOptions):
    def model_dump(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("cannot dump me")


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (_self_containing(), "contains itself"),
        (_Unserialisable(), "TypeError: cannot dump me"),
        ({"n": 2**70}, "cannot be stored as BSON"),
    ],
    ids=["self-containing", "model-dump-raises", "int-overflow"],
)
async def test_an_unstorable_result_fails_only_its_task(
    scheduler: ms.Scheduler, discover: Discover, result: Any, said: str
):
    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("odd", None, name="job", options=once)
    await scheduler.publish("fine", None, name="job")

    async def handler(task: ms.Task) -> Any:
        return result if task.key == "odd" else "ok"

    options = ms.WorkerOptions(worker_id="w0", poll_interval_ms=POLL_MS)
    async with scheduler.consumer({"job": handler}, options=options):
        await discover()
    odd, fine = await scheduler.get("odd"), await scheduler.get("fine")
    assert odd is not None and odd.state is S.FAIL and odd.error is not None
    assert odd.error.type == "PayloadError" and said in odd.error.message
    assert fine is not None and fine.state is S.SUCCESS
