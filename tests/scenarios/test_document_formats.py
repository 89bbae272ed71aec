"""A fleet mid-upgrade keeps working: this version runs the documents the last release wrote
(kept as written, `fixtures/last_release_tasks.json`), marks what it writes with its format,
and leaves a document of a newer format to a newer worker, with one line in its log."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from bson import json_util

import mscheduler as ms
from mscheduler import constants as c
from mscheduler.consumer import claimable
from mscheduler.models import WorkerStateKind as K
from mscheduler.testing import ManualClock
from tests.engines import until_idle
from tests.scenarios.test_consumer import Recorder, consumers

pytestmark = pytest.mark.anyio

S = ms.TaskState
LAST_RELEASE = Path(__file__).parent / "fixtures" / "last_release_tasks.json"


def _last_release() -> dict[str, Any]:
    options = json_util.RELAXED_JSON_OPTIONS.with_options(tz_aware=True)
    loaded: dict[str, Any] = json_util.loads(LAST_RELEASE.read_text(), json_options=options)
    return loaded


async def test_the_last_releases_documents_run_through_this_version(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """Pending, prioritised, pinned, two-slot, delayed and dependent tasks, a task whose
    worker died holding it, one that failed once and waits to retry, and one that finished:
    written by the last release, each runs (or stays done) as it would have there."""
    written = _last_release()
    assert clock.now() == written["clock"]
    assert all("format" not in document for document in written["tasks"])
    for document in written["tasks"]:
        await scheduler.collection.insert_one(document)
    recorder = Recorder()
    async with consumers(scheduler, recorder, count=2):
        await until_idle()
        for _ in range(31):  # past the delayed task, the dead lease and the retry's delay
            clock.advance(1)
            await until_idle()
    tasks = {
        task.key: task
        for task in await scheduler.store.get_many(
            [document["key"] for document in written["tasks"]]
        )
    }
    assert {key: task.state for key, task in tasks.items()} == dict.fromkeys(tasks, S.SUCCESS)
    assert all(task.format == 1 for task in tasks.values())  # the format that wrote them
    assert tasks["done"].result == {"answer": 42}  # finished before: not run again
    assert "done" not in {key for key, _ in recorder.runs}
    assert [ws.state for ws in tasks["orphan"].worker_states] == [K.TIMEOUT, K.SUCCESS]
    assert [ws.state for ws in tasks["retried"].worker_states] == [K.FAIL, K.SUCCESS]
    assert [ws.worker_id for ws in tasks["two"].worker_states] in (["w0", "w1"], ["w1", "w0"])
    assert [ws.worker_id for ws in tasks["pinned"].worker_states] == ["w0"]
    order = [key for key, _ in recorder.runs]
    assert order.index("flow:first") < order.index("flow:second")
    assert order[0] == "urgent"


async def test_what_this_version_writes_says_its_format(scheduler: ms.Scheduler):
    await scheduler.publish("new", None, name="job")
    task = await scheduler.get("new")
    assert task is not None and task.format == c.DOCUMENT_FORMAT and not task.newer_format


async def test_a_task_of_a_newer_format_is_left_to_a_newer_worker(
    scheduler: ms.Scheduler, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """Its fields may mean what this version cannot know (here an option of another type):
    it is never claimed, by any path, nor misread; the others run; the process says so once."""
    monkeypatch.setattr(claimable, "_LEFT_FORMATS", set())
    await scheduler.publish_many(ms.TaskSpec(key=f"t{n}", name="job") for n in range(6))
    newer = c.DOCUMENT_FORMAT + 1
    for key in ("t0", "t3"):
        await scheduler.collection.update_one(
            {"key": key}, {"$set": {"format": newer, "options.priority": "high"}}
        )
    assert await scheduler.store.tasks.claim("w9", key="t0") is None
    assert await scheduler.store.tasks.claim("w9", names=["job"]) is not None  # t1
    leases = await scheduler.store.tasks.claim_many("w9", names=["job"], limit=8)
    assert sorted(lease.key for lease in leases) == ["t2", "t4", "t5"]
    await scheduler.publish_many(ms.TaskSpec(key=f"u{n}", name="job") for n in range(4))
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="mscheduler.consumer.claimable"):
        async with consumers(scheduler, recorder, count=2):
            await until_idle()
    assert sorted(key for key, _ in recorder.runs) == ["u0", "u1", "u2", "u3"]
    for key in ("t0", "t3"):
        task = await scheduler.get(key)
        assert task is not None and task.newer_format and task.format == newer
        assert task.state is S.BLOCKED and task.worker_states == []  # read as not ours
    stored = await scheduler.collection.find_one({"key": "t0"})
    assert stored is not None and stored["state"] == "pending"  # left as the newer one wrote it
    left = [r for r in caplog.records if getattr(r, "action", None) == "newer_format"]
    assert len(left) == 1 and f"format {newer}" in left[0].getMessage()
