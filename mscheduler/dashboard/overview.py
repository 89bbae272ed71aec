"""What the overview shows: each task name with its counts, pause, limits, schedules and
workers, and the tasks that ended over the last hour. Read through the Scheduler's API, and
`store.browse` where the API has no such read."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ..api import Scheduler
from ..models import TaskState
from ..periodic import Schedule
from ..store import browse
from ..store.limits import Limit
from ..store.workers import WorkerInfo

STATES = [state.value for state in TaskState]
CHART_BUCKET = dt.timedelta(minutes=5)
CHART_BUCKETS = 12  # the last hour
CHART_WIDTH, CHART_HEIGHT = 480, 90


@dataclasses.dataclass
class LimitView:
    rate: int | None
    per_s: float | None
    max_running: int | None
    starts: int  # starts in the current window
    in_use: int  # slots held by running tasks


@dataclasses.dataclass
class NameView:
    name: str
    counts: dict[str, int]
    running_workers: int = 0
    oldest_pending_s: float | None = None
    paused: browse.Paused | None = None
    limit: LimitView | None = None
    schedules: list[Schedule] = dataclasses.field(default_factory=list)
    workers: list[WorkerInfo] = dataclasses.field(default_factory=list)  # the live ones

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclasses.dataclass
class Bar:
    x: float
    width: float
    success_y: float
    success_height: float
    fail_y: float
    fail_height: float
    label: str


@dataclasses.dataclass
class Chart:
    bars: list[Bar]
    success: int
    fail: int
    peak: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


@dataclasses.dataclass
class Overview:
    names: list[NameView]
    totals: dict[str, int]
    chart: Chart
    workers: list[WorkerInfo]  # every registered one, alive or dead
    now: dt.datetime


async def registered_workers(scheduler: Scheduler) -> list[WorkerInfo]:
    """Every registered worker, alive ones first, as `mscheduler workers` lists them: what
    each runs now (from the tasks), and one that died without stopping marked dead since
    when (it stays registered for a day), so the two views never disagree."""
    return await scheduler.workers()


def _limit_view(limit: Limit, now: dt.datetime) -> LimitView:
    def live(entries: list[Any]) -> int:
        return sum(1 for entry in entries if entry.until is not None and entry.until > now)

    return LimitView(
        rate=limit.rate,
        per_s=limit.per_ms / 1000 if limit.per_ms else None,
        max_running=limit.max_running,
        starts=live(limit.starts),
        in_use=live(limit.slots),
    )


def chart(finished: list[browse.Finished]) -> Chart:
    """Stacked bars (successes under failures), one per bucket, scaled to the busiest."""
    peak = max((bucket.success + bucket.fail for bucket in finished), default=0)
    slot = CHART_WIDTH / max(len(finished), 1)
    usable = CHART_HEIGHT - 14  # room for the labels under the bars
    bars = []
    for n, bucket in enumerate(finished):
        success_height = usable * bucket.success / peak if peak else 0.0
        fail_height = usable * bucket.fail / peak if peak else 0.0
        success_y = usable - success_height
        bars.append(
            Bar(
                x=n * slot + 2,
                width=slot - 4,
                success_y=success_y,
                success_height=success_height,
                fail_y=success_y - fail_height,
                fail_height=fail_height,
                label=f"{bucket.until:%H:%M}: {bucket.success} succeeded, {bucket.fail} failed",
            )
        )
    return Chart(
        bars=bars,
        success=sum(bucket.success for bucket in finished),
        fail=sum(bucket.fail for bucket in finished),
        peak=peak,
    )


async def overview(scheduler: Scheduler) -> Overview:
    now = scheduler.clock.now()
    views: dict[str, NameView] = {}

    def view(name: str) -> NameView:
        return views.setdefault(name, NameView(name, dict.fromkeys(STATES, 0)))

    for row in await scheduler.stats():
        named = view(row.name)
        named.counts[row.state.value] = row.count
        named.running_workers += row.running_workers
        if row.oldest_age_s is not None:
            named.oldest_pending_s = row.oldest_age_s
    for name, paused in (await scheduler.store.browse.paused_names()).items():
        view(name).paused = paused
    for name, limit in (await scheduler.limits()).items():
        view(name).limit = _limit_view(limit, now)
    for schedule in await scheduler.schedules():
        view(schedule.name).schedules.append(schedule)
    workers = await registered_workers(scheduler)
    for worker in workers:
        for name in worker.names if worker.alive else ():  # a dead worker serves nothing
            view(name).workers.append(worker)
    finished = await scheduler.store.browse.finished_counts(
        until=now, bucket=CHART_BUCKET, buckets=CHART_BUCKETS
    )
    names = [views[name] for name in sorted(views)]
    totals = {state: sum(named.counts[state] for named in names) for state in STATES}
    return Overview(names, totals, chart(finished), workers, now)
