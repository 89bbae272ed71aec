"""mscheduler: a reliable multi-worker task scheduler on a MongoDB collection."""

import logging as _logging

from .__about__ import __version__
from .api import Scheduler
from .clock import Clock, ManualClock, SystemClock
from .consumer.consumer import Consumer
from .consumer.handlers import Handlers
from .consumer.stats import ConsumerStats
from .context import current_lease
from .errors import (
    Abort,
    BackendUnavailable,
    ConfigurationError,
    DependencyError,
    LeaseLost,
    MSchedulerError,
    PayloadError,
    PreconditionFailed,
    RetryLater,
    StoreError,
    TaskNotFound,
    TaskRunning,
    TaskTimeout,
)
from .models import (
    ErrorInfo,
    Lease,
    PublishResult,
    StatsRow,
    Task,
    TaskOptions,
    TaskState,
    WorkerState,
    WorkerStateKind,
)
from .periodic import Schedule
from .specs import Flow, TaskSpec, chain, chord, group
from .store.workers import WorkerInfo
from .worker_options import WorkerOptions

# A library logs, the application decides where to: no "No handlers could be found" noise,
# no output unless the application configures logging.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    "Abort",
    "BackendUnavailable",
    "Clock",
    "ConfigurationError",
    "Consumer",
    "ConsumerStats",
    "DependencyError",
    "ErrorInfo",
    "Flow",
    "Handlers",
    "Lease",
    "LeaseLost",
    "MSchedulerError",
    "ManualClock",
    "PayloadError",
    "PreconditionFailed",
    "PublishResult",
    "RetryLater",
    "Schedule",
    "Scheduler",
    "StatsRow",
    "StoreError",
    "SystemClock",
    "Task",
    "TaskNotFound",
    "TaskOptions",
    "TaskRunning",
    "TaskSpec",
    "TaskState",
    "TaskTimeout",
    "WorkerInfo",
    "WorkerOptions",
    "WorkerState",
    "WorkerStateKind",
    "__version__",
    "chain",
    "chord",
    "current_lease",
    "group",
]
