"""`SyncScheduler`: every operation of `Scheduler` (publish, inspect, retry, cancel, pause,
limits, schedules, stats, workers, the pull API) from code that is not async.

A Django view, a Flask route or a script calls it like any blocking client. It is a
`Scheduler` whose store runs over pymongo's synchronous ``MongoClient``
(`backends.sync.AwaitableCollection`): each call runs the very store code, and so the same
documents, queries and checks, in a private event loop on the caller's thread (a wait too:
the process's discovery hub lives as long as the call that waits). Consumers, the iterators
of changes (`Scheduler.watch`, `Scheduler.events`), the views of `Scheduler.browse` and
`Scheduler.following_controls` stay async.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import anyio
from pymongo.collection import Collection
from typing_extensions import Unpack

from .api import Scheduler
from .backends.sync import AwaitableCollection, open_sync_collection
from .backends.uri import open_collection, open_options
from .clock import Clock
from .collection import TasksCollection
from .errors import ConfigurationError
from .models import ConnectParams

T = TypeVar("T")


def _blocking(function: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``await function(...)`` in a fresh event loop on this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(functools.partial(function, *args, **kwargs))
    raise ConfigurationError(
        "SyncScheduler: called from async code (an event loop runs in this thread); "
        "use ms.Scheduler there, or call the SyncScheduler from a worker thread"
    )


P = ParamSpec("P")


class _Blocking(Generic[P, T]):
    """An async `Scheduler` method offered on `SyncScheduler` as a blocking one: called on a
    `SyncScheduler`, it runs the method on that scheduler's `Scheduler` in a fresh event loop
    on the caller's thread (`_blocking`). Typed by the method's own parameters (a
    ``ParamSpec``), so the type checker checks a blocking call as it checks an awaited one,
    and an option added to the method is offered here at once. ``per_thread``: run it on the
    calling thread's `Scheduler` (`SyncScheduler._thread_scheduler`), for a method that runs
    a service of the process (a wait runs the discovery hub), which serves one loop at once."""

    def __init__(
        self,
        method: Callable[Concatenate[Scheduler, P], Awaitable[T]],
        *,
        per_thread: bool = False,
    ) -> None:
        self._method = method
        self._per_thread = per_thread

    @overload
    def __get__(
        self, instance: None, owner: type[SyncScheduler]
    ) -> Callable[Concatenate[SyncScheduler, P], T]: ...

    @overload
    def __get__(self, instance: SyncScheduler, owner: type[SyncScheduler]) -> Callable[P, T]: ...

    def __get__(
        self, instance: SyncScheduler | None, owner: type[SyncScheduler]
    ) -> Callable[P, T] | Callable[Concatenate[SyncScheduler, P], T]:
        method = self._method
        if instance is None:  # read on the class: the unbound form, for help() and the docs

            @functools.wraps(method)
            def unbound(sync: SyncScheduler, /, *args: P.args, **kwargs: P.kwargs) -> T:
                return _blocking(method, self._scheduler_of(sync), *args, **kwargs)

            return unbound

        @functools.wraps(method.__get__(instance.scheduler))
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            # Chosen at the call, on the thread that calls (not where the method was read).
            return _blocking(method, self._scheduler_of(instance), *args, **kwargs)

        return call

    def _scheduler_of(self, sync: SyncScheduler) -> Scheduler:
        return sync._thread_scheduler() if self._per_thread else sync.scheduler


class SyncScheduler:
    """`Scheduler`'s operations without ``await``: the same methods, blocking.

    ``SyncScheduler.connect(uri)`` opens ``mongodb://`` URIs with pymongo's synchronous
    client (thread-safe: one per process serves every thread) and ``memory://NAME`` on the
    process's embedded database of that name, shared with the async schedulers of the same
    URI (that backend is not thread-safe: use it from one thread at a time). Use it as a
    context manager, or call `close`. ``SyncScheduler(collection)`` wraps a pymongo
    ``Collection`` you already have (its client stays yours to close). Over pymongo, one
    `SyncScheduler` serves every thread at once: each call runs in an event loop of its
    own thread; what a call reaches in the store is bound to no one loop, and a wait runs
    the discovery hub of its thread's own `Scheduler` (`_thread_scheduler`).
    """

    def __init__(
        self, collection: Collection[Any] | TasksCollection, *, clock: Clock | None = None
    ) -> None:
        if isinstance(collection, Collection):
            collection = AwaitableCollection(collection)
        self._scheduler = Scheduler(collection, clock=clock)
        self._threads = threading.local()
        self._close: Callable[[], None] | None = None

    @classmethod
    def connect(cls, uri: str = "memory://", **params: Unpack[ConnectParams]) -> SyncScheduler:
        """Open ``uri`` and ensure the indexes, as `Scheduler.connect` does: a bad URI or
        an unreachable server fails here, within the server-selection timeout. The options:
        `models.ConnectParams`."""
        if not isinstance(uri, str):
            raise ConfigurationError(f"uri: expected a string, got {type(uri).__name__}")
        options = open_options(params, "connect")
        close: Callable[[], None]
        if uri.startswith("memory:"):
            connection = _blocking(open_collection, uri, **options)
            tasks: Any = connection.collection

            def close() -> None:
                _blocking(connection.close)

        else:
            tasks, close = open_sync_collection(uri, **options)
        scheduler = cls(tasks, clock=params.get("clock"))
        scheduler._close = close
        try:
            scheduler.ensure_indexes()
        except BaseException:
            scheduler.close()
            raise
        return scheduler

    @property
    def scheduler(self) -> Scheduler:
        """The async `Scheduler` underneath (its ``clock``, its ``browse``)."""
        return self._scheduler

    @property
    def collection(self) -> TasksCollection:
        return self._scheduler.collection

    def _thread_scheduler(self) -> Scheduler:
        """The calling thread's own `Scheduler` over the same collection and clock, for the
        calls that run a service of the process in the call's event loop (a wait runs the
        discovery hub, which serves one loop at a time): two threads that wait at once each
        run their own. It ensures the indexes at its first wait (one round trip, once per
        thread)."""
        found: Scheduler | None = getattr(self._threads, "scheduler", None)
        if found is None:
            found = Scheduler(self._scheduler.collection, clock=self._scheduler.clock)
            self._threads.scheduler = found
        return found

    def close(self) -> None:
        """Close the client `connect` opened; a collection passed in is the caller's."""
        if self._close is not None:
            close, self._close = self._close, None
            close()

    def __enter__(self) -> SyncScheduler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Every operation of `Scheduler`, blocking: each is the async method itself, run by
    # `_Blocking` on this thread (its signature, checks and documentation are the method's).
    # `tests/scenarios/test_sync_scheduler.py` fails on a public `Scheduler` method that is
    # neither here nor async-only (a consumer, and the iterators of changes, outlive a call).
    ensure_indexes = _Blocking(Scheduler.ensure_indexes)
    publish = _Blocking(Scheduler.publish)
    publish_many = _Blocking(Scheduler.publish_many)
    replace = _Blocking(Scheduler.replace)
    commit = _Blocking(Scheduler.commit)
    get = _Blocking(Scheduler.get)
    list_tasks = _Blocking(Scheduler.list_tasks)
    cancel = _Blocking(Scheduler.cancel)
    cancel_many = _Blocking(Scheduler.cancel_many)
    retry = _Blocking(Scheduler.retry)
    retry_failed = _Blocking(Scheduler.retry_failed)
    purge = _Blocking(Scheduler.purge)
    add_dependencies = _Blocking(Scheduler.add_dependencies)
    set_options = _Blocking(Scheduler.set_options)
    extend = _Blocking(Scheduler.extend)
    succeed = _Blocking(Scheduler.succeed)
    fail = _Blocking(Scheduler.fail)
    release = _Blocking(Scheduler.release)
    find_lease = _Blocking(Scheduler.find_lease)
    schedule = _Blocking(Scheduler.schedule)
    schedules = _Blocking(Scheduler.schedules)
    unschedule = _Blocking(Scheduler.unschedule)
    pause = _Blocking(Scheduler.pause)
    resume = _Blocking(Scheduler.resume)
    paused = _Blocking(Scheduler.paused)
    set_limit = _Blocking(Scheduler.set_limit)
    remove_limit = _Blocking(Scheduler.remove_limit)
    limits = _Blocking(Scheduler.limits)
    stats = _Blocking(Scheduler.stats)
    in_use = _Blocking(Scheduler.in_use)
    index_information = _Blocking(Scheduler.index_information)
    workers = _Blocking(Scheduler.workers)
    stop_worker = _Blocking(Scheduler.stop_worker)
    # A wait runs the async one, in this call's loop: the discovery hub (its change stream,
    # or its poll where the server has none) lives as long as the call that waits, on the
    # calling thread's scheduler.
    wait = _Blocking(Scheduler.wait, per_thread=True)
    wait_many = _Blocking(Scheduler.wait_many, per_thread=True)
    own = _Blocking(Scheduler.own, per_thread=True)  # a wait runs the hubs
