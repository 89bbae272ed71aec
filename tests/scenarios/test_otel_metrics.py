"""OpenTelemetry metrics: the Prometheus exporter's figures through the metrics API, on both
engines (the SDK's in-memory reader, `tests.otel`). Each test uses task names of its own, as
the reader is the session's."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

import mscheduler as ms
from mscheduler.testing import ManualClock
from tests import otel
from tests.engines import POLL_MS

pytestmark = pytest.mark.anyio
Discover = Callable[[], Awaitable[None]]


def points(metric: str, **attributes: Any) -> list[Any]:
    """The data points of ``metric`` whose attributes include ``attributes``."""
    found = []
    data = otel.METRICS.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for each in scope.metrics:
                if each.name != metric:
                    continue
                for point in each.data.data_points:
                    if attributes.items() <= dict(point.attributes or {}).items():
                        found.append(point)
    return found


def total(metric: str, **attributes: Any) -> float:
    return sum(point.value for point in points(metric, **attributes))


def options(worker_id: str = "w1") -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id=worker_id, poll_interval_ms=POLL_MS)


async def test_runs_are_counted_by_outcome_and_timed_and_claims_by_latency(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock
):
    otel.install()
    name = f"job-{uuid.uuid4().hex[:8]}"

    async def handler(task: ms.Task) -> None:
        if task.payload["fail"]:
            raise ms.Abort("bad input")

    await scheduler.publish("ok", {"fail": False}, name=name)
    await scheduler.publish("bad", {"fail": True}, name=name)
    clock.advance(2)  # both wait two seconds for a worker
    async with scheduler.consumer({name: handler}, options=options()):
        await discover()
    key = "messaging.destination.name"
    assert total("mscheduler.task.claims", **{key: name}) == 2
    outcome = "mscheduler.run.outcome"
    assert total("mscheduler.task.finished", **{key: name, outcome: "success"}) == 1
    assert total("mscheduler.task.finished", **{key: name, outcome: "fail"}) == 1
    durations = points("mscheduler.task.duration", **{key: name})
    assert sorted(p.attributes[outcome] for p in durations) == ["fail", "success"]
    assert [p.count for p in durations] == [1, 1]
    [latency] = points("mscheduler.task.claim_latency", **{key: name})
    assert (latency.count, latency.sum) == (2, 4.0)


async def test_takeovers_are_counted(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock
):
    otel.install()
    name = f"job-{uuid.uuid4().hex[:8]}"
    fast = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=10_000)
    await scheduler.publish("k", None, name=name, options=fast)
    assert await scheduler.store.tasks.claim("w-dead", key="k") is not None
    clock.advance(10)

    async def handler(task: ms.Task) -> None:
        return None

    async with scheduler.consumer({name: handler}, options=options()):
        await discover()
    key = "messaging.destination.name"
    assert total("mscheduler.task.takeovers", **{key: name}) == 1
    # The pull API's claims are counted too.
    await scheduler.publish("owned", None, name=name, options=fast)
    assert await scheduler.store.tasks.claim("w-dead", key="owned") is not None
    clock.advance(10)
    [lease] = await scheduler.own([name], worker_id="w-puller")
    assert lease.key == "owned"
    assert total("mscheduler.task.takeovers", **{key: name}) == 2


async def test_task_counts_by_name_and_state_once_a_reader_collects(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock
):
    otel.install()
    name = f"idle-{uuid.uuid4().hex[:8]}"
    for n in range(3):
        await scheduler.publish(f"{name}:{n}", None, name=name)
    collection = scheduler.collection.full_name
    gauge = "mscheduler.tasks"
    points(gauge)  # a reader collects: the consumers' next housekeeping refreshes the counts
    async with scheduler.consumer({"other": lambda task: None}, options=options()):
        await discover()
        assert (
            total(
                gauge,
                **{
                    "mscheduler.collection": collection,
                    "mscheduler.task.state": "pending",
                    "messaging.destination.name": name,
                },
            )
            == 3
        )
        await scheduler.publish(f"{name}:3", None, name=name)
        clock.advance(ms.WorkerOptions().schedule_refresh_ms / 1000)  # the next housekeeping
        await discover()
        assert (
            total(
                gauge, **{"mscheduler.collection": collection, "messaging.destination.name": name}
            )
            == 4
        )


async def test_progress_reports_and_the_last_fraction_as_reported(
    scheduler: ms.Scheduler, discover: Discover
) -> None:
    otel.install()
    name = f"slow-{uuid.uuid4().hex[:8]}"
    gate = anyio.Event()

    async def handler(task: ms.Task) -> None:
        await ms.current_lease().progress(0.75, "nearly")
        await gate.wait()

    await scheduler.publish("slow", None, name=name)
    async with scheduler.consumer({name: handler}, options=options()):
        await discover()
        key = "messaging.destination.name"
        assert total("mscheduler.task.progress_reports", **{key: name}) == 1
        assert total("mscheduler.task.progress", **{key: name}) == 0.75
        gate.set()
