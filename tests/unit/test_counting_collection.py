"""`CountingCollection`, what the benchmarks measure a consumer with: the CPU it counts as
"in the database" is each call's own steps (its cursor's and change stream's reads too), never
what other coroutines run while the call waits. Process time is a fake here: only the code
under test moves it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from mscheduler.backends import counting as counted

pytestmark = pytest.mark.anyio


class FakeProcessTime:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> FakeProcessTime:
    fake = FakeProcessTime()
    monkeypatch.setattr(counted.time, "process_time", fake)
    return fake


class WaitingCollection:
    """Each call, read or event spends 1 s of CPU, waits for ``reply``, spends 1 s more."""

    def __init__(self, cpu: FakeProcessTime) -> None:
        self.cpu = cpu
        self.reply = anyio.Event()

    async def _work(self) -> dict[str, Any]:
        self.cpu.seconds += 1
        await self.reply.wait()
        self.cpu.seconds += 1
        return {"n": 1}

    async def find_one(self, query: dict[str, Any]) -> dict[str, Any]:
        return await self._work()

    def find(self, query: dict[str, Any]) -> WaitingCollection:
        return self

    def __aiter__(self) -> WaitingCollection:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._work()

    async def watch(self, pipeline: list[dict[str, Any]]) -> WaitingCollection:
        return self

    async def try_next(self) -> dict[str, Any]:
        return await self._work()


async def _while_others_run(cpu: FakeProcessTime, reply: anyio.Event) -> None:
    """Another coroutine's 100 s of CPU while the call waits; then the reply comes."""
    await anyio.wait_all_tasks_blocked()
    cpu.seconds += 100
    reply.set()


async def test_a_call_counts_its_own_steps_not_what_runs_while_it_waits(cpu):
    wrapped = WaitingCollection(cpu)
    counting = counted.CountingCollection(wrapped)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(_while_others_run, cpu, wrapped.reply)
        assert await counting.find_one({}) == {"n": 1}
    assert counting.cpu_seconds == 2
    assert counting.counts["find_one"] == 1


async def test_a_cursors_reads_count_as_time_in_the_database(cpu):
    wrapped = WaitingCollection(cpu)
    counting = counted.CountingCollection(wrapped)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(_while_others_run, cpu, wrapped.reply)
        assert await counting.find({}).__anext__() == {"n": 1}
    assert counting.cpu_seconds == 2


async def test_a_change_streams_reads_count_as_time_in_the_database(cpu):
    wrapped = WaitingCollection(cpu)
    counting = counted.CountingCollection(wrapped)
    stream = await counting.watch([])
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(_while_others_run, cpu, wrapped.reply)
        assert await stream.try_next() == {"n": 1}
    assert counting.cpu_seconds == 2
    assert counting.counts["watch"] == 1


async def test_a_call_cancelled_while_it_waits_is_cancelled(cpu):
    wrapped = WaitingCollection(cpu)
    counting = counted.CountingCollection(wrapped)
    finished = []

    async def call() -> None:
        finished.append(await counting.find_one({}))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        task_group.cancel_scope.cancel()
    assert finished == []
    assert counting.cpu_seconds == 1  # its first step; it never resumed
