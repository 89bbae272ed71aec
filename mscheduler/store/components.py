"""`Store`: the round trips the API sends, and the one place its parts are built.

Each capability is a part reached the same way: ``store.tasks.claim(...)``,
``store.publisher.publish(spec)``, ``store.operations.cancel(key)`` ... It holds no process
state and builds no service: the composition root (`services.root.Services`) builds it, then
the process's services over it, and hands the store what its writes tell them
(`tasks.TaskStore.attach`). The store itself is the state every part shares
(`base.StoreBase`: the collection, the clock, the indexes, reads by key). A part that needs
another is handed it here; the parts built on the whole store take it as `whole.WholeStore`.
A batch of writes binds only its session (`StoreBase.bound`): no part is built again for it.
"""

from __future__ import annotations

from ..clock import Clock
from ..collection import TasksCollection
from .base import StoreBase
from .batches import Batches
from .browse import Browse
from .controls import ControlVersion
from .expiry import Expiry
from .flows import Flows
from .limits import Limits
from .operations import Operations
from .partitions import Partitions
from .pauses import Pauses
from .publisher import Publisher
from .schedules import ScheduleStore
from .signal import Signal
from .stops import Stops
from .tasks import TaskStore
from .workers import Workers


class Store(StoreBase):
    """The shared state, and every part of the store, built once for its lifetime."""

    def __init__(self, collection: TasksCollection, clock: Clock) -> None:
        super().__init__(collection, clock)
        self.flows = Flows(self)
        self.tasks = TaskStore(self, self.flows)
        self.partitions = Partitions(self)
        self.publisher = Publisher(self, self.flows, self.partitions)
        self.schedules = ScheduleStore(self, self.publisher)
        self.expiry = Expiry(self, self.tasks.after_write)
        self.pauses = Pauses(self)
        self.limits = Limits(self)
        self.workers = Workers(self)
        self.stops = Stops(self)
        # What writers bump while some process polls, and a polling process reads often.
        self.signal = Signal(self)
        self.control_version = ControlVersion(self)
        self.operations = Operations(self)
        self.batches = Batches(self)
        self.browse = Browse(self)

    async def control_changed(self) -> None:
        await self.control_version.bump()
        await self.signal.bump(controls=True)

    async def work_written(self) -> None:
        if not self.in_batch:
            await self.signal.bump()
