"""A handler's progress: seen by `get`, `show` and the metrics within a second, one write a
second at most, cleared when the task ends; bad progress names the field. Every engine."""

from __future__ import annotations

import gc
import threading
import warnings
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError
from mscheduler.testing import ManualClock
from tests.engines import until_idle, worker

pytestmark = pytest.mark.anyio
S = ms.TaskState


async def test_progress_is_visible_within_a_second_coalesced_and_cleared_at_the_end(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """The first report is written at once, later ones at most once a second per task, and
    the reports of several tasks go in one write; cleared when the attempt ends."""
    gate, step = anyio.Event(), anyio.Event()
    reported: dict[str, anyio.Event] = {"a": anyio.Event(), "b": anyio.Event()}

    async def resize(task: ms.Task) -> None:
        await ms.current_lease().progress(0.1, "started")
        reported[task.key].set()
        await step.wait()
        for done in (2, 3, 4):  # a tight loop of reports: one write for them all
            await ms.current_lease().progress(done / 10, f"resized {done}0/100")
        await gate.wait()

    options = ms.TaskOptions(ping_interval_ms=30_000, worker_timeout_ms=60_000)
    for key in reported:
        await scheduler.publish(key, None, name="resize", options=options)
    async with scheduler.consumer({"resize": resize}, options=worker()) as consumer:
        await discover()
        for event in reported.values():
            await event.wait()
        await until_idle()
        for key in reported:
            task = await scheduler.get(key)
            assert task is not None and task.progress is not None, "not written at once"
            assert (task.progress.fraction, task.progress.message) == (0.1, "started")
        pings = consumer.stats.pings
        step.set()
        await until_idle()
        clock.advance(0.5)
        await until_idle()
        assert consumer.stats.pings == pings, "more than one write a second"
        clock.advance(0.5)
        await until_idle()
        assert consumer.stats.pings == pings + 1, "one write for both tasks"
        for key in reported:
            task = await scheduler.get(key)
            assert task is not None and task.progress is not None
            assert (task.progress.fraction, task.progress.message) == (0.4, "resized 40/100")
            assert task.progress.worker_id == "w1" and task.progress.at == clock.now()
        gate.set()
        await until_idle()
    for key in reported:
        task = await scheduler.get(key)
        assert task is not None and task.state is S.SUCCESS and task.progress is None


async def test_a_sync_handler_reports_progress_from_its_thread(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """The same call, without ``await``, in a plain ``def`` handler (its worker thread): the
    report is written as an async handler's is, and nothing is left unawaited."""
    reported, release = threading.Event(), threading.Event()

    def resize(task: ms.Task) -> None:
        ms.current_lease().progress(0.5, "half")
        reported.set()
        release.wait(30)  # a bound on a hang: the test sets it

    await scheduler.publish("k", None, name="resize")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        async with scheduler.consumer({"resize": resize}, options=worker()):
            await discover()
            assert await anyio.to_thread.run_sync(reported.wait, 30)
            await until_idle()
            running = await scheduler.get("k")
            release.set()
            await until_idle()
        gc.collect()  # a coroutine never awaited warns when collected
    assert running is not None and running.progress is not None, "the report was not written"
    assert (running.progress.fraction, running.progress.message) == (0.5, "half")
    assert not [w for w in warned if issubclass(w.category, RuntimeWarning)]
    done = await scheduler.get("k")
    assert done is not None and done.state is S.SUCCESS and done.progress is None


async def test_bad_progress_names_the_field(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    lease = await scheduler.store.tasks.claim("w", key="k")
    assert lease is not None
    with pytest.raises(ConfigurationError, match="progress: fraction: must be at most 1"):
        await lease.progress(1.5)
    with pytest.raises(ConfigurationError, match="progress: message: must have at most 1000"):
        await lease.progress(0.5, "x" * 1001)
    assert lease.reported_progress is None
