"""Prometheus metrics (``pip install 'mscheduler[metrics]'``): what workers do and queue sizes.

- counters of claims, successes, failures, aborts, retries-later, timeouts, lease losses and
  takeovers (claims of a task whose previous attempt's lease expired), and a histogram of
  handler durations, all by task name (fed by `ConsumerStats`);
- a counter of progress reports and a gauge of the last fraction reported, by task name,
  updated as the handler reports (before the coalesced write to the task);
- a gauge of tasks by name and state, refreshed from `Scheduler.stats` every ``refresh_s``
  seconds by `refresh_task_counts`.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import anyio

from ..errors import ConfigurationError, MSchedulerError
from ..models import StatsRow

log = logging.getLogger(__name__)

_COUNTED = {
    "claimed": "claims",
    "succeeded": "successes",
    "failed": "failures",
    "aborted": "aborts",
    "deferred": "retries_later",
    "timeouts": "timeouts",
    "lease_lost": "lease_losses",
    "takeovers": "takeovers",
    "progress_reports": "progress_reports",
}
_TIMED = {"succeeded", "failed", "deferred"}


class Counts(Protocol):
    """What the task gauge reads: `Scheduler.stats` (a protocol, so that this module, which
    the consumers report to, sits below the API that builds them)."""

    async def stats(self) -> list[StatsRow]: ...


def require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'mscheduler[metrics]'"
        ) from exc
    return prometheus_client


class PrometheusMetrics:
    """A `ConsumerStats` observer: ``consumer.stats.observers.append(metrics)``."""

    def __init__(self, registry: Any = None) -> None:
        prometheus = require_prometheus()
        self.registry = registry if registry is not None else prometheus.CollectorRegistry()
        self.counters = {
            event: prometheus.Counter(
                f"mscheduler_{metric}",
                f"Task {metric.replace('_', ' ')}, by task name",
                ["name"],
                registry=self.registry,
            )
            for event, metric in _COUNTED.items()
        }
        self.handler_seconds = prometheus.Histogram(
            "mscheduler_handler_seconds",
            "Handler wall time, local retries included",
            ["name"],
            registry=self.registry,
        )
        self.progress_fraction = prometheus.Gauge(
            "mscheduler_progress",
            "Last progress fraction (0 to 1) a handler of this name reported",
            ["name"],
            registry=self.registry,
        )
        self.tasks = prometheus.Gauge(
            "mscheduler_tasks",
            "Tasks by name and state",
            ["name", "state"],
            registry=self.registry,
        )

    def record(self, event: str, name: str, seconds: float | None) -> None:
        counter = self.counters.get(event)
        if counter is not None:
            counter.labels(name=name).inc()
        if event in _TIMED and seconds is not None:
            self.handler_seconds.labels(name=name).observe(seconds)

    def progress(self, name: str, fraction: float) -> None:
        self.progress_fraction.labels(name=name).set(fraction)

    async def refresh_task_counts(self, sched: Counts) -> None:
        self.tasks.clear()
        for row in await sched.stats():
            self.tasks.labels(name=row.name, state=row.state.value).set(row.count)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``port`` (a background thread of prometheus-client)."""
        require_prometheus().start_http_server(port, addr=address, registry=self.registry)

    def render(self) -> str:
        return str(require_prometheus().generate_latest(self.registry).decode())


async def refresh_task_counts(
    sched: Counts, metrics: PrometheusMetrics, refresh_s: float = 15.0
) -> None:
    """Keep the task gauge current; a failed refresh is logged and tried again later."""
    while True:
        try:
            await metrics.refresh_task_counts(sched)
        except MSchedulerError as exc:
            log.warning("metrics refresh failed: %s", exc, extra={"action": "metrics_error"})
        await anyio.sleep(refresh_s)
