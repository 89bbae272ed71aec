"""A worker that crashes and restarts under the same worker_id (a hostname, a fixed
``MSCHEDULER_WORKER_ID``, a task pinned with ``specific_worker_ids``): the lease its previous
life held is a stranger's to it, and the task runs once that lease expires, never before."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mscheduler as ms
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import POLL_MS, until_idle

pytestmark = pytest.mark.anyio
S = ms.TaskState
K = WorkerStateKind
FAST = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=5_000)


def _options(worker_id: str) -> ms.WorkerOptions:
    return ms.WorkerOptions(worker_id=worker_id, poll_interval_ms=POLL_MS)


@pytest.mark.parametrize("pinned", [False, True], ids=["any-worker", "pinned-to-it"])
async def test_a_worker_restarted_under_its_id_runs_the_task_its_previous_life_held(
    scheduler: ms.Scheduler, clock: ManualClock, pinned: bool
):
    options = FAST.model_copy(update={"specific_worker_ids": ["w1"] if pinned else []})
    await scheduler.publish("k", {"n": 1}, name="job", options=options)
    runs: list[str] = []

    async def hangs(task: ms.Task) -> None:
        runs.append("first life")
        await anyio.sleep_forever()

    async def works(task: ms.Task) -> dict[str, Any]:
        runs.append("second life")
        return {"ok": True}

    first = scheduler.consumer({"job": hangs}, options=_options("w1"))
    async with anyio.create_task_group() as crash:
        crash.start_soon(first.run)
        await until_idle()
        crash.cancel_scope.cancel()  # a crash: the lease is left to expire, unreleased
    assert runs == ["first life"]
    async with scheduler.consumer({"job": works}, options=_options("w1")):
        await until_idle()
        clock.advance(4.9)  # the first life's lease (5 s) still lives: no second run yet
        await until_idle()
        assert runs == ["first life"], "run again while the previous lease was live"
        clock.advance(0.2)
        await until_idle()
        assert runs == ["first life", "second life"]
    task = await scheduler.get("k")
    assert task is not None and task.state is S.SUCCESS
    assert [(ws.worker_id, ws.state) for ws in task.worker_states] == [
        ("w1", K.TIMEOUT),
        ("w1", K.SUCCESS),
    ]
