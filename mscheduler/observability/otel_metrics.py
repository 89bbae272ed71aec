"""OpenTelemetry metrics (``pip install 'mscheduler[otel]'``): the Prometheus exporter's
figures (`prometheus`) through OpenTelemetry's metrics API, for applications that export there.

- ``mscheduler.task.claims`` (counter) and ``mscheduler.task.finished`` (counter, by
  ``mscheduler.run.outcome``: success, fail (aborts included), retry_later, timeout,
  lease_lost), by task name (``messaging.destination.name``);
- ``mscheduler.task.takeovers`` (counter): claims that took over an attempt whose lease
  expired (its worker died or stopped pinging), by task name;
- ``mscheduler.task.duration`` (histogram, s): handler wall time, local retries included;
- ``mscheduler.task.claim_latency`` (histogram, s): from when a task could first be claimed
  (published, or its ``not_before``) to its first claim; tasks with dependencies are left
  out (when they became claimable is not kept);
- ``mscheduler.task.progress_reports`` (counter) and ``mscheduler.task.progress`` (gauge, 0
  to 1: the last fraction a handler of the name reported), by task name, as reported;
- ``mscheduler.tasks`` (gauge): tasks by name and ``mscheduler.task.state``, per collection
  (``mscheduler.collection``), as `Scheduler.stats` counts them. The consumers' housekeeping
  (every ``schedule_refresh_ms``) refreshes it, and only once a reader has collected it, so
  it costs no read where no meter provider is configured.

Every consumer reports here without being asked (`ConsumerStats` observers); the API's no-op
meter serves until the application configures a meter provider. Without opentelemetry-api
nothing is imported and nothing is recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ..__about__ import __version__
from ..models import Lease, StatsRow

try:
    from opentelemetry import metrics

    AVAILABLE = True
except ImportError:  # the extra is not installed: nothing is recorded
    AVAILABLE = False

ATTR_NAME = "messaging.destination.name"
ATTR_OUTCOME = "mscheduler.run.outcome"
ATTR_STATE = "mscheduler.task.state"
ATTR_COLLECTION = "mscheduler.collection"

_OUTCOMES = {  # ConsumerStats events that end a run, and the outcome they count as
    "succeeded": "success",
    "failed": "fail",
    "deferred": "retry_later",
    "timeouts": "timeout",
    "lease_lost": "lease_lost",
}
_TIMED = {"succeeded", "failed", "deferred"}


class OtelMetrics:
    """The instruments, created once per process from the global meter provider (a proxy
    until the application sets one, which then takes over)."""

    def __init__(self) -> None:
        meter = metrics.get_meter("mscheduler", __version__)
        self.claims = meter.create_counter(
            "mscheduler.task.claims", unit="{claim}", description="Tasks claimed, by name"
        )
        self.finished = meter.create_counter(
            "mscheduler.task.finished", unit="{run}", description="Runs ended, by outcome"
        )
        self.takeovers = meter.create_counter(
            "mscheduler.task.takeovers",
            unit="{claim}",
            description="Claims that took over an attempt whose lease expired, by name",
        )
        self.duration = meter.create_histogram(
            "mscheduler.task.duration",
            unit="s",
            description="Handler wall time, local retries included",
        )
        self.claim_latency = meter.create_histogram(
            "mscheduler.task.claim_latency",
            unit="s",
            description="From when a task could first be claimed to its first claim",
        )
        self.progress_reports = meter.create_counter(
            "mscheduler.task.progress_reports",
            unit="{report}",
            description="Progress reported by handlers, by name",
        )
        meter.create_observable_gauge(
            "mscheduler.task.progress",
            callbacks=[self._observe_progress],
            unit="1",
            description="Last progress fraction reported by a handler of the name",
        )
        meter.create_observable_gauge(
            "mscheduler.tasks",
            callbacks=[self._observe_counts],
            unit="{task}",
            description="Tasks by name and state",
        )
        self._lock = threading.Lock()  # readers collect from threads of their own
        self._counts: dict[str, list[StatsRow]] = {}
        self._counts_wanted = False
        self._progress: dict[str, float] = {}

    def record(self, event: str, name: str, seconds: float | None) -> None:
        """A `ConsumerStats` observer."""
        attributes: dict[str, Any] = {ATTR_NAME: name}
        if event == "claimed":
            self.claims.add(1, attributes)
        if event == "progress_reports":
            self.progress_reports.add(1, attributes)
        if event == "takeovers":
            self.takeovers.add(1, attributes)
        outcome = _OUTCOMES.get(event)
        if outcome is None:
            return
        attributes[ATTR_OUTCOME] = outcome
        self.finished.add(1, attributes)
        if event in _TIMED and seconds is not None:
            self.duration.record(seconds, attributes)

    def progress(self, name: str, fraction: float) -> None:
        """A `ConsumerStats` observer's optional part: the last fraction of the name."""
        with self._lock:
            self._progress[name] = fraction

    def _observe_progress(self, options: Any) -> Iterable[Any]:
        with self._lock:
            last = dict(self._progress)
        return [metrics.Observation(fraction, {ATTR_NAME: name}) for name, fraction in last.items()]

    def claimed(self, lease: Lease) -> None:
        latency = claim_latency(lease)
        if latency is not None:
            self.claim_latency.record(latency, {ATTR_NAME: lease.task.name})

    def counts_wanted(self) -> bool:
        """Has a reader collected the task counts since they were last refreshed?"""
        with self._lock:
            return self._counts_wanted

    def set_counts(self, collection: str, rows: Sequence[StatsRow]) -> None:
        with self._lock:
            self._counts[collection] = list(rows)
            self._counts_wanted = False

    def _observe_counts(self, options: Any) -> Iterable[Any]:
        with self._lock:
            self._counts_wanted = True
            counts = {collection: list(rows) for collection, rows in self._counts.items()}
        for collection, rows in counts.items():
            for row in rows:
                attributes = {
                    ATTR_COLLECTION: collection,
                    ATTR_NAME: row.name,
                    ATTR_STATE: row.state.value,
                }
                yield metrics.Observation(row.count, attributes)


def claim_latency(lease: Lease) -> float | None:
    """Seconds from when the task could first be claimed to this claim: first claims of
    tasks without dependencies only. Publisher and worker clocks may differ: never below 0."""
    task = lease.task
    if task.attempts != 1 or task.depends_on:
        return None
    own = next((ws for ws in task.worker_states if ws.run_id == lease.run_id), None)
    if own is None or own.started_at is None:
        return None
    ready = max(task.created_at, task.not_before or task.created_at)
    return max(0.0, (own.started_at - ready).total_seconds())


_instance: OtelMetrics | None = None


def instance() -> OtelMetrics | None:
    """The process's instruments; None without opentelemetry-api."""
    global _instance
    if AVAILABLE and _instance is None:
        _instance = OtelMetrics()
    return _instance


def claimed(lease: Lease) -> None:
    found = instance()
    if found is not None:
        found.claimed(lease)


def taken_over(name: str) -> None:
    """A takeover by a claim that no consumer counts (`Scheduler.own`)."""
    found = instance()
    if found is not None:
        found.record("takeovers", name, None)


def observers() -> list[OtelMetrics]:
    """What a new `ConsumerStats` reports to."""
    found = instance()
    return [] if found is None else [found]
