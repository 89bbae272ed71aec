"""`Store`: the task store with every capability the API reaches, each one a component
reached the same way (``store.publisher.publish(spec)``, ``store.operations.cancel(key)``,
``store.waiting.wait(keys)`` ...).

The components that only need the store's base (publisher, flows, schedules, pauses,
limits, workers, stops) are built by `TaskStore` itself; those that work through a whole
`TaskStore` (a batch writes through a session-bound view of it) are built here, a layer
above it, so no module of the store imports another in a cycle.
"""

from __future__ import annotations

from ..clock import Clock
from .batches import Batches
from .browse import Browse
from .collection import TasksCollection
from .operations import Operations
from .tasks import TaskStore
from .waiting import Waiting


class Store(TaskStore):
    """A `TaskStore` with its operator's, batch, waiting and browsing components."""

    def __init__(self, collection: TasksCollection, clock: Clock) -> None:
        super().__init__(collection, clock)
        self.operations = Operations(self)
        self.batches = Batches(self)
        self.waiting = Waiting(self)
        self.browse = Browse(self)
