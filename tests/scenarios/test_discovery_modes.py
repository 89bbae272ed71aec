"""How consumers and waiters find work: ``WorkerOptions.discovery`` = auto | stream | poll.

A server refuses change streams for many reasons, with many codes (a standalone mongod:
40573; the wire engine: no code at all); ``auto`` polls on any refusal, says so once, and
takes the stream back when the server offers it again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.backends.memory import memory_server
from mscheduler.errors import ConfigurationError
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, until_idle

pytestmark = pytest.mark.anyio
OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]


async def _done(task: ms.Task) -> str:
    return "done"


def _options(**fields: Any) -> ms.WorkerOptions:
    return ms.WorkerOptions(**{"worker_id": "w0", "poll_interval_ms": POLL_MS, **fields})


def _leaf_errors(error: BaseException) -> list[BaseException]:
    inner_errors = getattr(error, "exceptions", None)  # an exception group (3.10: backport)
    if inner_errors is None:
        return [error]
    return [leaf for inner in inner_errors for leaf in _leaf_errors(inner)]


async def test_auto_polls_with_one_warning_naming_the_servers_refusal(
    open_scheduler: OpenScheduler, clock: ManualClock, caplog: pytest.LogCaptureFixture
):
    sched = await open_scheduler(changestreams=False)  # the wire engine refuses by itself
    caplog.set_level(logging.WARNING, logger="mscheduler")
    async with sched.consumer({"job": _done}, options=_options()) as consumer:
        assert consumer.polling
        await sched.publish("k", None, name="job")
        await until_idle()
        clock.advance(POLL_MS / 1000)
        await until_idle()
    task = await sched.get("k")
    assert task is not None and task.state is ms.TaskState.SUCCESS
    refusals = [r for r in caplog.records if "refused to open a change stream" in r.message]
    assert len(refusals) == 1
    assert "$changeStream" in refusals[0].message  # the server's own words, whatever the code


async def test_stream_discovery_fails_loudly_when_refused(open_scheduler: OpenScheduler):
    sched = await open_scheduler(changestreams=False)
    consumer = sched.consumer({"job": _done}, options=_options(discovery="stream"))
    with pytest.raises(BaseException) as raised:
        async with consumer:
            pass
    errors = _leaf_errors(raised.value)
    assert any(isinstance(e, ConfigurationError) and "discovery" in str(e) for e in errors), errors


async def test_poll_discovery_never_opens_a_stream(clock: ManualClock):
    counted = CountingCollection(memory_server("").collection("db", "poll_only"))
    sched = ms.Scheduler(counted, clock=clock)
    async with sched.consumer({"job": _done}, options=_options(discovery="poll")) as consumer:
        assert consumer.polling
        await sched.publish("k", None, name="job")
        await until_idle()
        clock.advance(POLL_MS / 1000)
        await until_idle()
    assert counted.counts["watch"] == 0
    assert (await sched.get("k")).state is ms.TaskState.SUCCESS  # type: ignore[union-attr]


async def test_auto_takes_the_stream_back_when_the_server_offers_it(clock: ManualClock):
    collection = memory_server("").collection("db", "comes_back", change_streams=False)
    sched = ms.Scheduler(collection, clock=clock)
    options = _options(stream_retry_interval_ms=60_000, poll_interval_ms=3_600_000)
    async with sched.consumer({"job": _done}, options=options) as consumer:
        assert consumer.polling
        await until_idle()
        collection.change_streams = True  # e.g. the replica set was initiated
        clock.advance(60)
        await until_idle()
        assert not consumer.polling
        await sched.publish("k", None, name="job")
        await until_idle()  # no poll for an hour: the stream delivered it
        assert (await sched.get("k")).state is ms.TaskState.SUCCESS  # type: ignore[union-attr]


async def test_wait_follows_the_same_rule(open_scheduler: OpenScheduler):
    sched = await open_scheduler(changestreams=False)
    await sched.publish("k", None, name="job")
    with pytest.raises(ConfigurationError, match="discovery"):
        await sched.wait("k", timeout=1, discovery="stream")
    with pytest.raises(ConfigurationError, match="discovery: 'sometimes'"):
        await sched.wait("k", timeout=1, discovery="sometimes")  # type: ignore[arg-type]
    await sched.cancel("k")
    assert (await sched.wait("k", timeout=1, discovery="poll")).state is ms.TaskState.CANCELLED


def test_discovery_option_is_validated():
    with pytest.raises(ValueError, match="discovery"):
        ms.WorkerOptions(discovery="sometimes")  # type: ignore[arg-type]


async def test_a_polling_waiter_leaves_the_consumers_on_the_stream(clock: ManualClock) -> None:
    """A waiter that asked to poll runs the process's hub when a consumer joins it: the
    consumer, which asked for a stream, gets one (the hub streams as soon as one of its
    subscribers wants to), rather than polling while the waiter waits, or failing."""
    sched = await ms.Scheduler.connect("memory://", clock=clock)
    await sched.publish("waited", None, name="other")
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(
            functools.partial(sched.wait, "waited", discovery="poll", poll_interval_ms=3_600_000)
        )
        await until_idle()
        assert sched.services.task_hub.polling
        options = _options(discovery="stream", poll_interval_ms=3_600_000)
        async with sched.consumer({"job": _done}, options=options) as consumer:
            await until_idle()
            assert not consumer.polling
            await sched.publish("k", None, name="job")
            await until_idle()  # no poll for an hour: the stream delivered it
            assert (await sched.get("k")).state is ms.TaskState.SUCCESS  # type: ignore[union-attr]
        task_group.cancel_scope.cancel()
