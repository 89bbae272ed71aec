"""What a running handler can ask about itself: its lease (for `Scheduler.commit`)."""

from __future__ import annotations

import contextvars
import dataclasses

from .errors import MSchedulerError
from .models import Lease


@dataclasses.dataclass
class Run:
    lease: Lease
    completed: bool = False  # finished by the handler itself, through a commit
    seconds: float | None = None


_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "mscheduler_run", default=None
)


def current_lease() -> Lease:
    """The lease of the task whose handler is running, to pass to `Scheduler.commit`."""
    run = _current.get()
    if run is None:
        raise MSchedulerError("current_lease(): not inside a task handler")
    return run.lease


def current_run() -> Run | None:
    return _current.get()


def enter(run: Run) -> contextvars.Token[Run | None]:
    return _current.set(run)


def leave(token: contextvars.Token[Run | None]) -> None:
    _current.reset(token)


def mark_completed(run_ids: set[str]) -> None:
    """A commit finished these leases: the consumer must not finish the running one again."""
    run = _current.get()
    if run is not None and run.lease.run_id in run_ids:
        run.completed = True
