"""Every query of docs/mongo-shell.md, read from the file and run on each engine."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import re
from typing import Any

import pytest

import mscheduler as ms
from mscheduler.testing import ManualClock
from tests.engines import NO_GRAPH_LOOKUP
from tests.scenarios.test_dependencies import finish

pytestmark = pytest.mark.anyio
DOC = pathlib.Path(__file__).parents[2] / "docs" / "mongo-shell.md"
BLOCK = re.compile(r"<!-- check: (?P<check>[\w-]+) -->\s*```js\n(?P<code>.*?)\n```", re.S)
CALL = re.compile(
    r'^db\.(?:tasks|getCollection\("tasks\.(?P<beside>schedules|paused|limits|partitions)"\))'
    r"\.(?P<method>find|aggregate)\((?P<args>.*?)\)"
    r"(?:\.sort\((?P<sort>.*?)\))?(?:\.limit\((?P<limit>\d+)\))?;?$"
)
NOW_MARK = '{"$now_placeholder": 1}'


def doc_queries() -> dict[str, str]:
    return {m["check"]: m["code"].strip() for m in BLOCK.finditer(DOC.read_text())}


def _with_now(value: Any, now: dt.datetime) -> Any:
    if value == {"$now_placeholder": 1}:
        return now
    if isinstance(value, dict):
        return {k: _with_now(v, now) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_now(v, now) for v in value]
    return value


def _arguments(text: str, now: dt.datetime) -> list[Any]:
    decoder = json.JSONDecoder()
    text = text.replace("new Date()", NOW_MARK)
    values, position = [], 0
    while position < len(text):
        value, position = decoder.raw_decode(text, position)
        values.append(_with_now(value, now))
        position = len(text) - len(text[position:].lstrip(", "))
    return values


async def run_doc_query(sched: ms.Scheduler, code: str) -> list[dict[str, Any]]:
    match = CALL.match(code)
    assert match is not None, f"not a query this test can run: {code}"
    now = sched.clock.now()
    args = _arguments(match["args"], now)
    # "tasks.schedules" is the schedules beside the tasks (named otherwise on the wire).
    store = sched.store
    beside = {
        "schedules": store.schedules,
        "paused": store.pauses,
        "limits": store.limits,
        "partitions": store.partitions,
    }
    collection = beside[match["beside"]].collection if match["beside"] else sched.collection
    if match["method"] == "aggregate":
        cursor = await collection.aggregate(args[0])
        return [doc async for doc in cursor]
    sort = _arguments(match["sort"], now)[0] if match["sort"] else None
    cursor = collection.find(
        *args,
        sort=list(sort.items()) if sort else None,
        limit=int(match["limit"] or 0),
    )
    return [doc async for doc in cursor]


@pytest.fixture
async def filled(open_scheduler: Any, clock: ManualClock) -> ms.Scheduler:
    sched = await open_scheduler(notablescan=False)  # operators' ad-hoc queries
    await sched.schedule("digest", name="digest", every=dt.timedelta(seconds=30))
    short = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=5_000)
    await sched.publish("waiting-old", None, name="email")
    clock.advance(60)
    await sched.publish("waiting-new", None, name="email")
    tenant = ms.TaskOptions(partition="tenant-7")
    await sched.publish_many(
        ms.TaskSpec(key=f"report:{n}", name="reports", options=tenant) for n in (1, 2)
    )
    await sched.publish("stuck", None, name="sms", options=short)
    assert await sched.store.tasks.claim("vanished", key="stuck") is not None
    await sched.publish("busy", None, name="sms")
    busy = await sched.store.tasks.claim("worker-1", key="busy")
    assert busy is not None
    await busy.progress(0.5, "half way")
    await sched.store.tasks.ping(busy)
    await sched.pause("sms", reason="provider outage")
    await sched.set_limit("email", rate=100, per=dt.timedelta(minutes=1))
    await sched.publish(
        "broken", None, name="sms", options=ms.TaskOptions(max_unexpected_retries=0)
    )
    await finish(sched, "broken", "fail")
    await sched.publish("extract", None, name="etl")
    await sched.publish("load", None, name="etl", depends_on=["extract"])
    await sched.publish("report", None, name="etl", depends_on=["load"])
    clock.advance(10)  # the stuck worker's lease has expired
    await sched.store.schedules.publish_due(["digest"])  # the occurrence of 00:01:00
    clock.advance(1)  # and the next one (00:01:30) is not due yet
    await sched.schedule("weekly", name="digest", cron="0 9 * * 1")
    await _publish_in_a_trace(sched)
    return sched


async def _publish_in_a_trace(sched: ms.Scheduler) -> None:
    """Two tasks published by a request whose trace id the doc's query names, one outside."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    request = SpanContext(TRACE_ID, 0xAB54A98CEB1F0AD2, True, TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(request)):
        await sched.publish("signup:7", None, name="welcome")
        await sched.publish_many([ms.TaskSpec(key="signup:7:crm", name="crm")])
    await sched.publish("signup:8", None, name="welcome")


TRACE_ID = 0x5CE0E9A56015FEC5AADFA328AE398115


async def test_every_documented_query_is_checked():
    assert set(doc_queries()) == set(EXPECTED)


def _keys(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(row["key"] for row in rows)


EXPECTED: dict[str, Any] = {
    "counts": lambda rows: (
        {(r["_id"]["name"], r["_id"]["state"]): r["count"] for r in rows}
        == {
            ("crm", "pending"): 1,
            ("digest", "pending"): 1,
            ("email", "pending"): 2,
            ("etl", "blocked"): 2,
            ("etl", "pending"): 1,
            ("sms", "fail"): 1,
            ("sms", "running"): 2,
            ("welcome", "pending"): 2,
            ("reports", "pending"): 2,
        }
    ),
    "oldest-pending": lambda rows: (
        {r["_id"]: r["waiting"] for r in rows}
        == {"crm": 1, "digest": 1, "email": 2, "etl": 1, "welcome": 2, "reports": 2}
        # a server returns aware datetimes (the client is tz_aware), mongomock naive UTC ones
        and _utc(min(r["oldest"] for r in rows)) == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    ),
    "stuck": lambda rows: _keys(rows) == ["stuck"],
    "by-worker": lambda rows: _keys(rows) == ["busy"],
    "failures": lambda rows: (
        _keys(rows) == ["broken"] and rows[0]["error"]["message"] == "broken broke"
    ),
    "blocked": lambda rows: (
        {r["key"]: r["deps_pending"] for r in rows} == {"load": ["extract"], "report": ["load"]}
    ),
    "upstream": lambda rows: (
        sorted((u["key"], u["depth"]) for u in rows[0]["upstream"]) == [("extract", 1), ("load", 0)]
    ),
    "dependents": lambda rows: _keys(rows) == ["load"],
    "schedules": lambda rows: (
        [(r["_id"], r.get("cron"), r.get("every_ms")) for r in rows]
        == [("digest", None, 30_000), ("weekly", "0 9 * * 1", None)]
    ),
    "paused": lambda rows: [(r["_id"], r["reason"]) for r in rows] == [("sms", "provider outage")],
    "limits": lambda rows: (
        [(r["_id"], r["rate"], r["per_ms"]) for r in rows] == [("email", 100, 60_000)]
    ),
    "partitions": lambda rows: (
        [(r["name"], r["partition"]) for r in rows] == [("reports", "tenant-7")]
    ),
    "partition-waiting": lambda rows: (
        _keys(rows) == ["report:1", "report:2"]
        and all(_utc(r["published_at"]) <= _utc(r["created_at"]) for r in rows)
    ),
    "progress": lambda rows: (
        _keys(rows) == ["busy"] and rows[0]["progress"]["message"] == "half way"
    ),
    "trace": lambda rows: (
        _keys(rows) == ["signup:7", "signup:7:crm"]
        and all(f"{TRACE_ID:032x}" in r["trace_context"]["traceparent"] for r in rows)
    ),
    "occurrences": lambda rows: (
        [(r["key"], r["state"]) for r in rows] == [("digest@20300101T000100Z", "pending")]
    ),
}


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("check", sorted(EXPECTED))
async def test_documented_query(filled: ms.Scheduler, check: str, engine: str):
    if check == "upstream" and engine == "wire":
        pytest.skip(NO_GRAPH_LOOKUP)
    rows = await run_doc_query(filled, doc_queries()[check])
    assert EXPECTED[check](rows), rows
