"""OpenTelemetry's SDK for the tests: one tracer provider and one meter provider for the
session (OpenTelemetry's global providers can be set once per process), recording only while
a test asks, so the rest of the suite does not fill memory with spans."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind


class _Recording(SimpleSpanProcessor):
    """Exports ended spans only while ``on``."""

    on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            super().on_end(span)


EXPORTER = InMemorySpanExporter()
_PROCESSOR = _Recording(EXPORTER)
METRICS = InMemoryMetricReader()
_installed = False


def install() -> None:
    global _installed
    if not _installed:
        provider = TracerProvider()
        provider.add_span_processor(_PROCESSOR)
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[METRICS]))
        _installed = True


class Spans:
    """The spans ended while recording, with the look-ups the tests need."""

    def __iter__(self) -> Iterator[ReadableSpan]:
        return iter(EXPORTER.get_finished_spans())

    def of_kind(self, kind: SpanKind, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self if s.kind is kind and (name is None or s.name == name)]

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [s.name for s in self]
        return found[0]


def recording() -> Iterator[Spans]:
    install()
    EXPORTER.clear()
    _PROCESSOR.on = True
    try:
        yield Spans()
    finally:
        _PROCESSOR.on = False
        EXPORTER.clear()


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def ids(spans: Sequence[ReadableSpan]) -> list[int]:
    assert all(s.context is not None for s in spans)
    return [s.context.span_id for s in spans if s.context is not None]
