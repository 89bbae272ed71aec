"""What every part of the store shares: the collection, the clock, the indexes, and reads.

Every part of the store holds it (`components.Store` is it, with the parts built on it): the
parts import this module, never the one that builds them, so the store has no import cycle.
A batch of writes binds its session here (`StoreBase.bound`), for the running task only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, cast

import anyio
from anyio.lowlevel import RunVar
from pymongo import IndexModel
from pymongo.errors import OperationFailure, PyMongoError

from .. import constants as c
from .. import layout
from ..clock import UTC, Clock
from ..collection import TasksCollection
from ..errors import ConfigurationError
from ..models import Task, check_key, checked
from ..queries import tasks as q
from .driver import driver_errors

log = logging.getLogger(__name__)
# Keys in one read: at most 512 characters of up to 4 bytes each, about 10 MiB of filter.
KEYS_PER_READ = 5_000

# The lock a store's `ensure_indexes` holds, one per event loop. A store can serve
# several event loops at once (`SyncScheduler` runs each call in a loop of the calling
# thread), and an anyio lock is of one loop: released on another thread, it never wakes the
# tasks of this loop that wait for it. So the callers of one loop wait for each other, and
# each loop ensures the indexes itself (creating an existing index is a no-op).
_INDEXES_LOCKS: RunVar[weakref.WeakKeyDictionary[StoreBase, anyio.Lock]] = RunVar(
    "mscheduler_indexes_locks"
)


def index_model(index: layout.Index, **options: Any) -> IndexModel:
    """A declared index (`layout`) as the driver takes it; ``options`` adds to the declared
    ones (a TTL's ``expireAfterSeconds`` the caller chose)."""
    name, keys, declared = index
    return IndexModel(list(keys), name=name, **declared, **options)


@dataclasses.dataclass(frozen=True)
class _Binding:
    store: StoreBase
    collection: TasksCollection


# The batch of writes the running task makes, if any (`StoreBase.bound`): a context variable,
# so it is the running task's alone, and every part of the store sees it without being built
# again for it.
_BOUND: ContextVar[_Binding | None] = ContextVar("mscheduler_store_bound", default=None)


class StoreBase:
    """The collection and clock, the declared indexes, and reads of tasks by key: the state
    every part of the store holds (`components.Store` builds the parts on it)."""

    def __init__(self, collection: TasksCollection, clock: Clock) -> None:
        self._collection = collection
        self.clock = clock
        self._indexes_ready = False
        # Behind a mongos: a findAndModify must name the shard key (``key``), so claims by name
        # go the batched way, whose writes name ``_id`` and ``key`` (`claims`).
        self.sharded = False
        self._beside: dict[str, TasksCollection] = {}

    @property
    def collection(self) -> TasksCollection:
        """The tasks collection; inside `bound`, in the running task, the one it binds (a view
        that sends every call in the transaction's session)."""
        bound = _BOUND.get()
        return bound.collection if bound is not None and bound.store is self else self._collection

    @property
    def in_batch(self) -> bool:
        """Whether the running task writes an all-or-nothing batch (`bound`): its finishes are
        then written at once, by themselves, never queued behind (or with) other tasks'."""
        bound = _BOUND.get()
        return bound is not None and bound.store is self

    @property
    def in_transaction(self) -> bool:
        """Whether the running task writes in a transaction: a network error then propagates
        (the transaction is retried whole) instead of being recovered write by write."""
        bound = _BOUND.get()
        return (
            bound is not None and bound.store is self and bound.collection is not self._collection
        )

    @contextlib.contextmanager
    def bound(self, collection: TasksCollection) -> Iterator[None]:
        """Within the block, the running task (only it) writes through ``collection``: the
        session-bound view `transactions.run_atomically` hands its work, or the collection
        itself where there are no transactions. Only the session is bound: the parts, the
        hubs and the indexes known to be there stay the store's own."""
        token = _BOUND.set(_Binding(self, collection))
        try:
            yield
        finally:
            _BOUND.reset(token)

    @property
    def full_name(self) -> str:
        """``database.collection``, as the metrics label the tasks. Every engine has it as a
        property; it is not in `TasksCollection` because Motor's stubs declare it a method."""
        return str(cast(Any, self.collection).full_name)

    def beside(self, suffix: str) -> TasksCollection:
        """The collection named after this one plus ``suffix`` (``tasks.schedules``), in the
        same database: where schedules, paused names and limits live."""
        if suffix not in self._beside:
            database = getattr(self._collection, "database", None)
            if database is None:
                raise ConfigurationError(
                    f"{type(self._collection).__name__} does not give its database, so the "
                    f"collection {self._collection.name}{suffix} beside it cannot be opened"
                )
            self._beside[suffix] = database.get_collection(self._collection.name + suffix)
        return self._beside[suffix]

    # ------------------------------------------------------------ indexes

    @driver_errors
    async def ensure_indexes(self) -> list[str]:
        """Create the declared indexes (idempotent); the unique key index is what makes
        publish idempotent, so every other operation ensures it first."""
        async with self._indexes_lock():
            models = [index_model(index) for index in layout.TASK_INDEXES]
            names = list(await self.collection.create_indexes(models))
            self.sharded = await self._behind_mongos()
            self._indexes_ready = True
            return names

    def _indexes_lock(self) -> anyio.Lock:
        """This store's index lock in the running event loop (see `_INDEXES_LOCKS`)."""
        try:
            locks = _INDEXES_LOCKS.get()
        except LookupError:
            locks = weakref.WeakKeyDictionary()
            _INDEXES_LOCKS.set(locks)
        lock = locks.get(self)
        if lock is None:
            lock = locks[self] = anyio.Lock()
        return lock

    async def _behind_mongos(self) -> bool:
        """A mongos answers ``hello`` with ``msg: "isdbgrid"``; any failure to ask (a plain
        mongomock collection does not implement commands): no."""
        database = getattr(self.collection, "database", None)
        try:
            reply = await database.command({"hello": 1}) if database is not None else {}
        except (PyMongoError, NotImplementedError):
            return False
        return isinstance(reply, Mapping) and reply.get("msg") == "isdbgrid"

    @driver_errors
    async def ensure_ttl_index(self, model: IndexModel) -> None:
        """Create a TTL index, or change its ``expireAfterSeconds`` if it exists with another:
        creating it again would be refused (IndexOptionsConflict). MongoDB changes it in place
        with ``collMod``; an engine without that command gets the index dropped and rebuilt."""
        spec = model.document
        name, seconds = spec["name"], spec["expireAfterSeconds"]
        existing = (await self.collection.index_information()).get(name)
        if existing is not None and list(existing.get("key", [])) != list(spec["key"].items()):
            await self.collection.drop_index(name)  # keyed on another field before: rebuild
            existing = None
        if existing is None:
            await self.collection.create_indexes([model])
            return
        if existing.get("expireAfterSeconds") == seconds:
            return
        try:
            await self.collection.database.command(
                {
                    "collMod": self.collection.name,
                    "index": {"name": name, "expireAfterSeconds": seconds},
                }
            )
        except OperationFailure as exc:
            log.info(
                "collMod refused (%s); rebuilding the TTL index %s",
                exc,
                name,
                extra={"action": "ttl_index_rebuilt"},
            )
            await self.collection.drop_index(name)
            await self.collection.create_indexes([model])

    @driver_errors
    async def index_information(self) -> dict[str, Any]:
        """The collection's indexes, as the driver describes them (name -> spec)."""
        return dict(await self.collection.index_information())

    async def ready(self) -> None:
        """The indexes, ensured once: every part of the store calls this before its first
        write or read (the unique key index is what makes publish idempotent)."""
        if not self._indexes_ready:
            await self.ensure_indexes()

    # ------------------------------------------------------------ reads

    @driver_errors
    async def in_use(self) -> bool:
        """Whether anything was ever written here: a task, or a document beside the tasks
        (schedules, paused names, limits, live workers, remote stops). One read when there are
        tasks."""
        if await self.collection.find_one(q.ANY, q.ID_ONLY) is not None:
            return True
        for suffix in layout.BESIDE_SUFFIXES:
            if await self.beside(suffix).find_one(q.ANY, q.ID_ONLY) is not None:
                return True
        return False

    @driver_errors
    async def get(self, key: str) -> Task | None:
        await self.ready()
        found = await self.collection.find_one(q.by_key(checked(check_key, key)))
        return None if found is None else Task.model_validate(found)

    @driver_errors
    async def get_many(self, keys: Sequence[str]) -> list[Task]:
        """One read per `KEYS_PER_READ` keys: the filter of a large flow's keys stays far
        below MongoDB's 16 MiB command limit, whatever the keys' length."""
        await self.ready()
        return await self._by_keys([checked(check_key, k) for k in keys], q.by_keys)

    async def _by_keys(
        self, keys: Sequence[str], query: Callable[[Sequence[str]], Mapping[str, Any]]
    ) -> list[Task]:
        """The tasks ``query`` finds of ``keys``, one read per `KEYS_PER_READ` of them."""
        found: list[Task] = []
        for start in range(0, len(keys), KEYS_PER_READ):
            cursor = self.collection.find(query(keys[start : start + KEYS_PER_READ]))
            found.extend([Task.model_validate(document) async for document in cursor])
        return found

    async def control_changed(self) -> None:
        """After a write of a control document (a pause, a limit, a schedule): the store with
        a `ControlVersion` bumps it."""

    async def work_written(self) -> None:
        """After a write that may give a consumer elsewhere work (a publish, a retry, a
        dependent told, a slot freed), outside a batch: the store with a `Signal` bumps it,
        while some process polls. A batch signals once, after its last write."""

    @driver_errors
    async def changed_since(self, since: dt.datetime, names: Sequence[str] | None) -> list[Task]:
        """Tasks (of ``names``) written at or after ``since``, oldest write first: what a
        watch and the discovery hub's poll read where the server has no change streams."""
        await self.ready()
        # Served by the ``changes`` index (the interval's writes). Sorted here, not by the
        # server: the planner may still pick a claim index's ``name`` prefix for a few names,
        # and the memory engine refuses a sort that its chosen index does not give.
        cursor = self.collection.find(q.changed_since(since, names))
        found = [Task.model_validate(document) async for document in cursor]
        return sorted(found, key=lambda task: (task.updated_at, str(task.id)))

    @driver_errors
    async def due(
        self, name: str, now: dt.datetime, limit: int, worker_ids: Sequence[str] | None = None
    ) -> list[Task]:
        """The ``limit`` tasks of ``name`` due soonest for a claim by one of ``worker_ids``
        (None: any worker; payloads left out): what the hub's poll hands its consumers."""
        await self.ready()
        cursor = self.collection.find(
            q.due_filter(name, now, worker_ids), q.FETCH_PROJECTION, sort=q.FETCH_SORT, limit=limit
        )
        return [Task.model_validate(document) async for document in cursor]

    @driver_errors
    async def ended(self, keys: Sequence[str]) -> list[Task]:
        """The tasks of ``keys`` that have ended."""
        await self.ready()
        return await self._by_keys(keys, q.terminal_of)

    @driver_errors
    async def fetch(
        self, names: Sequence[str], worker_id: str, limit: int, batch_size: int
    ) -> list[Task]:
        """The ``limit`` tasks of ``names`` that ``worker_id`` may claim first (payloads left
        out); one read per group of names (`base.name_groups`), merged."""
        await self.ready()
        found: list[Task] = []
        for group in name_groups(names):
            cursor = self.collection.find(
                q.fetch_filter(group, worker_id),
                q.FETCH_PROJECTION,
                sort=q.FETCH_SORT,
                limit=limit,
                batch_size=batch_size,
            )
            found += [Task.model_validate(document) async for document in cursor]
        found.sort(key=lambda task: task.next_claim_at or dt.datetime.max.replace(tzinfo=UTC))
        return found[:limit]  # soonest first across the groups


def name_groups(names: Sequence[str]) -> list[list[str]]:
    """``names`` in groups of at most `MAX_NAMES_PER_QUERY`, one query of tasks each: beyond
    it the claim and fetch orders would be sorted in memory from every due task of those
    names."""
    size = c.MAX_NAMES_PER_QUERY
    return [list(names[i : i + size]) for i in range(0, len(names), size)] or [[]]


class BesideTasks:
    """A part of the store whose documents live in a collection beside the tasks (its name
    plus ``SUFFIX``): schedules, paused names, limits."""

    SUFFIX = ""

    def __init__(self, tasks: StoreBase) -> None:
        self._tasks = tasks

    @property
    def collection(self) -> TasksCollection:
        return self._tasks.beside(self.SUFFIX)
