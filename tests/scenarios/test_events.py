"""Task events (`Scheduler.events`): derived from the writes the process's discovery hub hears
of (a change stream on memory, a poll on the wire), in the order written for each task, from
any process's work. Every engine; a listener in another process is in
tests/acceptance/test_cli_events.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError
from mscheduler.models import TaskEvent, WorkerStateKind
from mscheduler.services.task_events import EventLog
from mscheduler.testing import ManualClock
from tests.engines import FAST, OpenStreams, until_idle, worker

pytestmark = pytest.mark.anyio
Discover = Callable[[], Awaitable[None]]


@contextlib.asynccontextmanager
async def listening(
    sched: ms.Scheduler, names: list[str] | None = None
) -> AsyncIterator[list[TaskEvent]]:
    """A listener collecting the events of ``names`` for the block, subscribed before it."""
    heard: list[TaskEvent] = []
    async with sched.events(names) as events:

        async def listen() -> None:
            async for event in events:
                heard.append(event)

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(listen)
            await until_idle()
            yield heard
            task_group.cancel_scope.cancel()


def kinds(heard: list[TaskEvent], key: str) -> list[tuple[str, Any]]:
    return [
        (event.kind, event.will_retry) if event.kind == "failed" else (event.kind, None)
        for event in heard
        if event.key == key
    ]


async def _step(clock: ManualClock, discover: Discover, seconds: float, times: int) -> None:
    for _ in range(times):
        clock.advance(seconds)
        await discover()


async def test_a_task_that_fails_once_then_succeeds_is_told_in_order(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    tries: list[int] = []

    async def flaky(task: ms.Task) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("first try fails")
        return "done"

    options = ms.TaskOptions(max_unexpected_retries=2, unexpected_retry_delay_ms=1_000, **FAST)
    async with listening(scheduler) as heard:
        async with scheduler.consumer({"job": flaky}, options=worker()):
            await discover()
            await scheduler.publish("k", {"n": 1}, name="job", options=options)
            await _step(clock, discover, 0.5, 6)
            task = await scheduler.get("k")
            assert task is not None and task.state is ms.TaskState.SUCCESS
        await _step(clock, discover, 1, 2)
    assert kinds(heard, "k") == [
        ("published", None),
        ("started", None),
        ("failed", True),
        ("started", None),
        ("succeeded", None),
    ]
    failed = next(event for event in heard if event.kind == "failed")
    assert failed.error is not None and failed.error.type == "RuntimeError"
    assert failed.worker_id == "w1" and failed.run_id is not None
    started = [event for event in heard if event.kind == "started"]
    assert started[0].run_id == failed.run_id != started[1].run_id
    succeeded = heard[-1]
    assert (succeeded.result, succeeded.run_id) == ("done", started[1].run_id)


async def test_a_cancelled_task_is_told_cancelled(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    async with listening(scheduler, ["job"]) as heard:
        await scheduler.publish("k", None, name="job")
        await discover()
        await scheduler.cancel("k", "not wanted")
        await _step(clock, discover, 0.5, 2)
    assert kinds(heard, "k") == [("published", None), ("cancelled", None)]
    assert heard[-1].error is not None and "not wanted" in heard[-1].error.message


async def test_progress_is_told_between_start_and_success(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    reported, finish = anyio.Event(), anyio.Event()

    async def resize(task: ms.Task) -> None:
        await ms.current_lease().progress(0.5, "half")
        reported.set()
        await finish.wait()

    async with (
        listening(scheduler) as heard,
        scheduler.consumer({"resize": resize}, options=worker()),
    ):
        await discover()
        await scheduler.publish("k", None, name="resize", options=ms.TaskOptions(**FAST))
        await _step(clock, discover, 0.5, 2)
        await reported.wait()
        await _step(clock, discover, 0.5, 2)
        finish.set()
        await _step(clock, discover, 0.5, 2)
    assert kinds(heard, "k") == [
        ("published", None),
        ("started", None),
        ("progress", None),
        ("succeeded", None),
    ]
    progress = heard[2].progress
    assert progress is not None and (progress.fraction, progress.message) == (0.5, "half")


async def test_events_of_other_names_are_not_told(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    async with listening(scheduler, ["job"]) as heard:
        await scheduler.publish("other", None, name="other")
        await scheduler.publish("k", None, name="job")
        await _step(clock, discover, 0.5, 2)
    assert [(event.kind, event.key) for event in heard] == [("published", "k")]


async def test_a_listener_opens_no_stream_beside_the_consumers(
    scheduler: ms.Scheduler, engine: str, discover: Discover
) -> None:
    """The events share the process's hub: on memory one stream is open at once (the
    consumer's, reopened wider for them)."""
    if engine != "memory":
        pytest.skip("counts the memory engine's streams")
    streams = OpenStreams(scheduler)

    async def handler(task: ms.Task) -> None:
        return None

    async with scheduler.consumer({"job": handler}, options=worker()):
        await discover()
        async with listening(scheduler) as heard:
            await scheduler.publish("k", None, name="job")
            await discover()
            await discover()
    assert [event.kind for event in heard] == ["published", "started", "succeeded"]
    assert streams.most_at_once == 1


async def test_a_listener_alone_keeps_one_stream_open_for_its_block(
    scheduler: ms.Scheduler, engine: str
) -> None:
    """``async with`` holds the hub: no consumer in the process, and one stream for all."""
    if engine != "memory":
        pytest.skip("counts the memory engine's streams")
    streams = OpenStreams(scheduler)
    async with listening(scheduler) as heard:
        for n in range(5):
            await scheduler.publish(f"k{n}", None, name="job")
            await until_idle()
    assert [event.key for event in heard] == [f"k{n}" for n in range(5)]
    assert streams.opened == 1


async def test_events_iterated_bare_tell_the_same_in_order(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    """Without ``async with``: subscribed from the first step to the close, the listener
    serving the hub itself while it waits (alone in the process here)."""
    heard: list[TaskEvent] = []
    async with contextlib.aclosing(scheduler.events(["job"])) as events:

        async def listen() -> None:
            async for event in events:
                heard.append(event)

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(listen)
            await until_idle()
            await scheduler.publish("k", None, name="job", options=ms.TaskOptions(**FAST))
            await _step(clock, discover, 0.5, 2)
            lease = await scheduler.store.tasks.claim("w1", key="k")
            assert lease is not None
            await _step(clock, discover, 0.5, 2)
            await scheduler.store.tasks.succeed(lease, 7)
            await _step(clock, discover, 0.5, 2)
            task_group.cancel_scope.cancel()
    assert [(event.kind, event.result) for event in heard] == [
        ("published", None),
        ("started", None),
        ("succeeded", 7),
    ]
    assert scheduler.services.task_hub.subscribers == 0


def _version(task: ms.Task, **fields: Any) -> ms.Task:
    return task.model_copy(update={"version": task.version + 1, **fields})


async def test_a_missed_version_is_told_from_the_newest(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """As a poll sees it: the task published, failed once and running again, in one read;
    then a replay of an older version, which tells nothing."""
    options = ms.TaskOptions(max_unexpected_retries=2, unexpected_retry_delay_ms=0, **FAST)
    log = EventLog(clock.now())
    published = (await scheduler.publish("k", None, name="job", options=options)).task
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    await scheduler.store.tasks.fail(lease, RuntimeError("boom"))
    clock.advance(1)
    again = await scheduler.store.tasks.claim("w2", key="k")
    assert again is not None
    newest = await scheduler.get("k")
    assert newest is not None
    told = log.take(newest)
    assert [(event.kind, event.worker_id) for event in told] == [
        ("published", None),
        ("started", "w1"),
        ("failed", "w1"),
        ("started", "w2"),
    ]
    assert told[2].will_retry is True
    assert log.take(published) == []
    assert log.take(newest) == []


async def test_a_listener_started_later_tells_only_what_came_after(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(**FAST))
    clock.advance(1)
    log = EventLog(clock.now())
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    task = await scheduler.get("k")
    assert task is not None
    assert [event.kind for event in log.take(task)] == ["started"]


async def test_a_bad_poll_interval_is_refused_at_once(scheduler: ms.Scheduler) -> None:
    with pytest.raises(ConfigurationError, match="poll_interval_ms"):
        scheduler.events(poll_interval_ms=0)


async def test_an_expired_lease_is_a_failed_attempt_before_the_next_start(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """The worker stopped pinging: the next claim marks its attempt ``timeout`` in the same
    write as its own start, told in that order."""
    log = EventLog(clock.now())
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(**FAST))
    assert (await scheduler.store.tasks.claim("w1", key="k")) is not None
    running = await scheduler.get("k")
    assert running is not None
    assert [event.kind for event in log.take(running)] == ["published", "started"]
    clock.advance(FAST["worker_timeout_ms"] / 1000 + 1)
    assert (await scheduler.store.tasks.claim("w2", key="k")) is not None
    again = await scheduler.get("k")
    assert again is not None
    told = log.take(again)
    assert [(e.kind, e.worker_id, e.will_retry) for e in told] == [
        ("failed", "w1", True),
        ("started", "w2", None),
    ]
    assert told[0].error is not None


async def test_a_last_failure_is_told_once_without_retry(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    log = EventLog(clock.now())
    options = ms.TaskOptions(max_unexpected_retries=0, **FAST)
    await scheduler.publish("k", None, name="job", options=options)
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    await scheduler.store.tasks.fail(lease, RuntimeError("boom"))
    failed = await scheduler.get("k")
    assert failed is not None and failed.state is ms.TaskState.FAIL
    assert [(e.kind, e.will_retry) for e in log.take(failed)] == [
        ("published", None),
        ("started", None),
        ("failed", False),
    ]


async def test_a_task_of_two_workers_that_fails_for_good_is_told_failed_once(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Discover
) -> None:
    """Two attempts at once, no retry: the first failure ends the task, and the other
    attempt is given back, not failed. One end, one ``failed``: final, by the attempt that
    failed; the attempt given back tells nothing."""
    options = ms.TaskOptions(concurrent_worker_cnt=2, max_unexpected_retries=0, **FAST)
    async with listening(scheduler, ["job"]) as heard:
        await scheduler.publish("k", None, name="job", options=options)
        first = await scheduler.store.tasks.claim("w1", key="k")
        second = await scheduler.store.tasks.claim("w2", key="k")
        assert first is not None and second is not None
        await _step(clock, discover, 0.5, 2)
        await scheduler.store.tasks.fail(first, RuntimeError("boom"))
        await _step(clock, discover, 0.5, 2)
    task = await scheduler.get("k")
    assert task is not None and task.state is ms.TaskState.FAIL
    assert [ws.state for ws in task.worker_states] == [
        WorkerStateKind.FAIL,
        WorkerStateKind.RELEASED,
    ]
    assert kinds(heard, "k") == [
        ("published", None),
        ("started", None),
        ("started", None),
        ("failed", False),
    ]
    failed = heard[-1]
    assert (failed.worker_id, failed.run_id) == ("w1", first.run_id)
    assert failed.error is not None and failed.error.type == "RuntimeError"


async def test_the_failure_that_ended_the_task_is_the_final_one_whatever_the_claim_order(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """As a poll may see it, in one read: the second attempt failed first (a retry left),
    then the first attempt's failure ended the task. The later failure is the final one,
    told as the task's end, after every attempt's own events."""
    options = ms.TaskOptions(concurrent_worker_cnt=2, max_unexpected_retries=1, **FAST)
    log = EventLog(clock.now())
    await scheduler.publish("k", None, name="job", options=options)
    first = await scheduler.store.tasks.claim("w1", key="k")
    second = await scheduler.store.tasks.claim("w2", key="k")
    assert first is not None and second is not None
    clock.advance(0.5)
    await scheduler.store.tasks.fail(second, RuntimeError("second"))
    clock.advance(0.5)
    await scheduler.store.tasks.fail(first, RuntimeError("first"))
    failed = await scheduler.get("k")
    assert failed is not None and failed.state is ms.TaskState.FAIL
    told = [(e.kind, e.worker_id, e.will_retry) for e in log.take(failed)]
    assert told == [
        ("published", None, None),
        ("started", "w1", None),
        ("started", "w2", None),
        ("failed", "w2", True),
        ("failed", "w1", False),
    ]


async def test_a_lease_that_expired_on_the_last_try_is_the_final_failure(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """No retry left and the worker stopped pinging: the next write (here a claim) ends its
    attempt ``timeout`` and the task failed, told once, by that attempt."""
    log = EventLog(clock.now())
    options = ms.TaskOptions(max_unexpected_retries=0, **FAST)
    await scheduler.publish("k", None, name="job", options=options)
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    clock.advance(FAST["worker_timeout_ms"] / 1000 + 1)
    await scheduler.store.tasks.claim("w2", key="k")
    failed = await scheduler.get("k")
    assert failed is not None and failed.state is ms.TaskState.FAIL
    told = [(e.kind, e.worker_id, e.will_retry) for e in log.take(failed)]
    assert [event for event in told if event[0] == "failed"] == [("failed", "w1", False)]


async def test_tries_run_out_on_an_attempt_given_back_is_the_tasks_own_failure(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """A failed attempt with a retry left, then the last try allowed given back: the failure
    was not the end (``will_retry``), and the task's end is told once, with its own error."""
    log = EventLog(clock.now())
    options = ms.TaskOptions(max_tries=2, max_unexpected_retries=5, **FAST)
    await scheduler.publish("k", None, name="job", options=options)
    first = await scheduler.store.tasks.claim("w1", key="k")
    assert first is not None
    await scheduler.store.tasks.fail(first, RuntimeError("boom"))
    clock.advance(60)
    second = await scheduler.store.tasks.claim("w2", key="k")
    assert second is not None
    await scheduler.store.tasks.retry_later(second, 0)
    failed = await scheduler.get("k")
    assert failed is not None and failed.state is ms.TaskState.FAIL
    told = log.take(failed)
    assert [(e.kind, e.worker_id, e.will_retry) for e in told if e.kind == "failed"] == [
        ("failed", "w1", True),
        ("failed", "w2", False),
    ]
    assert told[-1].error == failed.error and told[-1].error != told[-2].error


async def test_a_forgotten_task_is_not_told_again(
    scheduler: ms.Scheduler, clock: ManualClock
) -> None:
    """Past what a listener remembers, the task written least recently is forgotten; its
    next write tells only what came after its last one seen."""
    log = EventLog(clock.now(), remembered=1)
    options = ms.TaskOptions(**FAST)
    await scheduler.publish("a", None, name="job", options=options)
    first = await scheduler.get("a")
    assert first is not None
    assert [e.kind for e in log.take(first)] == ["published"]
    clock.advance(1)
    await scheduler.publish("b", None, name="job", options=options)
    other = await scheduler.get("b")
    assert other is not None
    assert [e.kind for e in log.take(other)] == ["published"]  # "a" forgotten
    clock.advance(1)
    assert (await scheduler.store.tasks.claim("w1", key="a")) is not None
    claimed = await scheduler.get("a")
    assert claimed is not None
    assert [e.kind for e in log.take(claimed)] == ["started"]
