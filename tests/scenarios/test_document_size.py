"""The size of a task document: every valid option can be published, no task document
outgrows 16 MiB whatever happens to it, retries and ``max_tries`` count attempts whose states
were dropped, and a failed task always says why. Runs on every engine; the memory backend
checks MongoDB's 16 MiB and nesting bounds, so it refuses what a server would."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from pymongo.errors import DocumentTooLarge, WriteError

import mscheduler as ms
from mscheduler import constants as c
from mscheduler.encoding import growth_reserve, result_limit
from mscheduler.errors import DependencyError, PayloadError
from mscheduler.models import Lease

pytestmark = pytest.mark.anyio

S = ms.TaskState
FAST = {"ping_interval_ms": 1_000, "worker_timeout_ms": 10_000, "unexpected_retry_delay_ms": 0}

EXTREMES = [
    {"concurrent_worker_cnt": 8},
    {"max_unexpected_retries": c.MAX_UNEXPECTED_RETRIES},
    {
        "concurrent_worker_cnt": c.MAX_CONCURRENT_WORKER_CNT,
        "max_unexpected_retries": c.MAX_UNEXPECTED_RETRIES,
        "max_tries": c.MAX_TRIES,
    },
]


@pytest.mark.parametrize("fields", EXTREMES, ids=lambda f: ",".join(f))
def test_every_valid_option_leaves_room_for_a_payload(fields: dict[str, Any]):
    options = ms.TaskOptions(**fields)
    # The reservation is bounded by what the options can produce, never the whole document.
    assert 0 < growth_reserve(options) < c.MAX_DOCUMENT_BYTES // 2
    assert result_limit(options) > 0


@pytest.mark.parametrize("fields", EXTREMES, ids=lambda f: ",".join(f))
async def test_options_at_their_maxima_are_published(
    scheduler: ms.Scheduler, fields: dict[str, Any]
):
    published = await scheduler.publish("k", {"n": 1}, name="job", options=ms.TaskOptions(**fields))
    assert published.created and published.task.options == ms.TaskOptions(**fields)


async def _claim(sched: ms.Scheduler, key: str, worker: str = "w1") -> Lease:
    lease = await sched.store.tasks.claim(worker, key=key)
    assert lease is not None
    return lease


async def test_history_is_bounded_and_counted(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(**FAST))
    for _ in range(60):
        await scheduler.store.tasks.retry_later(await _claim(scheduler, "k"), 0, "not yet")
    task = await scheduler.get("k")
    assert task is not None and task.state is S.PENDING
    assert len(task.worker_states) <= c.KEPT_FINISHED_STATES + 1
    assert task.attempts == 60
    assert task.dropped_attempts == 60 - len(task.worker_states)
    assert task.dropped_failures == 0
    # The latest are the ones kept, in claim order.
    starts = [ws.started_at for ws in task.worker_states]
    assert starts == sorted(starts)


async def test_retries_count_failures_whose_states_were_dropped(scheduler: ms.Scheduler):
    retries = 25
    options = ms.TaskOptions(max_unexpected_retries=retries, **FAST)
    await scheduler.publish("k", None, name="job", options=options)
    for n in range(retries + 1):
        await scheduler.store.tasks.retry_later(await _claim(scheduler, "k"), 0, "wait")
        task = await scheduler.store.tasks.fail(
            await _claim(scheduler, "k"), RuntimeError(f"boom {n}")
        )
        expected = S.FAIL if n == retries else S.PENDING
        assert task.state is expected, n
    assert task.dropped_failures > 0 and task.unexpected_failures == retries + 1
    assert task.error is not None and task.error.message == f"boom {retries}"
    assert await scheduler.store.tasks.claim("w1", key="k") is None


async def test_max_tries_counts_dropped_attempts_and_says_why(scheduler: ms.Scheduler):
    await scheduler.publish("k", None, name="job", options=ms.TaskOptions(max_tries=40, **FAST))
    for n in range(40):
        task = await scheduler.store.tasks.retry_later(await _claim(scheduler, "k"), 0, "later")
        assert task.state is (S.FAIL if n == 39 else S.PENDING), n
    assert task.attempts == 40 and task.dropped_attempts > 0
    assert task.error is not None and task.error.type == "TriesExhausted"
    assert await scheduler.store.tasks.claim("w1", key="k") is None


async def test_a_failed_task_always_has_an_error(scheduler: ms.Scheduler):
    """Also when ``max_tries`` runs out after a success short of concurrent_worker_cnt."""
    options = ms.TaskOptions(concurrent_worker_cnt=2, max_tries=2, **FAST)
    await scheduler.publish("k", None, name="job", options=options)
    await scheduler.store.tasks.succeed(await _claim(scheduler, "k", "w1"), "ok")
    task = await scheduler.store.tasks.retry_later(await _claim(scheduler, "k", "w2"), 0, "later")
    assert task.state is S.FAIL
    assert task.error is not None and task.error.type == "TriesExhausted"
    # The last attempt failed: its own error says why.
    await scheduler.publish("j", None, name="job", options=options)
    await scheduler.store.tasks.succeed(await _claim(scheduler, "j", "w1"), "ok")
    task = await scheduler.store.tasks.fail(
        await _claim(scheduler, "j", "w2"), ValueError("bad row")
    )
    assert task.state is S.FAIL and task.error is not None and task.error.message == "bad row"


def test_max_tries_below_concurrent_workers_is_refused():
    with pytest.raises(ValueError, match=r"max_tries \(1\) must be at least concurrent_worker_cnt"):
        ms.TaskOptions(concurrent_worker_cnt=2, max_tries=1)


async def test_a_task_at_the_size_limit_survives_its_whole_life(
    scheduler: ms.Scheduler, engine: str
):
    """The largest payload publish allows, then results and errors of the largest sizes: no
    write of the scheduler's own is refused (the memory backend refuses what a server
    would). Before, 677 RetryLater calls took such a task past 16 MiB."""
    if engine == "wire":
        pytest.skip("14 MiB per reply, hundreds of times: the memory engine enforces the limit")
    options = ms.TaskOptions(max_unexpected_retries=50, **FAST)
    budget = c.MAX_DOCUMENT_BYTES - growth_reserve(options)
    await scheduler.publish("p", "", name="job", options=options)  # keys of one length
    probe = await scheduler.collection.find_one({"key": "p"})
    probe["trace_context"] = None  # the size check leaves a publisher's trace context out
    payload = "x" * (budget - len(bson.encode(probe)))
    await scheduler.publish("k", payload, name="job", options=options)
    with pytest.raises(PayloadError, match="the limit is"):
        await scheduler.publish("q", payload + "x", name="job", options=options)
    reason = "\U0001f600" * c.MAX_ERROR_MESSAGE_BYTES  # four bytes each: cut to the byte limit
    for n in range(100):
        lease = await _claim(scheduler, "k", f"w-{'é' * 200}-{n}")
        if n % 2:
            await scheduler.store.tasks.retry_later(lease, 0, reason)
        else:
            await scheduler.store.tasks.fail(lease, RuntimeError(reason))
    lease = await _claim(scheduler, "k")
    task = await scheduler.store.tasks.succeed(lease, "y" * (result_limit(options) - 100))
    assert task.state is S.SUCCESS and task.attempts == 101


async def test_memory_backend_refuses_what_a_server_refuses(scheduler: ms.Scheduler, engine: str):
    if engine != "memory":
        pytest.skip("the memory backend's own enforcement of MongoDB's limits")
    await scheduler.publish("k", {"n": 1}, name="job")
    before = await scheduler.collection.find_one({"key": "k"})
    with pytest.raises(WriteError) as refused:
        await scheduler.collection.update_one(
            {"key": "k"}, {"$set": {"blob": "x" * c.MAX_DOCUMENT_BYTES}}
        )
    assert refused.value.code == 17419
    deep: dict[str, Any] = {}
    for _ in range(c.MAX_NESTING_DEPTH):
        deep = {"d": deep or {"leaf": 1}}
    with pytest.raises(WriteError, match="nested"):
        await scheduler.collection.update_one({"key": "k"}, {"$set": {"deep": deep}})
    assert await scheduler.collection.find_one({"key": "k"}) == before
    with pytest.raises(DocumentTooLarge):
        await scheduler.collection.insert_one({"key": "big", "blob": "x" * c.MAX_DOCUMENT_BYTES})
    assert await scheduler.collection.count_documents({"key": "big"}) == 0


async def _documents(sched: ms.Scheduler) -> list[dict[str, Any]]:
    return [doc async for doc in sched.collection.find({}, sort=[("_id", 1)])]


async def test_replace_refuses_a_dependency_cycle(scheduler: ms.Scheduler):
    await scheduler.publish("a", None, name="job")
    await scheduler.publish("b", None, name="job", depends_on=["a"])
    await scheduler.publish("c", None, name="job", depends_on=["b"])
    before = await _documents(scheduler)
    with pytest.raises(DependencyError, match=r"replace: 'c' → 'a' closes a cycle"):
        await scheduler.replace("a", None, name="job", depends_on=["c"])
    with pytest.raises(DependencyError, match=r"commit: 'b' → 'a' closes a cycle"):
        await scheduler.commit(
            delete=["a"], publish=[ms.TaskSpec(key="a", name="job", depends_on=("b",))]
        )
    assert await _documents(scheduler) == before
