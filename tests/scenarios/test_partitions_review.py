"""Adversarial probes of partitions (issue 55 item 1): ``partition_max_running`` under limit
changes and races, give-backs, and turns of tasks published anew. On every engine, with a
manual clock."""

from __future__ import annotations

from typing import Any

import pytest

import mscheduler as ms
from mscheduler.store import limits as store_limits

pytestmark = pytest.mark.anyio


def part(partition: str | None, **fields: Any) -> ms.TaskOptions:
    return ms.TaskOptions(partition=partition, **fields)


async def test_a_partition_limit_added_to_a_limited_name_counts_what_runs_already(
    scheduler: ms.Scheduler, clock: Any
):
    """A name limited already (its running tasks hold slots counted in no partition) that is
    given a ``partition_max_running``: its running tasks count in their partitions at once."""
    await scheduler.set_limit("job", max_running=10)
    await scheduler.publish_many(
        ms.TaskSpec(key=f"A{n}", name="job", options=part("A")) for n in range(3)
    )
    [running] = await scheduler.own(["job"], worker_id="w1", max_tasks=1)
    await scheduler.set_limit("job", max_running=10, partition_max_running=1)
    limit = (await scheduler.limits())["job"]
    assert store_limits.partitions_running(limit, clock.now()) == {"A": 1}
    assert await scheduler.own(["job"], worker_id="w2", max_tasks=3) == []
    await scheduler.succeed(running)
    assert len(await scheduler.own(["job"], worker_id="w2", max_tasks=3)) == 1
