"""What a consumer counts, and who is told (the Prometheus exporter is one observer)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ..observability import otel_metrics


class StatsObserver(Protocol):
    """Receives every event a consumer counts (the Prometheus exporter is one)."""

    def record(self, event: str, name: str, seconds: float | None) -> None: ...


def _default_observers() -> list[StatsObserver]:
    """OpenTelemetry's metrics API hears every consumer (a no-op until a provider is set)."""
    return [*otel_metrics.observers()]


@dataclasses.dataclass
class ConsumerStats:
    """What a consumer did; read by tests, benchmarks and the metrics exporter."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    aborted: int = 0
    deferred: int = 0  # RetryLater
    handler_retries: int = 0
    lease_lost: int = 0
    takeovers: int = 0  # claims that took over an attempt whose lease expired (`takeover`)
    timeouts: int = 0  # this worker's lease expired before a ping got through
    released: int = 0
    cancelled: int = 0
    abandoned: int = 0  # handlers that ignored cancellation past cancel_timeout_ms
    pings: int = 0
    events: int = 0  # change events received (only writes that may give work: see listener)
    limited: int = 0  # claims of a name held back by its limit (`Scheduler.set_limit`)
    rescheduled: int = 0  # reads after a claim found nothing claimable (Claimer._reschedule)
    progress_reports: int = 0  # calls of a handler's ``progress`` (each, before coalescing)
    observers: list[StatsObserver] = dataclasses.field(
        default_factory=_default_observers, repr=False
    )

    def record(self, event: str, name: str = "", seconds: float | None = None) -> None:
        setattr(self, event, getattr(self, event) + 1)
        for observer in self.observers:
            observer.record(event, name, seconds)

    def progress(self, name: str, fraction: float) -> None:
        """A handler of ``name`` reported ``fraction``: counted, and the observers that keep
        the last fraction (an optional ``progress`` method) told at once."""
        self.record("progress_reports", name)
        for observer in self.observers:
            keep = getattr(observer, "progress", None)
            if keep is not None:
                keep(name, fraction)
