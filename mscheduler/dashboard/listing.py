"""A row of the task list: what an operator scans a list for, beside the key and state: who
runs (or last ran) the task, how far it is, how long its attempt took or has taken, and why
it failed."""

from __future__ import annotations

import dataclasses
import datetime as dt

from ..models import Task, WorkerStateKind


@dataclasses.dataclass
class Listed:
    task: Task
    worker: str  # the workers running it, else the one of its latest attempt ("" if none)
    duration_s: float | None  # the latest attempt's, up to now while it runs
    error: str  # the error of the task's outcome: "Type: message"


def listed(task: Task, now: dt.datetime) -> Listed:
    running = [ws for ws in task.worker_states if ws.state is WorkerStateKind.RUNNING]
    latest = running[-1] if running else (task.worker_states[-1] if task.worker_states else None)
    worker = ", ".join(ws.worker_id for ws in running) or (latest.worker_id if latest else "")
    duration = None
    if latest is not None and latest.started_at is not None:
        end = latest.finished_at or (now if latest.state is WorkerStateKind.RUNNING else None)
        if end is not None:
            duration = max((end - latest.started_at).total_seconds(), 0.0)
    error = f"{task.error.type}: {task.error.message}" if task.error is not None else ""
    return Listed(task=task, worker=worker, duration_s=duration, error=error)


def elapsed(seconds: float | None) -> str:
    """A duration as a person reads it in a column: ``850ms``, ``12.3s``, ``4m05s``, ``2h10m``."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
