"""What handlers and the consumers that run them use.

`Handlers` (a registry of handlers with their options), `isolated` (a handler run in a
child process; `isolate_plain`: every plain ``def`` of a mapping so), `batch` (one call for
many tasks), `current_lease` (the running task's lease, for `Scheduler.commit`), and what
`Scheduler` hands back around them: the `Consumer`, its `ConsumerStats`, and the
`TaskEvents` iterator of `Scheduler.events`."""

from __future__ import annotations

from .consumer.batching import Batch, batch
from .consumer.consumer import Consumer
from .consumer.handlers import Handlers, Isolated, isolate_plain, isolated
from .consumer.stats import ConsumerStats
from .context import current_lease
from .services.task_events import TaskEvents

__all__ = [
    "Batch",
    "Consumer",
    "ConsumerStats",
    "Handlers",
    "Isolated",
    "TaskEvents",
    "batch",
    "current_lease",
    "isolate_plain",
    "isolated",
]
