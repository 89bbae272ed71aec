"""`Scheduler.wait` and `wait_many`: the terminal task, from the change stream."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import pytest

import mscheduler as ms
from mscheduler.errors import ConfigurationError, TaskNotFound
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, needs_change_streams, until_idle, worker

pytestmark = pytest.mark.anyio
S = ms.TaskState
Discover = Callable[[], Awaitable[None]]


async def _done_handler(task: ms.Task) -> None:
    return None


async def _finish_later(sched: ms.Scheduler, key: str, outcome: str, discover: Discover) -> None:
    await until_idle()  # the waiter is blocked on its stream (or its poll) by now
    lease = await sched.store.tasks.claim("w1", key=key)
    assert lease is not None
    if outcome == "success":
        await sched.store.tasks.succeed(lease, {"answer": 42})
    elif outcome == "fail":
        await sched.store.tasks.fail(lease, RuntimeError("broken"))
    else:
        await sched.cancel(key, "not needed")
    await discover()


@pytest.mark.parametrize("outcome", ["success", "fail", "cancelled"])
async def test_wait_returns_the_terminal_task(
    scheduler: ms.Scheduler, outcome: str, discover: Discover
):
    opts = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("k", None, name="job", options=opts)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_finish_later, scheduler, "k", outcome, discover)
        task = await scheduler.wait("k", poll_interval_ms=POLL_MS)
    assert task.state.value == outcome
    if outcome == "success":
        assert task.result == {"answer": 42}
    else:
        assert task.error is not None


async def test_wait_times_out_on_the_clock(scheduler: ms.Scheduler, clock: ManualClock):
    await scheduler.publish("k", None, name="job")
    outcome: list[BaseException] = []

    async def waiter() -> None:
        try:
            await scheduler.wait("k", timeout=30)
        except TimeoutError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await until_idle()
        clock.advance(29.999)
        await until_idle()
        assert outcome == []
        clock.advance(0.001)
    assert len(outcome) == 1 and "'k'" in str(outcome[0])


async def test_wait_on_a_finished_task_returns_at_once(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job")
    await scheduler.cancel("k")
    assert (await scheduler.wait("k", timeout=0.001)).state is S.CANCELLED


async def test_wait_with_no_time_left_still_looks_once(scheduler: ms.Scheduler):
    """``timeout=0``: the task as it is if it has ended, a `TimeoutError` if not."""
    await scheduler.publish("done", None, name="job")
    await scheduler.cancel("done")
    await scheduler.publish("open", None, name="job")
    assert (await scheduler.wait("done", timeout=0)).state is ms.TaskState.CANCELLED
    with pytest.raises(TimeoutError):
        await scheduler.wait("open", timeout=0)


@pytest.mark.parametrize("seconds", [-1, -0.001, float("nan"), float("inf"), "5", 1e300])
async def test_a_timeout_that_is_no_time_to_wait_is_refused_naming_it(
    scheduler: ms.Scheduler, seconds: object
):
    await scheduler.publish("k", None, name="job")
    await scheduler.cancel("k")
    with pytest.raises(ConfigurationError, match=r"^timeout: "):
        await scheduler.wait("k", seconds)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"^timeout: "):
        await scheduler.wait_many(["k"], seconds)  # type: ignore[arg-type]


async def test_wait_on_an_unknown_key(scheduler: ms.Scheduler):
    with pytest.raises(TaskNotFound, match="nope"):
        await scheduler.wait("nope")


async def test_wait_many_returns_all_in_order(scheduler: ms.Scheduler, discover: Discover):
    for key in ("a", "b", "c"):
        await scheduler.publish(key, None, name="job")

    async def finish_all() -> None:
        for key in ("c", "a", "b"):
            await _finish_later(scheduler, key, "success", discover)

    async with anyio.create_task_group() as tg:
        tg.start_soon(finish_all)
        tasks = await scheduler.wait_many(["a", "b", "c"], poll_interval_ms=POLL_MS)
    assert list(tasks) == ["a", "b", "c"]
    assert all(task.state is S.SUCCESS for task in tasks.values())


async def test_wait_without_change_streams_polls(clock: ManualClock):
    sched = await ms.Scheduler.connect("memory://?changestreams=0", clock=clock)
    await sched.publish("k", None, name="job")
    found: list[ms.Task] = []

    async def waiter() -> None:
        found.append(await sched.wait("k"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await until_idle()
        await sched.cancel("k")
        await until_idle()
        assert found == [], "no stream, so nothing until the next poll"
        clock.advance(1)
    assert found[0].state is S.CANCELLED


async def test_wait_for_a_task_a_flow_will_publish(scheduler: ms.Scheduler, discover: Discover):
    found: list[ms.Task] = []

    async def waiter() -> None:
        found.append(await scheduler.wait("later", missing_ok=True, poll_interval_ms=POLL_MS))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await until_idle()
        await scheduler.publish("later", None, name="job")
        await scheduler.cancel("later")
        await discover()
    assert found[0].state is S.CANCELLED


async def test_watch_yields_every_change(scheduler: ms.Scheduler, engine: str):
    needs_change_streams(engine)
    seen: list[tuple[str, str]] = []

    async def watcher() -> None:
        async for task in scheduler.watch(names=["job"]):
            seen.append((task.key, task.state.value))
            if len(seen) == 3:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watcher)
        await until_idle()
        await scheduler.publish("a", None, name="job")
        await scheduler.publish("other", None, name="sms")
        await scheduler.cancel("a")
        await scheduler.publish("b", None, name="job")
    assert seen == [("a", "pending"), ("a", "cancelled"), ("b", "pending")]


async def test_watch_polls_a_server_without_change_streams(caplog: pytest.LogCaptureFixture):
    """Said once; each write shown once, a write published after the watch started included."""
    clock = ManualClock()
    sched = await ms.Scheduler.connect("memory://?changestreams=0", clock=clock)
    await sched.publish("before", None, name="job")
    clock.advance(0.001)  # writes of the millisecond the watch starts in are shown (at least once)
    seen: list[tuple[str, str]] = []

    async def watcher() -> None:
        async for task in sched.watch(names=["job"]):
            seen.append((task.key, task.state.value))
            if len(seen) == 3:
                return

    with caplog.at_level(logging.WARNING, logger="mscheduler"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher)
            await until_idle()
            await sched.publish("a", None, name="job")
            await sched.publish("other", None, name="sms")
            clock.advance(1)
            await until_idle()
            await sched.cancel("a")
            await sched.publish("b", None, name="job")
            clock.advance(1)
            await until_idle()
            clock.advance(1)
            await until_idle()
    assert seen == [("a", "pending"), ("a", "cancelled"), ("b", "pending")]
    said = [r for r in caplog.records if "polling every" in r.getMessage()]
    assert len(said) == 1


async def test_wait_after_a_retry_waits_for_the_new_run(
    scheduler: ms.Scheduler, discover: Discover
) -> None:
    """A consumer came and went (the process's stream was open, then nobody listened); the
    task failed, and was retried: `wait` returns the retried run's end, never the failure
    before it (the version it read first is pending)."""
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(max_unexpected_retries=0))
    async with scheduler.consumer({"other": _done_handler}, options=worker("w0")):
        await discover()
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    await scheduler.store.tasks.fail(lease, RuntimeError("broken"))
    await scheduler.retry("k")
    found: list[ms.Task] = []

    async def waiter() -> None:
        found.append(await scheduler.wait("k", poll_interval_ms=POLL_MS))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await discover()
        assert found == [], f"returned {found[0].state} while the retried task is pending"
        await _finish_later(scheduler, "k", "success", discover)
    assert [task.state for task in found] == [S.SUCCESS]


async def test_wait_never_returns_a_version_older_than_it_read(
    scheduler: ms.Scheduler, discover: Discover
) -> None:
    """The hub hands a waiter a task's failure after the waiter read the task retried (a
    stream reopened wider from a place behind both writes replays them): the waiter keeps
    the newer, pending version, and waits on."""
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(max_unexpected_retries=0))
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    await scheduler.store.tasks.fail(lease, RuntimeError("broken"))
    failed = await scheduler.get("k")
    assert failed is not None and failed.state is S.FAIL
    await scheduler.retry("k")
    found: list[ms.Task] = []

    async def waiter() -> None:
        found.append(await scheduler.wait("k", poll_interval_ms=POLL_MS))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await discover()
        scheduler.services.task_hub._hand_out(failed, True)  # late, as a replay
        await discover()
        assert found == [], f"returned {found[0].state} while the retried task is pending"
        await _finish_later(scheduler, "k", "success", discover)
    assert [task.state for task in found] == [S.SUCCESS]
