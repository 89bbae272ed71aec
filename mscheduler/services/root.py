"""`Services`: the composition root. It builds the store, then the process's services over
it, and hands the store what its writes tell them; nothing else builds either.

The store (`store.components.Store`) is the round trips, and keeps no process state; each
service here is one per store (so per `Scheduler`), shared by every consumer, waiter and
watch of the process. A loop-owning service (`loops`) is run under one contract
(`runner.Service`): in its caller's task group, started once up, stopped by cancelling it.
"""

from __future__ import annotations

from .. import layout
from ..clock import Clock
from ..collection import TasksCollection
from ..store.components import Store
from .claim_turns import ClaimTurns
from .controls import ControlHub
from .dependents import OwedDependents
from .discovery import TaskHub
from .finishes import FinishBatcher
from .runner import Service
from .waiting import Waiting


class Services:
    """The store and every process-lifetime service over it, built once for its lifetime:
    ``store`` (the round trips), ``finishes`` (the finish batcher its finishes go through),
    ``owed`` (the dependents its writes failed to tell), ``claim_turns`` (its batched
    claims' turns, and how wide they read), ``task_hub`` (the process's one change stream or
    poll loop), ``control_hub`` (control changes, from the hub or on its own), ``waiting``
    (wait and watch)."""

    def __init__(self, collection: TasksCollection, clock: Clock) -> None:
        self.clock = clock
        self.store = Store(collection, clock)
        self.finishes = FinishBatcher(self.store, self.store.tasks.fenced_document)
        self.owed = OwedDependents(self.store.tasks)
        self.claim_turns = ClaimTurns()
        self.store.tasks.attach(self.finishes, self.owed, self.claim_turns)
        # The process's one change stream (or poll loop), the controls' changes on it too.
        self.task_hub = TaskHub(
            self.store, clock, controls_suffix=layout.CONTROLS, signal=self.store.signal
        )
        self.control_hub = ControlHub(self.store, self.store.control_version, self.task_hub, clock)
        self.waiting = Waiting(self.store, self.task_hub)
        # Every loop-owning service, under the one contract.
        self.loops: tuple[Service, ...] = (self.task_hub, self.control_hub)
