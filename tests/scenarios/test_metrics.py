"""The Prometheus exporter counts what consumers do and the tasks by state."""

from __future__ import annotations

import re

import pytest

import mscheduler as ms
from mscheduler.metrics import PrometheusMetrics
from tests.engines import settle

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
        await settle()
    await metrics.refresh_task_counts(scheduler)
    text = metrics.render()
    assert sample(text, 'mscheduler_claims_total{name="job"}') == 4
    assert sample(text, 'mscheduler_successes_total{name="job"}') == 2
    assert sample(text, 'mscheduler_failures_total{name="job"}') == 2
    assert sample(text, 'mscheduler_aborts_total{name="job"}') == 1
    assert sample(text, 'mscheduler_handler_seconds_count{name="job"}') == 4
    assert sample(text, 'mscheduler_tasks{name="job",state="success"}') == 2
    assert sample(text, 'mscheduler_tasks{name="other",state="pending"}') == 1
