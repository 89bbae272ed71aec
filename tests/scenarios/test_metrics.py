"""The Prometheus exporter counts what consumers do and the tasks by state."""

from __future__ import annotations

import re

import anyio
import pytest

import mscheduler as ms
from mscheduler.observability.prometheus import PrometheusMetrics
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
