"""OpenTelemetry traces (``pip install 'mscheduler[otel]'``): a task runs inside the trace
that published it.

A publish runs in a PRODUCER span whose context is written into the new task document
(``trace_context``: the carrier of the application's propagator, W3C ``traceparent`` and
``tracestate`` by default). Each handler call runs in a CONSUMER span whose parent is that
context, made current for the handler: in its asyncio task, and in the worker thread of a
plain ``def`` handler (anyio runs it in a copy of the caller's context), so the handler's own
spans join the publisher's trace, on whatever machine it runs.

Nothing here turns itself on: without opentelemetry-api nothing is imported and every hook
is a no-op; with it, the API's own no-op tracer serves until the application configures a
tracer provider (a context that arrives from elsewhere is still passed on, as OpenTelemetry
itself does).

``messaging.system`` is ``"mscheduler"``, not ``"mongodb"``: the value names the messaging
system whose semantics the spans describe (DB-backed queues name themselves, as Sidekiq's
and Delayed Job's instrumentations do); MongoDB is the storage, and ``db.system.name:
mongodb`` already marks the driver's own spans, which would be mixed up with these.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

from ..__about__ import __version__
from ..errors import Abort, RetryLater
from ..models import Lease

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode

    AVAILABLE = True
except ImportError:  # the extra is not installed: every hook below is a no-op
    AVAILABLE = False

SYSTEM = "mscheduler"
FIELD = "trace_context"  # the task document's field that carries the publisher's context

# Attribute names: OpenTelemetry's messaging conventions, then ours.
ATTR_SYSTEM = "messaging.system"
ATTR_OPERATION_TYPE = "messaging.operation.type"
ATTR_OPERATION_NAME = "messaging.operation.name"
ATTR_DESTINATION = "messaging.destination.name"  # the task name
ATTR_MESSAGE_ID = "messaging.message.id"  # the task key
ATTR_BATCH_COUNT = "messaging.batch.message_count"
ATTR_CLIENT_ID = "messaging.client.id"  # the worker id
ATTR_ATTEMPT = "mscheduler.task.attempt"  # 1 for the first claim of the task
ATTR_RUN_ID = "mscheduler.run.id"
ATTR_OUTCOME = "mscheduler.run.outcome"  # success | fail | abort | retry_later | stopped
ATTR_SCHEDULE = "mscheduler.schedule.id"


# Set inside a publishing span: a publish inside another (a batch's tasks, a replace that
# finds nothing to replace) runs in the outer one rather than opening its own.
_publishing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mscheduler_publishing", default=False
)
Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])


@functools.cache
def _tracer() -> Any:
    """Once: the API's proxy tracer hands over to the provider the application sets later."""
    return trace.get_tracer("mscheduler", __version__)


def _configured() -> bool:
    """Has the application set a tracer provider? Until then the API's spans record nothing,
    and only a context that came from elsewhere (a current span, a task's) is worth passing
    on: the hooks skip the rest, so tracing costs a publish next to nothing when off."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def carrier() -> dict[str, str] | None:
    """The current context as the task document stores it (with the span, what else the
    application's propagator carries, such as baggage); None when no span is current."""
    if not AVAILABLE or not trace.get_current_span().get_span_context().is_valid:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    return found or None


@contextlib.contextmanager
def publishing(
    operation: str,
    names: Sequence[str],
    *,
    key: str | None = None,
    count: int | None = None,
    schedule_id: str | None = None,
) -> Iterator[None]:
    """The PRODUCER span of one publishing call (``publish``, ``replace``, ``publish_many``),
    current while the documents are built, so each carries its context. One span per call:
    every task of a batch carries the batch's span. A schedule's occurrence
    (``schedule_id``) starts a trace of its own, whatever the housekeeping ran in."""
    if not AVAILABLE or _publishing.get() or not _configured():
        yield  # a current context is still written by `carrier`
        return
    distinct = sorted(set(names))
    attributes: dict[str, Any] = {
        ATTR_SYSTEM: SYSTEM,
        ATTR_OPERATION_TYPE: "send",
        ATTR_OPERATION_NAME: operation,
    }
    if len(distinct) == 1:
        attributes[ATTR_DESTINATION] = distinct[0]
    if key is not None:
        attributes[ATTR_MESSAGE_ID] = key
    if count is not None:
        attributes[ATTR_BATCH_COUNT] = count
    if schedule_id is not None:
        attributes[ATTR_SCHEDULE] = schedule_id
    name = f"{operation} {distinct[0]}" if len(distinct) == 1 else operation
    parent = Context() if schedule_id is not None else None  # an empty context: a new trace
    token = _publishing.set(True)
    try:
        with _tracer().start_as_current_span(
            name, context=parent, kind=SpanKind.PRODUCER, attributes=attributes
        ):
            yield
    finally:
        _publishing.reset(token)


def producer(operation: str) -> Callable[[Method], Method]:
    """`publishing` around a method called with a ``spec`` (a `PublishSpec`: the
    publisher's ``publish`` and ``replace``)."""

    def decorate(method: Method) -> Method:
        signature = inspect.signature(method)

        @functools.wraps(method)
        async def traced(*args: Any, **kwargs: Any) -> Any:
            spec = signature.bind(*args, **kwargs).arguments["spec"]
            with publishing(operation, [spec.name], key=spec.key):
                return await method(*args, **kwargs)

        return cast(Method, traced)

    return decorate


def _parent(trace_context: Mapping[str, str] | None) -> Context:
    """The publisher's context; an empty one (a new trace) when the task carries none, so a
    run never joins whatever span happened to be current where the consumer started."""
    return propagate.extract(dict(trace_context or {}), context=Context())


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises must not break the run
        message = ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _failed(span: Span, exc: BaseException, outcome: str) -> None:
    span.set_attribute(ATTR_OUTCOME, outcome)
    try:
        span.record_exception(exc)
    except Exception:  # its __str__ raised: the event without the SDK's message, not a crash
        attributes = {"exception.type": type(exc).__qualname__, "exception.message": _describe(exc)}
        span.add_event("exception", attributes)
    span.set_status(Status(StatusCode.ERROR, _describe(exc)))


@contextlib.contextmanager
def processing(lease: Lease, stop_reason: Callable[[], str | None]) -> Iterator[None]:
    """The CONSUMER span of one handler call, current while it runs; its parent is the
    context the task was published in. Each call is a span: a retry (claimed again, or
    retried locally) is a span of its own. A failure sets status ERROR and records the
    exception as an event; `RetryLater` is not a failure; a run stopped from outside (remote
    cancel, lost lease, shutdown) is ERROR with ``stop_reason()`` as its description."""
    if not AVAILABLE:
        yield
        return
    task = lease.task
    if not _configured():  # no span to record; the publisher's context still passes on
        token = otel_context.attach(_parent(task.trace_context))
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    attributes: dict[str, Any] = {
        ATTR_SYSTEM: SYSTEM,
        ATTR_OPERATION_TYPE: "process",
        ATTR_OPERATION_NAME: "process",
        ATTR_DESTINATION: task.name,
        ATTR_MESSAGE_ID: task.key,
        ATTR_CLIENT_ID: lease.worker_id,
        ATTR_ATTEMPT: task.attempts,
        ATTR_RUN_ID: lease.run_id,
    }
    with _tracer().start_as_current_span(
        f"process {task.name}",
        context=_parent(task.trace_context),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except RetryLater as exc:
            span.set_attribute(ATTR_OUTCOME, "retry_later")
            span.add_event("retry_later", {"delay_s": exc.delay, "reason": exc.reason})
            raise
        except Abort as exc:
            _failed(span, exc, "abort")
            raise
        except Exception as exc:
            _failed(span, exc, "fail")
            raise
        except BaseException:
            span.set_attribute(ATTR_OUTCOME, "stopped")
            span.set_status(Status(StatusCode.ERROR, f"stopped: {stop_reason() or 'cancelled'}"))
            raise
        span.set_attribute(ATTR_OUTCOME, "success")
