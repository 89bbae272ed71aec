"""Change streams as a real server serves them: oversized events, resume tokens that move on
while a stream is idle, invalidation by a drop, refusals and transient errors on opening, a
stream that stalls without an error, and the cost of a waiter's stream.

The memory backend reproduces each of these server behaviours (`backends.memory.changefeed`);
the wire engine has no change streams, so these run on memory only."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from pymongo.errors import AutoReconnect, OperationFailure

import mscheduler as ms
from mscheduler.testing import ManualClock
from tests.conftest import OpenScheduler
from tests.engines import OpenStreams, needs_change_streams, until_idle

pytestmark = pytest.mark.anyio
S = ms.TaskState


@contextlib.asynccontextmanager
async def running(sched: ms.Scheduler, ran: list[str], **options: Any) -> AsyncIterator[Any]:
    """One consumer of ``job`` that records the keys it ran."""

    async def handler(task: ms.Task) -> None:
        ran.append(task.key)

    options = {"worker_id": "w0", "reconnect_backoff_ms": 100, **options}
    consumer = sched.consumer({"job": handler}, options=ms.WorkerOptions(**options))
    async with consumer:
        await until_idle()
        yield consumer


async def test_a_large_result_does_not_stop_the_consumers_stream(
    scheduler: ms.Scheduler, engine: str
):
    """A task near the document limit succeeds with a large result: its update event carries
    the document after the write and what changed (the result again), over 16 MiB, which the
    server cannot send. It wakes consumers (its dependent is to be told), so the consumer's
    stream would fail on it at every resume; projected to what a consumer reads, it passes,
    and the dependent runs."""
    needs_change_streams(engine)
    await scheduler.publish("big", "x" * (13 * 1024 * 1024), name="job")
    await scheduler.publish("child", None, name="job", depends_on=["big"])

    async def handler(task: ms.Task) -> str:
        ran.append(task.key)
        return "r" * (1024 * 1024 - 64) if task.key == "big" else ""

    ran: list[str] = []
    options = ms.WorkerOptions(worker_id="w0", reconnect_backoff_ms=100)
    async with scheduler.consumer({"job": handler}, options=options) as consumer:
        await until_idle()
        assert ran == ["big", "child"]
        assert consumer._listener.reopened == 0


async def test_reads_failing_at_one_token_open_a_fresh_stream_and_fetch_again(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """An event too large even without what the consumer does not need fails every read from
    the token before it: after a few such failures the consumer starts afresh and fetches."""
    needs_change_streams(engine)
    feed = scheduler.collection.changes
    ran: list[str] = []
    async with running(scheduler, ran) as consumer:
        feed.max_event_bytes = 100  # every event of a task is over it
        await scheduler.publish("stuck-behind", None, name="job")
        for _ in range(4):
            await until_idle()
            clock.advance(1)
        feed.max_event_bytes = 16 * 1024 * 1024
        await until_idle()
        assert ran == ["stuck-behind"]
        assert consumer._listener.resyncs == 1


async def test_an_idle_consumer_resumes_after_the_oplog_rolled_past_its_last_event(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """Writes of other names move the consumer's resume token on (the server's post-batch
    token): when the history of its last own event is gone, it resumes without a re-fetch."""
    needs_change_streams(engine)
    feed = scheduler.collection.changes
    ran: list[str] = []
    async with running(scheduler, ran) as consumer:
        for n in range(3):
            await scheduler.publish(f"other-{n}", None, name="other")
        await until_idle()
        assert consumer._listener.resume_token == feed.last_token
        feed.inject_error(AutoReconnect("connection reset"))
        feed.forget_history()  # the oplog rolled past every event of ours
        await until_idle()
        clock.advance(0.1)
        await until_idle()
        assert consumer._listener.reopened == 1
        assert consumer._listener.resyncs == 0


async def test_watch_goes_on_after_the_collection_is_dropped(
    open_scheduler: OpenScheduler, engine: str
):
    needs_change_streams(engine)
    scheduler = await open_scheduler(notablescan=False)  # the drop takes the indexes too
    seen: list[str] = []

    async def watcher() -> None:
        async for task in scheduler.watch():
            seen.append(task.key)
            if len(seen) == 2:
                return

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(watcher)
        await until_idle()
        await scheduler.publish("before", None, name="job")
        await until_idle()
        await scheduler.collection.drop()
        await until_idle()
        await scheduler.publish("after", None, name="job")
        await until_idle()
    assert seen == ["before", "after"]


@pytest.mark.parametrize("on_database", [True, False], ids=["database-stream", "collection-stream"])
async def test_a_consumer_goes_on_after_the_collection_is_dropped_without_a_refetch(
    open_scheduler: OpenScheduler, clock: ManualClock, engine: str, on_database: bool
):
    """A stream on the database reads the drop and goes on. One on the collection (where the
    server refuses one on the database) ends with the drop's ``invalidate`` and opens again
    after that event (``startAfter``: ``resumeAfter`` is refused there). Either way nothing
    is fetched again."""
    needs_change_streams(engine)
    scheduler = await open_scheduler(notablescan=False)
    if not on_database:
        refusal = OperationFailure("not authorized on the database", code=13)
        scheduler.collection.changes.refuse_database_streams(refusal)
    ran: list[str] = []
    async with running(scheduler, ran) as consumer:
        await scheduler.collection.drop()
        await until_idle()
        await scheduler.publish("after-drop", None, name="job")
        clock.advance(0.1)
        await until_idle()
        assert ran == ["after-drop"]
        assert consumer._listener.reopened == (0 if on_database else 1)
        assert consumer._listener.resyncs == 0


@pytest.mark.parametrize("discovery", ["auto", "stream"])
async def test_a_transient_error_on_opening_is_retried_not_taken_for_a_refusal(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str, discovery: str
):
    """A mongos in an election answers 91 (ShutdownInProgress) or 189 (PrimarySteppedDown):
    the stream is tried again after a backoff, neither polled for a minute nor an error."""
    needs_change_streams(engine)
    scheduler.collection.changes.fail_opens(
        OperationFailure("shutdown in progress", code=91),
        OperationFailure("primary stepped down", code=189),
    )
    ran: list[str] = []
    consumer = scheduler.consumer(
        {"job": lambda task: ran.append(task.key)},
        options=ms.WorkerOptions(reconnect_backoff_ms=100, discovery=discovery),  # type: ignore[arg-type]
    )
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(consumer.run)
        for _ in range(3):
            await until_idle()
            clock.advance(0.2)
        await until_idle()
        assert not consumer.polling
        await scheduler.publish("k", None, name="job")
        await until_idle()
        assert ran == ["k"]
        consumer.stop()


async def test_a_stream_refused_while_running_falls_back_to_polling(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """The ``changeStream`` privilege revoked: each reopen is refused (13), so the consumer
    polls (and tries the stream again now and then) instead of retrying for ever."""
    needs_change_streams(engine)
    feed = scheduler.collection.changes
    ran: list[str] = []
    async with running(scheduler, ran, poll_interval_ms=1_000) as consumer:
        feed.fail_opens(*[OperationFailure("not authorized", code=13)] * 100)
        feed.inject_error(AutoReconnect("connection reset"))
        await until_idle()
        clock.advance(0.1)
        await until_idle()
        assert consumer.polling
        await scheduler.publish("while-polling", None, name="job")
        clock.advance(1)
        await until_idle()
        assert ran == ["while-polling"]


async def test_a_stalled_stream_is_backed_by_a_periodic_fetch(
    scheduler: ms.Scheduler, clock: ManualClock, engine: str
):
    """A stream that stays open and sends nothing (a primary without its majority): the
    backstop fetch finds the work within ``backstop_interval_ms``."""
    needs_change_streams(engine)
    ran: list[str] = []
    async with running(
        scheduler, ran, backstop_interval_ms=60_000, poll_interval_ms=5_000
    ) as consumer:
        scheduler.collection.changes.stall()
        await scheduler.publish("unannounced", None, name="job")
        await until_idle()
        assert ran == []
        for _ in range(12):
            clock.advance(5)
            await until_idle()
        assert ran == ["unannounced"]
        assert consumer._listener.backstops == 1


async def test_a_waiter_costs_no_lookup_for_updates_of_other_tasks(
    scheduler: ms.Scheduler, engine: str
):
    """A ``$match`` on the document after the write cannot be tested before the server looks
    the document up; a waiter's stream filters on what the oplog entry says (the task's
    ``_id``, a change of ``state``), so updates of other tasks cost it nothing."""
    needs_change_streams(engine)
    feed = scheduler.collection.changes
    await scheduler.publish("awaited", None, name="job")
    await scheduler.publish("busy", 0, name="job")
    found: list[ms.Task] = []

    async def waiter() -> None:
        found.append(await scheduler.wait("awaited"))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(waiter)
        await until_idle()
        before = feed.lookups
        for n in range(1, 21):
            await scheduler.publish("busy", n, name="job", update_payload=True)
        await until_idle()
        assert feed.lookups == before
        await scheduler.cancel("awaited")
        await until_idle()
    assert found[0].state is S.CANCELLED


@pytest.mark.parametrize("on_database", [True, False], ids=["database-stream", "collection-stream"])
async def test_a_process_holds_one_change_stream_and_control_changes_reach_it(
    open_scheduler: OpenScheduler,
    engine: str,
    on_database: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Consumers and a waiter of one process, and their pauses: one stream, on the database,
    carries the tasks and the control version. Where the server refuses a stream on the
    database (a role granted ``changeStream`` on the tasks collection alone), the controls
    take a second stream, said once, and a pause still holds from the next event."""
    needs_change_streams(engine)
    scheduler = await open_scheduler()
    operator = await open_scheduler()  # another process, on the same database
    if not on_database:
        refusal = OperationFailure("not authorized on mscheduler to execute command", code=13)
        scheduler.collection.changes.refuse_database_streams(refusal)
    streams = OpenStreams(scheduler)
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    await scheduler.publish("waited", None, name="other")
    consumers = scheduler.consumers({"job": job}, count=3)
    async with consumers as group, anyio.create_task_group() as task_group:
        task_group.start_soon(lambda: scheduler.wait("waited", timeout=3_600))
        await until_idle()
        await operator.pause("job")
        await until_idle()
        assert all(consumer.paused == {"job"} for consumer in group)
        await operator.publish("held", None, name="job")
        await until_idle()
        assert ran == []
        await operator.resume("job")
        await until_idle()
        assert ran == ["held"]
        task_group.cancel_scope.cancel()
    assert streams.most_at_once == (1 if on_database else 2)
    said = [r for r in caplog.records if getattr(r, "action", "") == "stream_per_collection"]
    assert len(said) == (0 if on_database else 1)


async def test_a_pause_holds_when_the_process_turns_to_polling_under_its_controls(
    open_scheduler: OpenScheduler, clock: ManualClock, engine: str
):
    """The controls ride on the process's stream; the server then refuses change streams
    (a role that lost ``changeStream``), and the process polls. The controls are told, and
    read the version themselves: a pause made then still holds."""
    needs_change_streams(engine)
    scheduler = await open_scheduler()
    operator = await open_scheduler()
    hub = scheduler.services.task_hub
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=10)
    async with scheduler.consumer({"job": job}, options=options) as consumer:
        await until_idle()
        assert hub.carries_controls
        scheduler.collection.change_streams = False
        scheduler.collection.changes.end_streams()  # reopened: refused
        for _ in range(5):  # the reconnect's backoff
            clock.advance(1)
            await until_idle()
        assert hub.polling and not hub.carries_controls
        await operator.pause("job")
        await operator.publish("held", None, name="job")
        for _ in range(10):
            clock.advance(0.05)
            await until_idle()
        assert consumer.paused == {"job"} and ran == []


async def test_polling_gives_way_to_a_collection_stream_where_the_database_is_refused(
    open_scheduler: OpenScheduler, clock: ManualClock, engine: str
):
    """A process that polls (the server refused change streams) tries the stream again
    every ``stream_retry_interval_ms``: refused on the database (13), it takes one on the
    tasks collection."""
    needs_change_streams(engine)
    scheduler = await open_scheduler(changestreams=False)
    hub = scheduler.services.task_hub
    options = ms.WorkerOptions(worker_id="w", poll_interval_ms=10, stream_retry_interval_ms=1_000)
    async with scheduler.consumer({"job": _done_handler}, options=options):
        await until_idle()
        assert hub.polling
        scheduler.collection.change_streams = True
        refusal = OperationFailure("not authorized on the database", code=13)
        scheduler.collection.changes.refuse_database_streams(refusal)
        for _ in range(3):
            clock.advance(1)
            await until_idle()
        assert not hub.polling and not hub.whole_database
        assert hub.streams_opened == 1


async def _done_handler(task: ms.Task) -> None:
    return None
