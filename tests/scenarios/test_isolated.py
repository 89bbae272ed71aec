"""Isolated handlers (`isolated`): plain ``def`` handlers run in child processes of the
worker's pool. A child that dies fails its attempt alone, ``timeout_ms`` kills it, children
run side by side and are replaced after ``max_tasks_per_child`` tasks or past
``max_memory_mb``, and none outlives its worker. Every engine.

The handlers run in real processes (`tests.isolated_handlers`, imported by name there), so
real time passes while they run: each wait for one is bounded (`REAL_WAIT_S`) and polls
briefly. The scheduler's time is the manual clock's."""

from __future__ import annotations

import datetime as dt
import os
import pathlib
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.consumer import isolation
from mscheduler.errors import ConfigurationError
from mscheduler.handlers import Isolated, isolated
from mscheduler.models import Progress, WorkerStateKind
from mscheduler.testing import ManualClock
from tests import isolated_handlers as h
from tests.engines import POLL_MS, until_idle, worker

pytestmark = pytest.mark.anyio
S = ms.TaskState
REAL_WAIT_S = 20.0  # a child starts in well under a second; this bounds a hang, not a speed
NO_RETRY = ms.TaskOptions(max_unexpected_retries=0)


async def until(check: Callable[[], Any], clock: ManualClock | None = None) -> Any:
    """``check()`` once it is truthy, polling in real time (a child works meanwhile); with a
    clock, one poll interval of the scheduler's time passes each round (the wire engine's
    consumers poll)."""
    with anyio.fail_after(REAL_WAIT_S):
        while True:
            found = check()
            if hasattr(found, "__await__"):
                found = await found
            if found:
                return found
            if clock is not None:
                clock.advance(POLL_MS / 1000)
            await anyio.sleep(0.01)


async def finished(sched: ms.Scheduler, key: str, clock: ManualClock | None) -> ms.Task:
    async def ended() -> ms.Task | None:
        task = await sched.get(key)
        return task if task is not None and task.state.is_terminal else None

    task: ms.Task = await until(ended, clock)
    return task


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ------------------------------------------------------------------------ crossing


async def test_the_task_its_result_and_its_lease_cross_to_the_child_and_back(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("k", {"size": 21}, name="pid")
    async with scheduler.consumer({"pid": isolated(h.pid)}, options=worker()):
        task = await finished(scheduler, "k", clock)
    assert task.state is S.SUCCESS, task.error
    assert task.result["payload"] == {"size": 21}
    assert task.result["pid"] != os.getpid()
    assert task.result["run_id"] == task.worker_states[-1].run_id  # current_lease() there


async def test_progress_reported_in_the_child_is_written_by_the_worker(
    scheduler: ms.Scheduler, clock: ManualClock, tmp_path: pathlib.Path
):
    go = tmp_path / "go"
    await scheduler.publish("k", str(go), name="reports")
    async with scheduler.consumer({"reports": isolated(h.reports)}, options=worker()):

        async def reported() -> Progress | None:
            task = await scheduler.get("k")
            return None if task is None else task.progress

        progress = await until(reported)  # the first report is written at once
        assert (progress.fraction, progress.message) == (0.5, "half way")
        go.write_text("")
        task = await finished(scheduler, "k", clock)
    assert task.state is S.SUCCESS and task.progress is None


async def test_the_handlers_exceptions_and_signals_cross_as_raised_and_a_bad_result_fails(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("bad", 7, name="fails", options=NO_RETRY)
    await scheduler.publish("abort", None, name="aborts")
    await scheduler.publish("later", None, name="later")
    await scheduler.publish("lock", None, name="lock", options=NO_RETRY)
    handlers = {
        "lock": isolated(h.returns_a_lock),
        "fails": isolated(h.fails),
        "aborts": isolated(h.aborts),
        "later": isolated(h.retries_later),
    }
    async with scheduler.consumer(handlers, options=worker()):
        bad = await finished(scheduler, "bad", clock)
        aborted = await finished(scheduler, "abort", clock)
        lock = await finished(scheduler, "lock", clock)

        async def deferred() -> ms.Task | None:
            task = await scheduler.get("later")
            return task if task is not None and task.retry_at is not None else None

        later = await until(deferred)
    assert bad.state is S.FAIL and bad.error is not None
    assert (bad.error.type, bad.error.message) == ("ValueError", "bad payload 7")
    assert aborted.state is S.FAIL and aborted.error is not None
    assert aborted.error.type == "Abort" and len(aborted.worker_states) == 1  # no retry
    assert lock.state is S.FAIL and lock.error is not None and lock.error.type == "TypeError"
    assert later.state is S.PENDING and later.unexpected_failures == 0
    assert later.retry_at is not None and later.retry_at >= clock.now()


# ------------------------------------------------------------------------ a child that dies


async def test_a_child_that_exits_fails_its_attempt_and_the_next_task_runs_on_the_same_worker(
    scheduler: ms.Scheduler, clock: ManualClock
):
    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=1_000)
    await scheduler.publish("dies", None, name="exit_3", options=options)
    handlers = {"exit_3": isolated(h.exit_3), "pid": isolated(h.pid)}
    async with scheduler.consumer(handlers, options=worker(max_running=1)) as consumer:

        async def failed_once() -> ms.Task | None:
            task = await scheduler.get("dies")
            return task if task is not None and task.unexpected_failures == 1 else None

        first = await until(failed_once)
        assert first.state is S.PENDING  # retried by the task's rules
        error = first.worker_states[-1].error
        assert error is not None and error.type == "HandlerProcessDied"
        assert "exited with code 3" in error.message
        dies = await finished(scheduler, "dies", clock)  # its retry dies the same way
        await scheduler.publish("next", None, name="pid")
        after = await finished(scheduler, "next", clock)
        assert not consumer.stop_requested
    assert dies.state is S.FAIL and dies.error is not None
    assert dies.error.type == "HandlerProcessDied" and dies.unexpected_failures == 2
    assert after.state is S.SUCCESS and after.worker_states[-1].worker_id == "w1"


async def test_a_child_killed_by_a_signal_fails_its_attempt_naming_the_signal(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("k", None, name="killed", options=NO_RETRY)
    async with scheduler.consumer({"killed": isolated(h.killed)}, options=worker()):
        task = await finished(scheduler, "k", clock)
    assert task.state is S.FAIL and task.error is not None
    assert task.error.type == "HandlerProcessDied" and "killed by SIGKILL" in task.error.message


async def test_sys_exit_ends_the_child_and_keyboard_interrupt_fails_the_attempt_alone(
    scheduler: ms.Scheduler, clock: ManualClock
):
    await scheduler.publish("exit", None, name="exits", options=NO_RETRY)
    await scheduler.publish("interrupt", None, name="interrupted", options=NO_RETRY)
    handlers = {"exits": isolated(h.exits), "interrupted": isolated(h.interrupted)}
    async with scheduler.consumer(handlers, options=worker()) as consumer:
        exited = await finished(scheduler, "exit", clock)
        interrupted = await finished(scheduler, "interrupt", clock)
        assert not consumer.stop_requested
    assert exited.error is not None and exited.error.type == "HandlerProcessDied"
    assert "exited with code 5" in exited.error.message
    assert interrupted.state is S.FAIL and interrupted.error is not None
    assert interrupted.error.type == "RuntimeError"
    assert "KeyboardInterrupt" in interrupted.error.message


# ------------------------------------------------------------------------ timeout_ms


async def test_a_child_past_timeout_ms_is_killed_and_its_slot_reused_at_once(
    scheduler: ms.Scheduler, clock: ManualClock, tmp_path: pathlib.Path
):
    pid_file = tmp_path / "stuck.pid"
    timed = ms.TaskOptions(timeout_ms=500, max_unexpected_retries=0, priority=1)
    await scheduler.publish("stuck", str(pid_file), name="stuck", options=timed)
    await scheduler.publish("after", None, name="pid")
    handlers = {"stuck": isolated(h.stuck), "pid": isolated(h.pid)}
    async with scheduler.consumer(handlers, options=worker(max_running=1)):
        await until(pid_file.exists)
        pid = int(pid_file.read_text())
        assert alive(pid)
        clock.advance(0.5)  # the deadline: no more of the scheduler's time passes below
        stuck = await finished(scheduler, "stuck", None)
        assert not alive(pid), "the timed-out child still runs"
        after = await finished(scheduler, "after", None)  # the slot, free at once
    assert stuck.state is S.FAIL and stuck.error is not None
    assert stuck.error.type == "TaskTimeout"
    assert after.state is S.SUCCESS and after.result["pid"] != pid
    assert not (tmp_path / "stuck.pid.woke").exists()


async def test_a_remote_cancel_kills_the_child_running_the_task(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Any, tmp_path: pathlib.Path
):
    pid_file = tmp_path / "stuck.pid"
    await scheduler.publish("stuck", str(pid_file), name="stuck")
    async with scheduler.consumer({"stuck": isolated(h.stuck)}, options=worker()) as consumer:
        await until(pid_file.exists)
        pid = int(pid_file.read_text())
        assert await scheduler.cancel("stuck")
        await discover()
        await until(lambda: not alive(pid))
        await until(lambda: not consumer.running)
    task = await scheduler.get("stuck")
    assert task is not None and task.state is S.CANCELLED


async def test_a_stopping_worker_kills_the_child_still_running_past_its_grace(
    scheduler: ms.Scheduler, tmp_path: pathlib.Path
):
    pid_file = tmp_path / "stuck.pid"
    await scheduler.publish("stuck", str(pid_file), name="stuck")
    options = worker(shutdown_grace_ms=0)
    async with scheduler.consumer({"stuck": isolated(h.stuck)}, options=options):
        await until(pid_file.exists)
        pid = int(pid_file.read_text())
    assert not alive(pid)
    task = await scheduler.get("stuck")
    assert task is not None and task.state is S.PENDING  # released for another worker
    assert task.worker_states[-1].state is WorkerStateKind.RELEASED


async def test_a_start_under_a_rate_counts_from_when_the_handler_starts_in_its_child(
    scheduler: ms.Scheduler, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
):
    """The child takes 5 s to start (a cold process, a loaded machine): the handler's start
    counts against the rate for ``per`` from when it really started in the child, not from
    the claim, so no window of ``per`` holds two handler starts."""
    per = dt.timedelta(seconds=60)
    await scheduler.set_limit("pid", rate=1, per=per)
    child_asked, child_may_start = anyio.Event(), anyio.Event()
    real_start = isolation._Child.start

    async def slow_start(cls: type[Any]) -> Any:
        child_asked.set()
        await child_may_start.wait()
        return await real_start()

    monkeypatch.setattr(isolation._Child, "start", classmethod(slow_start))
    await scheduler.publish("k", None, name="pid")
    claimed_at = clock.now()
    async with scheduler.consumer({"pid": isolated(h.pid)}, options=worker()):
        await until(child_asked.is_set)
        await until_idle()  # whatever the worker does before the child exists is done
        clock.advance(5)
        child_may_start.set()
        task = await finished(scheduler, "k", None)
    assert task.state is S.SUCCESS, task.error
    [start] = (await scheduler.limits())["pid"].starts
    assert start.until is not None
    assert start.until >= claimed_at + dt.timedelta(seconds=5) + per


async def test_a_child_slower_to_start_than_a_start_is_held_still_keeps_the_rate(
    scheduler: ms.Scheduler, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
):
    """The child takes 12 s to start, longer than a start taken with a claim is held for
    its handler: the handler's start still counts ``per`` from its real start (it takes a
    start of its own once its child is up, waiting for the window if it is full)."""
    per = dt.timedelta(seconds=60)
    await scheduler.set_limit("pid", rate=1, per=per)
    child_asked, child_may_start = anyio.Event(), anyio.Event()
    real_start = isolation._Child.start

    async def slow_start(cls: type[Any]) -> Any:
        child_asked.set()
        await child_may_start.wait()
        return await real_start()

    monkeypatch.setattr(isolation._Child, "start", classmethod(slow_start))
    held = ms.TaskOptions(ping_interval_ms=5_000, worker_timeout_ms=600_000)
    await scheduler.publish("k", None, name="pid", options=held)
    claimed_at = clock.now()

    async def ended() -> ms.Task | None:
        task = await scheduler.get("k")
        return task if task is not None and task.state.is_terminal else None

    async with scheduler.consumer({"pid": isolated(h.pid)}, options=worker(max_running=1)):
        await until(child_asked.is_set)
        await until_idle()
        clock.advance(12)
        child_may_start.set()
        with anyio.fail_after(REAL_WAIT_S):
            while (task := await ended()) is None:  # the window frees 70 s after the claim
                await anyio.sleep(0.01)
                clock.advance(1)
    assert task.state is S.SUCCESS, task.error
    starts = (await scheduler.limits())["pid"].starts
    assert max(start.until for start in starts if start.until) >= (
        claimed_at + dt.timedelta(seconds=12) + per
    )


# ------------------------------------------------------------------------ the pool


async def test_isolated_handlers_of_one_worker_run_in_different_processes_at_once(
    scheduler: ms.Scheduler, clock: ManualClock, tmp_path: pathlib.Path
):
    for key in ("a", "b"):
        await scheduler.publish(key, str(tmp_path), name="meet", options=NO_RETRY)
    async with scheduler.consumer({"meet": isolated(h.meet)}, options=worker(max_running=2)):
        tasks = [await finished(scheduler, key, clock) for key in ("a", "b")]
    assert [t.state for t in tasks] == [S.SUCCESS, S.SUCCESS], [t.error for t in tasks]
    assert tasks[0].result != tasks[1].result != os.getpid()


async def pids_of_three_tasks(
    scheduler: ms.Scheduler, clock: ManualClock, handler: Isolated
) -> list[int]:
    """Three tasks one after another on one worker: the pid each ran in. The children are
    gone once the worker has stopped."""
    for n in range(3):
        await scheduler.publish(f"k{n}", n, name="pid", options=ms.TaskOptions(priority=-n))
    async with scheduler.consumer({"pid": handler}, options=worker(max_running=1)):
        tasks = [await finished(scheduler, f"k{n}", clock) for n in range(3)]
    pids = [t.result["pid"] for t in tasks]
    assert not any(alive(pid) for pid in pids), "a child outlived its worker"
    return pids


async def test_a_child_runs_task_after_task(scheduler: ms.Scheduler, clock: ManualClock):
    assert len(set(await pids_of_three_tasks(scheduler, clock, isolated(h.pid)))) == 1


async def test_max_tasks_per_child_1_gives_each_task_a_fresh_process(
    scheduler: ms.Scheduler, clock: ManualClock
):
    handler = isolated(h.pid, max_tasks_per_child=1)
    assert len(set(await pids_of_three_tasks(scheduler, clock, handler))) == 3


async def test_a_child_past_max_memory_mb_after_a_task_is_replaced(
    scheduler: ms.Scheduler, clock: ManualClock
):
    handler = isolated(h.pid, max_memory_mb=1)  # any interpreter holds more
    assert len(set(await pids_of_three_tasks(scheduler, clock, handler))) == 3


# ------------------------------------------------------------------------ what it refuses


async def _an_async_handler(task: ms.Task) -> None:
    return None


@pytest.mark.parametrize(
    ("function", "limits", "message"),
    [
        (_an_async_handler, {}, "expected a plain def function"),
        (lambda task: None, {}, "names no function of an importable module"),
        (h.pid, {"max_tasks_per_child": 0}, "max_tasks_per_child must be a whole number"),
        (h.pid, {"max_memory_mb": -1}, "max_memory_mb must be a number of megabytes above 0"),
    ],
)
def test_what_cannot_run_in_a_child_is_refused_at_once(
    function: Any, limits: dict[str, Any], message: str
):
    with pytest.raises(ConfigurationError, match=message):
        isolated(function, **limits)
