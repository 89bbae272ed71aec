"""What the overview shows: each task name with its counts, pause, limits, schedules and
workers, and the tasks that ended over the last hour. Read through the Scheduler's API
(`Scheduler.browse` for the reads of a view of the queue)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ..api import Scheduler
from ..models import FinishedCount, Limit, PausedName, TaskState, WorkerInfo
from ..periodic import Schedule

STATES = [state.value for state in TaskState]
CHART_BUCKET = dt.timedelta(minutes=5)
CHART_BUCKETS = 12  # the last hour
CHART_WIDTH = 480
# The chart's two panes, in pixels from its top: successes grow up to SUCCESS_BASE, failures
# down from FAIL_TOP over FAIL_SCALE, each on its own scale; the labels go under both.
SUCCESS_BASE, FAIL_TOP, FAIL_SCALE = 62, 68, 30
CHART_HEIGHT = FAIL_TOP + FAIL_SCALE + 16
MIN_BAR = 2.0  # a count above zero stays visible, however small beside the peak


@dataclasses.dataclass
class LimitView:
    rate: int | None
    per_s: float | None
    max_running: int | None
    starts: int  # starts in the current window
    in_use: int  # slots held by running tasks
    partition_max_running: int | None = None
    busiest_partition: int = 0  # the most slots held by one partition's running tasks


@dataclasses.dataclass
class NameView:
    name: str
    counts: dict[str, int]
    running_workers: int = 0
    oldest_pending_s: float | None = None
    paused: PausedName | None = None
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
    fail_height: float  # drawn down from FAIL_TOP
    label: str


@dataclasses.dataclass
class Chart:
    bars: list[Bar]
    success: int
    fail: int
    success_peak: int
    fail_peak: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    success_base: int = SUCCESS_BASE
    fail_top: int = FAIL_TOP
    fail_scale: int = FAIL_SCALE


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
        partition_max_running=limit.partition_max_running,
        busiest_partition=limit.usage(now)["busiest_partition_running"],
    )


def _height(count: int, peak: int, scale: float) -> float:
    return 0.0 if not count else max(scale * count / peak, MIN_BAR)


def chart(finished: list[FinishedCount]) -> Chart:
    """One bar per bucket: successes up, failures down, each scaled to its own busiest bucket,
    so that 3 failures beside 290 successes are as plain as 290 failures would be (the
    counts are in each bar's label and the legend)."""
    success_peak = max((bucket.success for bucket in finished), default=0)
    fail_peak = max((bucket.fail for bucket in finished), default=0)
    slot = CHART_WIDTH / max(len(finished), 1)
    bars = []
    for n, bucket in enumerate(finished):
        success_height = _height(bucket.success, success_peak, SUCCESS_BASE)
        bars.append(
            Bar(
                x=n * slot + 2,
                width=slot - 4,
                success_y=SUCCESS_BASE - success_height,
                success_height=success_height,
                fail_height=_height(bucket.fail, fail_peak, FAIL_SCALE),
                label=f"{bucket.until:%H:%M}: {bucket.success} succeeded, {bucket.fail} failed",
            )
        )
    return Chart(
        bars=bars,
        success=sum(bucket.success for bucket in finished),
        fail=sum(bucket.fail for bucket in finished),
        success_peak=success_peak,
        fail_peak=fail_peak,
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
    for name, paused in (await scheduler.browse.paused_names()).items():
        view(name).paused = paused
    for name, limit in (await scheduler.limits()).items():
        view(name).limit = _limit_view(limit, now)
    for schedule in await scheduler.schedules():
        view(schedule.name).schedules.append(schedule)
    workers = await registered_workers(scheduler)
    for worker in workers:
        for name in worker.names if worker.alive else ():  # a dead worker serves nothing
            view(name).workers.append(worker)
    finished = await scheduler.browse.finished_counts(
        until=now, bucket=CHART_BUCKET, buckets=CHART_BUCKETS
    )
    names = [views[name] for name in sorted(views)]
    totals = {state: sum(named.counts[state] for named in names) for state in STATES}
    return Overview(names, totals, chart(finished), workers, now)
