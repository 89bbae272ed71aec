"""A takeover: a claim that took the slot of an attempt whose lease expired (its worker died,
hung or lost the network), told in the log and counted in the metrics, as each claim is
started (`Claimer`) or handed out (`Scheduler.own`)."""

from __future__ import annotations

import logging

from ..models import Lease
from ..observability import otel_metrics
from .stats import ConsumerStats

log = logging.getLogger(__name__)


def report(lease: Lease, stats: ConsumerStats | None = None) -> None:
    """One warning per takeover, naming whose lease expired (and when: the expiry itself, not
    when it was noticed) and who took the task; counted as ``takeovers`` in ``stats`` (which
    tells its observers: Prometheus, OpenTelemetry), or straight to OpenTelemetry for a
    claim without a consumer."""
    task = lease.task
    expired = task.taken_over_by(lease.run_id)
    if expired is None:
        return
    own = next(ws for ws in task.worker_states if ws.run_id == lease.run_id)
    attempt = task.dropped_attempts + task.worker_states.index(own) + 1
    # A timed-out state keeps when its lease expired as its end (`stages.sweep_expired`).
    expired_at = expired.finished_at.isoformat() if expired.finished_at else None
    log.warning(
        "task %r (%s) taken over by %s at attempt %d: the lease of %s expired at %s",
        lease.key,
        task.name,
        lease.worker_id,
        attempt,
        expired.worker_id,
        expired_at,
        extra={
            "action": "task_taken_over",
            "key": lease.key,
            "task_name": task.name,
            "worker_id": lease.worker_id,
            "run_id": lease.run_id,
            "attempt": attempt,
            "expired_worker_id": expired.worker_id,
            "expired_run_id": expired.run_id,
            "lease_expired_at": expired_at,
        },
    )
    if stats is not None:
        stats.record("takeovers", task.name)
    else:
        otel_metrics.taken_over(task.name)
