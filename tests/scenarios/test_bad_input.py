"""Bad input gets an error naming the field and the problem, and nothing is written."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pytest
from pydantic import ValidationError

import mscheduler as ms
from mscheduler.errors import ConfigurationError, PayloadError

pytestmark = pytest.mark.anyio


def test_the_task_option_defaults_are_the_documented_ones():
    opts = ms.TaskOptions()
    assert (opts.priority, opts.concurrent_worker_cnt, opts.max_unexpected_retries) == (0, 1, 3)
    assert (opts.ping_interval_ms, opts.worker_timeout_ms) == (30_000, 60_000)
    assert opts.unexpected_retry_delay_ms == 10_000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"concurrent_worker_cnt": 0}, "concurrent_worker_cnt"),
        ({"max_unexpected_retries": -1}, "max_unexpected_retries"),
        ({"unexpected_retry_delay_ms": -5}, "unexpected_retry_delay_ms"),
        ({"ping_interval_ms": 30_000, "worker_timeout_ms": 30_000}, "worker_timeout_ms"),
        (
            {"specific_worker_ids": [""]},
            r"specific_worker_ids\[0\]: must be a non-empty string",
        ),
        ({"priority": "high"}, "priority"),
        ({"retries": 3}, "retries"),
        ({"retry_backoff": 0.5}, "retry_backoff"),
        ({"retry_backoff_max_ms": 0}, "retry_backoff_max_ms"),
        ({"retry_jitter": -0.1}, "retry_jitter"),
        ({"retry_jitter": 1.5}, "retry_jitter"),
    ],
)
def test_invalid_options_name_the_field(fields: dict[str, Any], message: str):
    with pytest.raises(ValidationError, match=message):
        ms.TaskOptions(**fields)


async def _nothing_written(scheduler: ms.Scheduler) -> None:
    assert await scheduler.collection.count_documents({"key": {"$exists": True}}) == 0


@pytest.mark.parametrize(
    ("key", "name", "message"),
    [
        ("", "job", "^key: must be a non-empty string$"),
        ("   ", "job", "^key: must be a non-empty string$"),
        ("k" * 513, "job", "^key: 513 characters long; the limit is 512$"),
        ("k", "", "^name: must be a non-empty string$"),
        ("k", "n" * 129, "^name: 129 characters long"),
        (42, "job", "^key: must be a non-empty string$"),
    ],
)
async def test_bad_keys_and_names(scheduler: ms.Scheduler, key: Any, name: str, message: str):
    with pytest.raises(ConfigurationError, match=message):
        await scheduler.publish(key, None, name=name)
    await _nothing_written(scheduler)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"when": {1, 2}}, "payload: cannot be stored as BSON"),
        ({"amount": decimal.Decimal("1.5")}, "cannot be stored as BSON"),
        (object(), "payload: cannot be stored as BSON"),
        ({"$set": 1}, "payload: field name '\\$set' starts with '\\$'"),
        ({"a": [{"$inc": 1}]}, "payload.a\\[0\\]: field name"),
        ({1: "int key"}, "cannot be stored as BSON"),
    ],
)
async def test_payloads_that_cannot_be_stored(scheduler: ms.Scheduler, payload: Any, message: str):
    with pytest.raises(PayloadError, match=message):
        await scheduler.publish("k", payload, name="job")
    await _nothing_written(scheduler)


async def test_oversize_document_is_refused_before_writing(scheduler: ms.Scheduler):
    with pytest.raises(PayloadError, match="the limit is"):
        await scheduler.publish("k", {"blob": "x" * (15 * 1024 * 1024)}, name="job")
    await _nothing_written(scheduler)


async def test_options_of_the_wrong_type(scheduler: ms.Scheduler):
    with pytest.raises(ConfigurationError, match="options: expected TaskOptions"):
        await scheduler.publish("k", None, name="job", options={"priority": 1})  # type: ignore[arg-type]
    await _nothing_written(scheduler)


async def test_claim_needs_a_key_or_names(scheduler: ms.Scheduler):
    with pytest.raises(ConfigurationError, match="give a key or at least one task name"):
        await scheduler.store.tasks.claim("w1")
    with pytest.raises(ConfigurationError, match="worker_id"):
        await scheduler.store.tasks.claim("", names=["job"])


def test_naive_not_before_is_refused_and_an_aware_one_becomes_utc():
    """A naive time is ambiguous: taken as UTC, "now + 1 min" in Tokyo would wait 9 h."""
    with pytest.raises(ValidationError, match="not_before") as refused:
        ms.TaskOptions(not_before=dt.datetime(2030, 1, 1, 12, 0, 0))
    assert "timezone" in str(refused.value)
    tokyo = dt.timezone(dt.timedelta(hours=9))
    opts = ms.TaskOptions(not_before=dt.datetime(2030, 1, 1, 21, 0, 0, 123456, tzinfo=tokyo))
    assert opts.not_before == dt.datetime(2030, 1, 1, 12, 0, 0, 123000, tzinfo=dt.timezone.utc)


async def test_a_debounced_payload_must_fit_the_tasks_own_budget(scheduler: ms.Scheduler):
    """The task keeps its options (and the room they reserve for results and states); a
    debounce that brings smaller ones must not let the payload eat into that room."""
    roomy = ms.TaskOptions(concurrent_worker_cnt=4, max_unexpected_retries=50)
    await scheduler.publish("k", "small", name="job", options=roomy, debounce=5)
    big = "x" * (13 * 1024 * 1024)  # within the default options' budget, not within the task's
    with pytest.raises(PayloadError, match="payload"):
        await scheduler.publish("k", big, name="job", debounce=5)
    task = await scheduler.get("k")
    assert task is not None and task.payload == "small", "nothing written"


async def test_late_dependency_edges_must_fit_the_tasks_budget(scheduler: ms.Scheduler):
    """A task whose payload fills its budget cannot grow by new edges past it."""
    import bson

    from mscheduler.encoding import growth_reserve

    budget = 16 * 1024 * 1024 - growth_reserve(ms.TaskOptions())
    await scheduler.publish("fill", "x", name="job")  # as "full" will be, but for its payload
    probe = await scheduler.collection.find_one(
        {"key": "fill"}, {"worker_states": 0, "result": 0, "error": 0}
    )
    overhead = len(bson.encode(probe)) - 1
    await scheduler.publish("full", "x" * (budget - overhead - 100), name="job")  # 100 spare
    await scheduler.publish("before-" + "b" * 200, None, name="job")
    with pytest.raises(PayloadError, match="depends_on"):
        await scheduler.add_dependencies([("before-" + "b" * 200, "full")])
    task = await scheduler.get("full")
    assert task is not None and task.depends_on == [], "nothing written"
