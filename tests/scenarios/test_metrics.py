"""The Prometheus exporter counts what consumers do and the tasks by state."""

from __future__ import annotations

import re

import anyio
import pytest

import mscheduler as ms
from mscheduler.observability.prometheus import PrometheusMetrics
from mscheduler.testing import ManualClock
from tests.engines import until_idle

pytestmark = pytest.mark.anyio


def sample(text: str, metric: str) -> float:
    match = re.search(rf"^{re.escape(metric)} (\S+)$", text, re.M)
    assert match is not None, f"{metric} not in\n{text}"
    return float(match[1])


async def test_metrics_follow_the_consumer(scheduler: ms.Scheduler):
    once = ms.TaskOptions(max_unexpected_retries=0)
    for key in ("ok:1", "ok:2", "bad", "stop"):
        await scheduler.publish(key, None, name="job", options=once)
    await scheduler.publish("later", None, name="other")

    async def handler(task: ms.Task) -> None:
        if task.key == "bad":
            raise ValueError("no")
        if task.key == "stop":
            raise ms.Abort("enough")

    metrics = PrometheusMetrics()
    consumer = scheduler.consumer({"job": handler}, options=ms.WorkerOptions(worker_id="w"))
    consumer.stats.observers.append(metrics)
    async with consumer:
        await until_idle()
    await metrics.refresh_task_counts(scheduler)
    text = metrics.render()
    assert sample(text, 'mscheduler_claims_total{name="job"}') == 4
    assert sample(text, 'mscheduler_successes_total{name="job"}') == 2
    assert sample(text, 'mscheduler_failures_total{name="job"}') == 2
    assert sample(text, 'mscheduler_aborts_total{name="job"}') == 1
    assert sample(text, 'mscheduler_handler_seconds_count{name="job"}') == 4
    assert sample(text, 'mscheduler_tasks{name="job",state="success"}') == 2
    assert sample(text, 'mscheduler_tasks{name="other",state="pending"}') == 1


async def test_progress_is_in_the_metrics_as_the_handler_reports_it(
    scheduler: ms.Scheduler,
) -> None:
    """Before the coalesced write to the task (a second later at most): the count of reports
    and the last fraction, by name."""
    gate = anyio.Event()
    reported = anyio.Event()

    async def handler(task: ms.Task) -> None:
        lease = ms.current_lease()
        await lease.progress(0.25, "a quarter")
        await lease.progress(0.5, "half way")
        reported.set()
        await gate.wait()

    await scheduler.publish("long", None, name="job")
    metrics = PrometheusMetrics()
    consumer = scheduler.consumer({"job": handler}, options=ms.WorkerOptions(worker_id="w"))
    consumer.stats.observers.append(metrics)
    async with consumer:
        await until_idle()
        await reported.wait()
        text = metrics.render()
        assert sample(text, 'mscheduler_progress_reports_total{name="job"}') == 2
        assert sample(text, 'mscheduler_progress{name="job"}') == 0.5
        gate.set()


async def test_a_takeover_is_logged_and_counted(
    scheduler: ms.Scheduler, clock: ManualClock, discover, caplog: pytest.LogCaptureFixture
):
    fast = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=10_000)
    await scheduler.publish("took-over", None, name="job", options=fast)
    await scheduler.publish("fresh", None, name="job", options=fast)
    dead = await scheduler.store.tasks.claim("w-dead", key="took-over")
    assert dead is not None and dead.ping_expire_at is not None
    clock.advance(10)  # its worker died: the lease expires unpinged

    async def handler(task: ms.Task) -> None:
        return None

    metrics = PrometheusMetrics()
    options = ms.WorkerOptions(worker_id="w-new", poll_interval_ms=50)
    consumer = scheduler.consumer({"job": handler}, options=options)
    consumer.stats.observers.append(metrics)
    with caplog.at_level("INFO", logger="mscheduler"):
        async with consumer:
            await discover()
    assert (await scheduler.get("took-over")).state is ms.TaskState.SUCCESS  # type: ignore[union-attr]
    records = [r for r in caplog.records if getattr(r, "action", None) == "task_taken_over"]
    assert len(records) == 1, "one line for the takeover, none for the fresh claim"
    [record] = records
    assert record.levelname == "WARNING"
    assert (record.key, record.worker_id, record.attempt) == ("took-over", "w-new", 2)  # type: ignore[attr-defined]
    assert record.expired_worker_id == "w-dead"  # type: ignore[attr-defined]
    assert record.expired_run_id == dead.run_id  # type: ignore[attr-defined]
    assert record.lease_expired_at == dead.ping_expire_at.isoformat()  # type: ignore[attr-defined]
    assert "w-dead" in record.getMessage() and "w-new" in record.getMessage()
    assert consumer.stats.takeovers == 1
    assert sample(metrics.render(), 'mscheduler_takeovers_total{name="job"}') == 1
