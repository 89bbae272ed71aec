"""OpenTelemetry: a task runs inside the trace that published it, on both engines.

The SDK's in-memory exporter records the spans (`tests.otel`); the clock is the test's."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import mscheduler as ms
from mscheduler.handlers import Consumer
from mscheduler.testing import ManualClock
from tests import otel
from tests.engines import POLL_MS, ROOT, WIRE_DATABASE, WireServer, until_idle

pytestmark = pytest.mark.anyio
Discover = Callable[[], Awaitable[None]]
tracer = trace.get_tracer("tests")


@pytest.fixture
def spans() -> Iterator[otel.Spans]:
    yield from otel.recording()


@contextlib.asynccontextmanager
async def running(
    sched: ms.Scheduler, handlers: dict[str, Any], worker_id: str = "w1"
) -> AsyncIterator[Consumer]:
    options = ms.WorkerOptions(worker_id=worker_id, poll_interval_ms=POLL_MS)
    async with sched.consumer(handlers, options=options) as consumer:
        yield consumer


def traceparent_of(span: Any) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


async def test_a_run_is_a_child_of_the_publish_and_the_handler_spans_join_it(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans
):
    async def handler(task: ms.Task) -> str:
        with tracer.start_as_current_span("inside the handler"):
            return "done"

    with tracer.start_as_current_span("request"):
        await scheduler.publish("email:42", {"to": "a@b.c"}, name="email")
    async with running(scheduler, {"email": handler}):
        await discover()
    assert (await scheduler.get("email:42")).state is ms.TaskState.SUCCESS

    request, publish = spans.one("request"), spans.one("publish email")
    process, inside = spans.one("process email"), spans.one("inside the handler")
    assert publish.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert otel.parent_of(publish) == request.context.span_id
    assert otel.parent_of(process) == publish.context.span_id
    assert otel.parent_of(inside) == process.context.span_id
    assert {s.context.trace_id for s in (request, publish, process, inside)} == {
        request.context.trace_id
    }
    assert dict(publish.attributes or {}) == {
        "messaging.system": "mscheduler",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "email",
        "messaging.message.id": "email:42",
    }
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "mscheduler"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "email"
    assert attributes["messaging.message.id"] == "email:42"
    assert attributes["messaging.client.id"] == "w1"
    assert attributes["mscheduler.task.attempt"] == 1
    assert attributes["mscheduler.run.outcome"] == "success"
    assert process.status.status_code is StatusCode.UNSET
    # The documented field, readable from the shell.
    document = await scheduler.collection.find_one({"key": "email:42"})
    assert document["trace_context"] == {"traceparent": traceparent_of(publish)}


async def test_a_sync_handler_runs_in_the_consumer_span_in_its_thread(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans
):
    def thumbnail(task: ms.Task) -> None:
        with tracer.start_as_current_span("in the thread"):
            pass

    await scheduler.publish("thumb:1", None, name="thumbnail")
    async with running(scheduler, {"thumbnail": thumbnail}):
        await discover()
    assert (await scheduler.get("thumb:1")).state is ms.TaskState.SUCCESS
    process = spans.one("process thumbnail")
    assert otel.parent_of(spans.one("in the thread")) == process.context.span_id
    assert otel.parent_of(process) == spans.one("publish thumbnail").context.span_id


async def test_each_attempt_is_a_span_and_a_failure_is_an_error_with_its_exception(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock, spans: otel.Spans
):
    calls = 0

    async def flaky(task: ms.Task) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("smtp down")

    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=1_000)
    await scheduler.publish("email:1", None, name="email", options=options)
    async with running(scheduler, {"email": flaky}):
        await discover()
        clock.advance(1)
        await discover()
    assert (await scheduler.get("email:1")).state is ms.TaskState.SUCCESS

    publish = spans.one("publish email")
    first, second = sorted(spans.named("process email"), key=lambda s: s.start_time or 0)
    assert [otel.parent_of(first), otel.parent_of(second)] == [publish.context.span_id] * 2
    assert [s.attributes["mscheduler.task.attempt"] for s in (first, second)] == [1, 2]
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "ConnectionError: smtp down"
    assert first.attributes["mscheduler.run.outcome"] == "fail"
    [event] = first.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ConnectionError"
    assert second.status.status_code is StatusCode.UNSET
    assert second.attributes["mscheduler.run.outcome"] == "success"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


async def test_a_failure_whose_str_raises_is_its_tasks_failure_with_tracing_on(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans
):
    """Recording the exception on the span must not replace the handler's failure with the
    error its ``__str__`` raised (the SDK's record_exception calls it)."""

    async def odd(task: ms.Task) -> None:
        raise _Unprintable()

    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("odd", None, name="odd", options=once)
    async with running(scheduler, {"odd": odd}):
        await discover()
    task = await scheduler.get("odd")
    assert task is not None and task.state is ms.TaskState.FAIL and task.error is not None
    assert "str() of this _Unprintable raised RuntimeError" in task.error.message
    process = spans.one("process odd")
    assert process.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in process.events] == ["_Unprintable"]


async def test_retry_later_is_not_an_error_and_a_stopped_run_is(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock, spans: otel.Spans
):
    gate = anyio.Event()

    async def later(task: ms.Task) -> None:
        raise ms.RetryLater(60, "not yet")

    async def slow(task: ms.Task) -> None:
        await gate.wait()

    await scheduler.publish("later", None, name="later")
    fast = ms.TaskOptions(ping_interval_ms=1_000, worker_timeout_ms=5_000)
    await scheduler.publish("slow", None, name="slow", options=fast)
    async with running(scheduler, {"later": later, "slow": slow}):
        await discover()
        assert await scheduler.cancel("slow")
        clock.advance(1)  # a polling consumer sees the cancel at its next ping
        await discover()
    deferred, stopped = spans.one("process later"), spans.one("process slow")
    assert deferred.status.status_code is StatusCode.UNSET
    assert deferred.attributes["mscheduler.run.outcome"] == "retry_later"
    assert [e.name for e in deferred.events] == ["retry_later"]
    assert stopped.status.status_code is StatusCode.ERROR
    assert stopped.status.description in (  # the worker's reason: the event, or the ping
        "stopped: the task is cancelled and no longer held",
        "stopped: the lease was lost (found at ping)",
    )
    assert stopped.attributes["mscheduler.run.outcome"] == "stopped"


@pytest.mark.parametrize("shape", ["chain", "flat"])
async def test_the_tasks_of_a_batch_are_children_of_its_one_span(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans, shape: str
):
    steps = [ms.TaskSpec(key=f"step:{n}", name="step") for n in range(3)]
    with tracer.start_as_current_span("request"):
        await scheduler.publish_many(ms.chain(*steps) if shape == "chain" else steps)
    async with running(scheduler, {"step": lambda task: None}):
        for _ in steps:
            await discover()
    assert [t.state for t in (await scheduler.wait_many([s.key for s in steps])).values()] == [
        ms.TaskState.SUCCESS
    ] * 3
    [batch] = spans.of_kind(SpanKind.PRODUCER)  # one span, not one per task
    assert batch.name == "publish step"
    assert batch.attributes["messaging.batch.message_count"] == 3
    runs = spans.named("process step")
    assert sorted(r.attributes["messaging.message.id"] for r in runs) == [s.key for s in steps]
    assert {otel.parent_of(r) for r in runs} == {batch.context.span_id}
    assert all(not r.links for r in runs)  # a parent, not a link


async def test_replace_runs_in_the_trace_of_the_replace_and_a_second_publish_in_neither(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans
):
    with tracer.start_as_current_span("first"):
        await scheduler.publish("report", {"v": 1}, name="report")
    with tracer.start_as_current_span("second"):
        assert not (await scheduler.publish("report", {"v": 1}, name="report")).created
    with tracer.start_as_current_span("third"):
        assert (await scheduler.replace("report", {"v": 2}, name="report")).replaced
    async with running(scheduler, {"report": lambda task: None}):
        await discover()
    replace = spans.one("replace report")
    assert otel.parent_of(replace) == spans.one("third").context.span_id
    assert otel.parent_of(spans.one("process report")) == replace.context.span_id


async def test_a_task_a_handler_publishes_in_a_commit_continues_the_trace(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans
):
    async def extract(task: ms.Task) -> None:
        next_step = ms.TaskSpec(key="load", name="load")
        await scheduler.commit(complete=[(ms.current_lease(), None)], publish=[next_step])

    with tracer.start_as_current_span("request") as request:
        await scheduler.publish("extract", None, name="extract")
    async with running(scheduler, {"extract": extract, "load": lambda task: None}):
        await discover()
        await discover()
    assert (await scheduler.get("load")).state is ms.TaskState.SUCCESS
    first, publish = spans.one("process extract"), spans.one("publish load")
    assert otel.parent_of(publish) == first.context.span_id
    assert otel.parent_of(spans.one("process load")) == publish.context.span_id
    assert {s.context.trace_id for s in spans} == {request.get_span_context().trace_id}


async def test_a_task_without_a_trace_context_runs_in_a_new_trace(
    scheduler: ms.Scheduler, discover: Discover, spans: otel.Spans
):
    await scheduler.publish("old", None, name="job")
    # A task published before tracing was on, or by a process without opentelemetry.
    await scheduler.collection.update_one({"key": "old"}, {"$set": {"trace_context": None}})
    with tracer.start_as_current_span("where the worker started") as ambient:
        async with running(scheduler, {"job": lambda task: None}):
            await discover()
    process = spans.one("process job")
    assert process.parent is None
    assert process.context.trace_id != ambient.get_span_context().trace_id


async def test_a_periodic_occurrence_starts_a_trace_of_its_own(
    scheduler: ms.Scheduler, discover: Discover, clock: ManualClock, spans: otel.Spans
):
    import datetime as dt

    await scheduler.schedule("heartbeat", name="beat", every=dt.timedelta(minutes=1))
    with tracer.start_as_current_span("where the worker started") as ambient:
        async with running(scheduler, {"beat": lambda task: None}):
            clock.advance(60)
            await discover()
            clock.advance(60)
            await discover()
    publishes = spans.named("publish beat")
    assert len(publishes) == 2
    assert all(p.parent is None for p in publishes)  # roots: each occurrence a new trace
    assert len({p.context.trace_id for p in publishes}) == 2
    assert ambient.get_span_context().trace_id not in {p.context.trace_id for p in publishes}
    assert {p.attributes["mscheduler.schedule.id"] for p in publishes} == {"heartbeat"}
    runs = spans.named("process beat")
    assert {otel.parent_of(r) for r in runs} == {p.context.span_id for p in publishes}


PUBLISHER = """
import json, sys
import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
import mscheduler as ms

trace.set_tracer_provider(TracerProvider())

async def main() -> None:
    uri, database, collection = sys.argv[1:]
    async with await ms.Scheduler.connect(uri, database=database, collection=collection) as s:
        with trace.get_tracer("web").start_as_current_span("POST /signup") as request:
            await s.publish("welcome:7", {"user": 7}, name="welcome")
        context = request.get_span_context()
        print(json.dumps({"trace_id": context.trace_id, "span_id": context.span_id}))

anyio.run(main)
"""


async def test_a_publisher_and_a_worker_in_two_processes_share_the_trace(
    wire_server: WireServer, clock: ManualClock, spans: otel.Spans
):
    """Two Schedulers on the wire engine: the publisher in a process of its own (its own
    tracer provider), the worker here; the trace travels in the task document."""
    collection = f"t_{uuid.uuid4().hex[:16]}"
    published = await anyio.run_process(
        [sys.executable, "-c", PUBLISHER, wire_server.uri, WIRE_DATABASE, collection],
        cwd=ROOT,
    )
    request = json.loads(published.stdout)
    sched = await ms.Scheduler.connect(
        wire_server.uri, database=WIRE_DATABASE, collection=collection, clock=clock
    )
    async with sched:
        try:
            async with running(sched, {"welcome": lambda task: None}, worker_id="far-away"):
                await until_idle()
                clock.advance(POLL_MS / 1000)  # the wire engine has no change streams: a poll
                await until_idle()
            task = await sched.get("welcome:7")
        finally:
            await sched.collection.drop()
    assert task is not None and task.state is ms.TaskState.SUCCESS
    process = spans.one("process welcome")
    assert process.context.trace_id == request["trace_id"]
    # Its parent is the other process's publish span, the request's child, as the document says.
    assert process.parent is not None and process.parent.is_remote
    assert process.parent.span_id != request["span_id"]
    assert task.trace_context == {
        "traceparent": f"00-{request['trace_id']:032x}-{process.parent.span_id:016x}"
        f"-{int(process.parent.trace_flags):02x}"
    }


WITHOUT_OPENTELEMETRY = """
import importlib.abc
import sys


class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"{name} is not installed here")
        return None


sys.meta_path.insert(0, NoOpenTelemetry())

import anyio

import mscheduler as ms


async def main() -> None:
    async with await ms.Scheduler.connect("memory://") as sched:
        await sched.publish("one", None, name="job")
        await sched.publish_many([ms.TaskSpec(key="two", name="job")])
        async with sched.consumer({"job": lambda task: "done"}):
            tasks = await sched.wait_many(["one", "two"], timeout=30)
    assert [t.state.value for t in tasks.values()] == ["success", "success"], tasks
    assert [t.trace_context for t in tasks.values()] == [None, None], tasks
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    assert not loaded, loaded
    print("ok")


anyio.run(main)
"""


async def test_without_opentelemetry_nothing_is_imported_and_tasks_run():
    """The extra is optional: with opentelemetry unimportable, mscheduler imports, publishes
    and runs tasks, and no opentelemetry module is loaded."""
    with anyio.fail_after(120):  # a child that never ends fails the test, not the run
        done = await anyio.run_process([sys.executable, "-c", WITHOUT_OPENTELEMETRY], cwd=ROOT)
    assert done.stdout.decode().strip() == "ok"


WITHOUT_A_PROVIDER = """
import sys

import anyio
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import mscheduler as ms

# A context that came from elsewhere (an incoming request's traceparent), no provider set.
incoming = SpanContext(0x5CE0E9A56015FEC5AADFA328AE398115, 0xAB54A98CEB1F0AD2, True,
                       TraceFlags(TraceFlags.SAMPLED))
seen = []


def handler(task):
    seen.append(trace.get_current_span().get_span_context())


async def main() -> None:
    async with await ms.Scheduler.connect("memory://") as sched:
        with trace.use_span(NonRecordingSpan(incoming)):
            await sched.publish("passed-on", None, name="job")
        await sched.publish("alone", None, name="job")
        async with sched.consumer({"job": handler}):
            tasks = await sched.wait_many(["passed-on", "alone"], timeout=30)
    assert tasks["passed-on"].trace_context == {
        "traceparent": "00-5ce0e9a56015fec5aadfa328ae398115-ab54a98ceb1f0ad2-01"
    }, tasks
    assert tasks["alone"].trace_context is None, tasks
    assert [c.trace_id for c in seen if c.is_valid] == [incoming.trace_id], seen
    print("ok")


anyio.run(main)
"""


async def test_without_a_provider_no_span_is_made_and_a_context_from_elsewhere_passes_on():
    """No tracer provider configured: publish and run make no span of their own, yet a
    context the publisher was in reaches the handler (as OpenTelemetry propagates it)."""
    with anyio.fail_after(120):
        done = await anyio.run_process([sys.executable, "-c", WITHOUT_A_PROVIDER], cwd=ROOT)
    assert done.stdout.decode().strip() == "ok"
