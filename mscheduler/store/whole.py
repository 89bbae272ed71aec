"""`WholeStore`: what the parts built on the whole store reach of it.

Operations, batches and browsing (and, above the store, waiting and task events) work
through several parts at once (a commit finishes leases through ``tasks`` and publishes
through ``publisher``, in one transaction). They take the store as this declaration, which
`components.Store` satisfies, so their modules never import the module that builds them (no
import cycle).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from pymongo import IndexModel

from ..clock import Clock
from ..collection import TasksCollection
from ..models import Task
from .flows import Flows
from .pauses import Pauses
from .publisher import Publisher
from .tasks import TaskStore
from .workers import Workers


class WholeStore(Protocol):
    """The store's shared state (`base.StoreBase`) and the parts these modules call."""

    @property
    def clock(self) -> Clock: ...

    @property
    def collection(self) -> TasksCollection: ...

    @property
    def tasks(self) -> TaskStore: ...

    @property
    def publisher(self) -> Publisher: ...

    @property
    def flows(self) -> Flows: ...

    @property
    def pauses(self) -> Pauses: ...

    @property
    def workers(self) -> Workers: ...

    def bound(self, collection: TasksCollection) -> AbstractContextManager[None]: ...

    async def ready(self) -> None: ...  # the ones below are `driver_errors` wrappers

    async def work_written(self) -> None: ...

    def ensure_indexes(self) -> Awaitable[list[str]]: ...

    def ensure_ttl_index(self, model: IndexModel) -> Awaitable[None]: ...

    def get(self, key: str) -> Awaitable[Task | None]: ...

    def get_many(self, keys: Sequence[str]) -> Awaitable[list[Task]]: ...

    def changed_since(
        self, since: dt.datetime, names: Sequence[str] | None
    ) -> Awaitable[list[Task]]: ...
