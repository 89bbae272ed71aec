"""Periodic tasks: schedules whose occurrences any consumer publishes, once each
however many do, on every engine with the manual clock; cron across daylight-saving changes."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError
from mscheduler.periodic import Schedule, due
from mscheduler.specs import new_schedule
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS

pytestmark = pytest.mark.anyio
UTC = dt.timezone.utc
S = ms.TaskState


def worker(n: int = 0, **fields: Any) -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id=f"w{n}", poll_interval_ms=POLL_MS, **fields)


async def tasks_of(sched: ms.Scheduler, name: str) -> list[ms.Task]:
    return sorted(await sched.list_tasks(name=name, limit=1000), key=lambda t: t.key)


# ------------------------------------------------------------------------ occurrences (pure)


def make(now: dt.datetime, **fields: Any) -> Schedule:
    return new_schedule("report", name="report", now=now, **fields)


def test_cron_follows_the_timezone_across_daylight_saving():
    """03:00 in Paris is 02:00 UTC in winter and 01:00 UTC in summer; 02:30 does not exist
    on the night clocks go forward, and runs at the change, as cron does."""
    friday = dt.datetime(2030, 3, 29, 12, 0, tzinfo=UTC)
    nightly = make(friday, cron="0 3 * * *", timezone="Europe/Paris")
    times = [nightly.next_at]
    for _ in range(2):
        times.append(nightly.after(times[-1]))
    assert [t.isoformat() for t in times] == [
        "2030-03-30T02:00:00+00:00",
        "2030-03-31T01:00:00+00:00",
        "2030-04-01T01:00:00+00:00",
    ]
    skipped = make(friday, cron="30 2 * * *", timezone="Europe/Paris")
    assert skipped.after(skipped.next_at).isoformat() == "2030-03-31T01:00:00+00:00"
    assert nightly.key_of(times[1]) == "report@20300331T010000Z"


@pytest.mark.parametrize(
    ("catch_up", "published"),
    [("latest", ["00:50"]), ("all", ["00:10", "00:20", "00:30", "00:40", "00:50"]), ("none", [])],
)
def test_catch_up_after_downtime(catch_up: str, published: list[str]):
    start = dt.datetime(2030, 1, 1, tzinfo=UTC)
    every = make(start, every=dt.timedelta(minutes=10), catch_up=catch_up)
    back = start + dt.timedelta(minutes=55)  # down from 00:05 to 00:55
    occurrences, next_at = due(every, back)
    assert [o.strftime("%H:%M") for o in occurrences] == published
    assert next_at == start + dt.timedelta(hours=1)
    # "none" still runs an occurrence found less than a minute late.
    on_time, _ = due(
        make(start, every=dt.timedelta(minutes=10), catch_up="none"),
        start.replace(minute=10, second=30),
    )
    assert [o.strftime("%H:%M") for o in on_time] == ["00:10"]


def test_jitter_is_the_same_for_every_worker_and_within_bounds():
    start = dt.datetime(2030, 1, 1, tzinfo=UTC)
    jittered = make(start, every=dt.timedelta(hours=1), jitter=dt.timedelta(seconds=30))
    starts = [jittered.start_of(start + dt.timedelta(hours=h)) for h in range(1, 40)]
    assert all(
        0 <= (s - (start + dt.timedelta(hours=h))).total_seconds() <= 30
        for h, s in enumerate(starts, 1)
    )
    assert len({s.second for s in starts}) > 1, "every occurrence got the same delay"
    assert jittered.start_of(start) == jittered.start_of(start)


# ------------------------------------------------------------------------ on the engines


async def test_many_consumers_run_each_occurrence_once(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    ran: list[str] = []

    async def report(task: ms.Task) -> None:
        ran.append(task.key)

    await scheduler.schedule(
        "hourly", name="report", every=dt.timedelta(hours=1), payload={"kind": "sales"}
    )
    async with scheduler.consumers({"report": report}, count=4, options=worker()):
        for _ in range(3):
            clock.advance(3600)
            await discover()
            await discover()
    tasks = await tasks_of(scheduler, "report")
    assert [t.key for t in tasks] == [
        "hourly@20300101T010000Z",
        "hourly@20300101T020000Z",
        "hourly@20300101T030000Z",
    ]
    assert sorted(ran) == [t.key for t in tasks], "an occurrence ran twice or not at all"
    assert all(t.payload == {"kind": "sales"} and t.state is S.SUCCESS for t in tasks)


async def test_workers_publishing_the_same_occurrence_at_once_make_one_task(
    open_scheduler: Any, clock: ManualClock
):
    first = await open_scheduler()
    others = [await open_scheduler() for _ in range(4)]  # the same collection
    await first.schedule("tick", name="tick", every=dt.timedelta(minutes=1))
    clock.advance(60)
    results: list[Any] = []

    async def publish(sched: ms.Scheduler) -> None:
        results.extend(await sched.store.schedules.publish_due(["tick"]))

    async with anyio.create_task_group() as group:
        for sched in [first, *others]:
            group.start_soon(publish, sched)
    assert [t.key for t in await tasks_of(first, "tick")] == ["tick@20300101T000100Z"]
    assert sum(result.created for result in results) == 1


async def test_skip_if_running_starts_no_occurrence_while_the_last_one_runs(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    gate = anyio.Event()
    options = ms.TaskOptions(ping_interval_ms=20_000, worker_timeout_ms=600_000)

    async def slow(task: ms.Task) -> None:
        await gate.wait()

    await scheduler.schedule(
        "sync", name="sync", every=dt.timedelta(minutes=1), skip_if_running=True, options=options
    )
    async with scheduler.consumers({"sync": slow}, count=2, options=worker()):
        for _ in range(3):  # 00:01 starts; 00:02 and 00:03 are skipped
            clock.advance(60)
            await discover()
        assert [t.key for t in await tasks_of(scheduler, "sync")] == ["sync@20300101T000100Z"]
        gate.set()
        await discover()
        clock.advance(60)
        await discover()
        await discover()
    keys = [t.key for t in await tasks_of(scheduler, "sync")]
    assert keys == ["sync@20300101T000100Z", "sync@20300101T000400Z"]


async def test_a_schedule_added_or_removed_while_consumers_run_holds_at_once(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """Within one change event (one poll interval without change streams), not at the next
    ``schedule_refresh_ms``."""
    ran: list[str] = []

    async def job(task: ms.Task) -> None:
        ran.append(task.key)

    options = [worker(n, schedule_refresh_ms=3_600_000) for n in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        for each in options:
            await stack.enter_async_context(scheduler.consumer({"job": job}, options=each))
        await scheduler.schedule("soon", name="job", every=dt.timedelta(seconds=10))
        await discover()  # the consumers know it now
        clock.advance(10)
        await discover()
        await discover()
        assert ran == ["soon@20300101T000010Z"]
        assert await scheduler.unschedule("soon")
        await discover()
        clock.advance(10)
        await discover()
        await discover()
    assert ran == ["soon@20300101T000010Z"], "a removed schedule still ran"


async def test_schedules_are_listed_replaced_and_removed(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.schedule("a", name="job", cron="*/5 * * * *")
    await scheduler.schedule("b", name="other", every=dt.timedelta(minutes=1))
    await scheduler.schedule("a", name="job", cron="0 * * * *", timezone="Asia/Tokyo")
    listed = await scheduler.schedules()
    assert [(s.id, s.cron) for s in listed] == [("a", "0 * * * *"), ("b", None)]
    assert listed[0].timezone == "Asia/Tokyo"
    assert [s.id for s in await scheduler.schedules(names=["other"])] == ["b"]
    assert await scheduler.unschedule("a") is True
    assert await scheduler.unschedule("a") is False
    assert [s.id for s in await scheduler.schedules()] == ["b"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"cron": "61 * * * *"},
            "cron: '61 \\* \\* \\* \\*' is not a cron expression",
        ),
        ({"every": dt.timedelta(minutes=1), "timezone": "Mars/Base"}, "timezone: .*IANA"),
        ({}, "schedule: give either cron or every"),
        (
            {"cron": "* * * * *", "every": dt.timedelta(minutes=1)},
            "schedule: give either cron or every",
        ),
        ({"every": "5m"}, "every: expected a timedelta, got str"),
        ({"every": dt.timedelta(minutes=1), "jitter": 5}, "jitter: expected a timedelta, got int"),
        ({"every": dt.timedelta(milliseconds=10)}, "every_ms"),
        (
            {
                "every": dt.timedelta(minutes=1),
                "options": ms.TaskOptions(not_before=dt.datetime(2031, 1, 1, tzinfo=UTC)),
            },
            "options.not_before",
        ),
        ({"every": dt.timedelta(minutes=1), "catch_up": "some"}, "catch_up"),
    ],
)
async def test_a_bad_schedule_names_the_field_and_writes_nothing(
    scheduler: ms.Scheduler, fields: dict[str, Any], message: str
):
    """Each refusal starts with the field it is about, once."""
    with pytest.raises(ConfigurationError, match=f"^{message}"):
        await scheduler.schedule("s", name="job", **fields)
    every = dt.timedelta(minutes=1)
    with pytest.raises(ConfigurationError, match=r"^schedule_id: must not contain '@'"):
        await scheduler.schedule("a@b", name="job", every=every)
    with pytest.raises(ConfigurationError, match=r"^schedule_id: must be a non-empty string"):
        await scheduler.schedule(" ", name="job", every=every)
    assert await scheduler.schedules() == []


# ------------------------------------------------------------------------ registering again


async def test_registering_an_unchanged_schedule_at_start_up_catches_up_every_missed_one(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    """As `examples/periodic.py` does: every start registers the schedules again."""
    ran: list[str] = []

    async def tick(task: ms.Task) -> None:
        ran.append(task.key.split("@")[1])

    async def start_up() -> None:
        await scheduler.schedule(
            "tick", name="tick", every=dt.timedelta(seconds=10), catch_up="all"
        )

    await start_up()
    async with scheduler.consumer({"tick": tick}, options=worker()):
        clock.advance(10)
        await discover()
        await discover()
    assert ran == ["20300101T000010Z"]
    clock.advance(60)  # down for a minute: six occurrences missed
    before = await scheduler.schedules()
    await start_up()
    assert await scheduler.schedules() == before, "an unchanged schedule was written"
    async with scheduler.consumer({"tick": tick}, options=worker()):
        await discover()
        await discover()
    missed = ["000020", "000030", "000040", "000050", "000100", "000110"]
    assert ran == [f"20300101T{time}Z" for time in ["000010", *missed]]


async def test_registering_again_keeps_skip_if_running_from_overlapping(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    gate = anyio.Event()
    options = ms.TaskOptions(ping_interval_ms=20_000, worker_timeout_ms=600_000)

    async def slow(task: ms.Task) -> None:
        await gate.wait()

    async def register(payload: Any) -> None:
        await scheduler.schedule(
            "sync",
            name="sync",
            every=dt.timedelta(minutes=1),
            skip_if_running=True,
            options=options,
            payload=payload,
        )

    await register(None)
    async with scheduler.consumers({"sync": slow}, count=2, options=worker()):
        clock.advance(60)  # 00:01 starts and runs on
        await discover()
        await register(None)  # another worker starting up, unchanged
        await register({"v": 2})  # and one with a new payload
        clock.advance(60)  # 00:02: skipped, 00:01 still runs
        await discover()
        assert [t.key for t in await tasks_of(scheduler, "sync")] == ["sync@20300101T000100Z"]
        gate.set()
        await discover()
        clock.advance(60)
        await discover()
        await discover()
    tasks = await tasks_of(scheduler, "sync")
    assert [t.key for t in tasks] == ["sync@20300101T000100Z", "sync@20300101T000300Z"]
    assert [t.payload for t in tasks] == [None, {"v": 2}]


async def test_registering_again_keeps_an_every_schedules_anchor(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any
):
    ran: list[str] = []

    async def beat(task: ms.Task) -> None:
        ran.append(task.key.split("@")[1])

    await scheduler.schedule("beat", name="beat", every=dt.timedelta(seconds=10))
    clock.advance(2)
    await scheduler.schedule("beat", name="beat", every=dt.timedelta(seconds=10))
    clock.advance(1)
    # A new period keeps the phase: every 20 s from the same anchor, from the next one on.
    await scheduler.schedule("beat", name="beat", every=dt.timedelta(seconds=20))
    async with scheduler.consumer({"beat": beat}, options=worker()):
        for _ in range(5):
            clock.advance(10)
            await discover()
            await discover()
    assert ran == ["20300101T000020Z", "20300101T000040Z"]
    (listed,) = await scheduler.schedules()
    assert listed.anchor == dt.datetime(2030, 1, 1, tzinfo=UTC)
    assert listed.every_ms == 20_000 and listed.last_key == "beat@20300101T000040Z"


async def test_a_new_cron_applies_from_the_first_occurrence_not_yet_handled(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.schedule("report", name="report", cron="0 * * * *", catch_up="all")
    clock.advance(3 * 3600 + 60)  # down since 00:00: 01:00, 02:00 and 03:00 were missed
    await scheduler.schedule("report", name="report", cron="30 * * * *", catch_up="all")
    (listed,) = await scheduler.schedules()
    assert listed.next_at == dt.datetime(2030, 1, 1, 1, 30, tzinfo=UTC)
    await scheduler.store.schedules.publish_due(["report"])
    keys = [t.key for t in await tasks_of(scheduler, "report")]
    assert keys == ["report@20300101T013000Z", "report@20300101T023000Z"]
    # Still to come, a new time counts from now: nothing is published in the past.
    await scheduler.schedule("report", name="report", cron="0 12 * * *")
    (listed,) = await scheduler.schedules()
    assert listed.next_at == dt.datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def test_a_worker_that_loses_the_advance_still_records_the_occurrence_it_published(
    open_scheduler: Any, clock: ManualClock
):
    """Two workers at 00:02: A sees 00:01 still running and skips 00:02; then 00:01 ends and
    B, which read the schedule before A advanced it, publishes 00:02 and loses the advance.
    00:03 must see 00:02 running. (B's stale read is made by hand: the interleaving needs the
    schedule as it was before A's write.)"""
    first, second = await open_scheduler(), await open_scheduler()
    long = ms.TaskOptions(ping_interval_ms=20_000, worker_timeout_ms=600_000)
    await first.schedule(
        "sync", name="sync", every=dt.timedelta(minutes=1), skip_if_running=True, options=long
    )
    clock.advance(60)
    await first.store.schedules.publish_due(["sync"])
    lease = await first.store.tasks.claim("w", names=["sync"])
    assert lease is not None and lease.key == "sync@20300101T000100Z"
    clock.advance(60)
    (stale,) = await second.schedules()
    await first.store.schedules.publish_due(["sync"])  # A: 00:01 runs, 00:02 skipped
    await first.store.tasks.succeed(lease, None)
    await second.store.schedules._publish_occurrences(stale, clock.now())  # B: publishes 00:02
    (listed,) = await first.schedules()
    assert listed.last_key == "sync@20300101T000200Z"
    clock.advance(60)
    await first.store.schedules.publish_due(["sync"])  # 00:03: 00:02 has not run yet
    keys = [t.key for t in await tasks_of(first, "sync")]
    assert keys == ["sync@20300101T000100Z", "sync@20300101T000200Z"]


async def test_a_schedule_written_before_versions_can_be_registered_again(
    scheduler: ms.Scheduler,
) -> None:
    """Schedule documents of an earlier release have no ``version``: one is read as 0."""
    await scheduler.schedule("tick", name="tick", every=dt.timedelta(seconds=10))
    schedules = scheduler.store.schedules.collection
    await schedules.update_one({"_id": "tick"}, {"$unset": {"version": ""}})
    await scheduler.schedule("tick", name="tick", every=dt.timedelta(seconds=20))
    (changed,) = await scheduler.schedules()
    assert changed.every_ms == 20_000
    assert changed.version == 1
