"""mscheduler: a reliable multi-worker task scheduler on a MongoDB collection.

The names below are loaded when first used (PEP 562), so ``mscheduler --version`` or a
command that only publishes does not pay for the consumer's modules."""

from __future__ import annotations

import importlib
import logging as _logging
from typing import TYPE_CHECKING

from .__about__ import __version__

if TYPE_CHECKING:
    from .api import Scheduler
    from .clock import Clock, ManualClock, SystemClock
    from .consumer.batching import Batch, batch
    from .consumer.consumer import Consumer
    from .consumer.handlers import Handlers, Isolated, isolated
    from .consumer.stats import ConsumerStats
    from .context import current_lease
    from .errors import (
        Abort,
        BackendUnavailable,
        ConfigurationError,
        DependencyError,
        HandlerProcessDied,
        HandlerSignal,
        LeaseLost,
        MSchedulerError,
        PayloadError,
        PreconditionFailed,
        RetryLater,
        StoreError,
        TaskNotFound,
        TaskRunning,
        TaskTimeout,
        WorkerNotLive,
    )
    from .models import (
        EarlierAttempt,
        ErrorInfo,
        Lease,
        Progress,
        PublishResult,
        StatsRow,
        Task,
        TaskEvent,
        TaskOptions,
        TaskState,
        WorkerState,
        WorkerStateKind,
    )
    from .periodic import Schedule
    from .specs import Flow, TaskSpec, chain, chord, group
    from .store.limits import Limit
    from .store.task_events import TaskEvents
    from .store.workers import WorkerInfo
    from .sync_scheduler import SyncScheduler
    from .worker_options import WorkerOptions

# Where each public name lives: loaded on first access, then kept as a module attribute.
_HOMES = {
    "Scheduler": "api",
    "Clock": "clock",
    "ManualClock": "clock",
    "SystemClock": "clock",
    "Batch": "consumer.batching",
    "batch": "consumer.batching",
    "Consumer": "consumer.consumer",
    **dict.fromkeys(("Handlers", "Isolated", "isolated"), "consumer.handlers"),
    "ConsumerStats": "consumer.stats",
    "current_lease": "context",
    **dict.fromkeys(
        (
            "Abort",
            "BackendUnavailable",
            "ConfigurationError",
            "DependencyError",
            "HandlerProcessDied",
            "HandlerSignal",
            "LeaseLost",
            "MSchedulerError",
            "PayloadError",
            "PreconditionFailed",
            "RetryLater",
            "StoreError",
            "TaskNotFound",
            "TaskRunning",
            "TaskTimeout",
            "WorkerNotLive",
        ),
        "errors",
    ),
    **dict.fromkeys(
        (
            "EarlierAttempt",
            "ErrorInfo",
            "Lease",
            "Progress",
            "PublishResult",
            "StatsRow",
            "Task",
            "TaskEvent",
            "TaskOptions",
            "TaskState",
            "WorkerState",
            "WorkerStateKind",
        ),
        "models",
    ),
    "Schedule": "periodic",
    **dict.fromkeys(("Flow", "TaskSpec", "chain", "chord", "group"), "specs"),
    "Limit": "store.limits",
    "TaskEvents": "store.task_events",
    "WorkerInfo": "store.workers",
    "SyncScheduler": "sync_scheduler",
    "WorkerOptions": "worker_options",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


# A library logs, the application decides where to: no "No handlers could be found" noise,
# no output unless the application configures logging.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    "Abort",
    "BackendUnavailable",
    "Batch",
    "Clock",
    "ConfigurationError",
    "Consumer",
    "ConsumerStats",
    "DependencyError",
    "EarlierAttempt",
    "ErrorInfo",
    "Flow",
    "HandlerProcessDied",
    "HandlerSignal",
    "Handlers",
    "Isolated",
    "Lease",
    "LeaseLost",
    "Limit",
    "MSchedulerError",
    "ManualClock",
    "PayloadError",
    "PreconditionFailed",
    "Progress",
    "PublishResult",
    "RetryLater",
    "Schedule",
    "Scheduler",
    "StatsRow",
    "StoreError",
    "SyncScheduler",
    "SystemClock",
    "Task",
    "TaskEvent",
    "TaskEvents",
    "TaskNotFound",
    "TaskOptions",
    "TaskRunning",
    "TaskSpec",
    "TaskState",
    "TaskTimeout",
    "WorkerInfo",
    "WorkerNotLive",
    "WorkerOptions",
    "WorkerState",
    "WorkerStateKind",
    "__version__",
    "batch",
    "chain",
    "chord",
    "current_lease",
    "group",
    "isolated",
]
