"""`SyncScheduler`: every operation of `Scheduler` (publish, inspect, retry, cancel, pause,
limits, schedules, stats, workers, the pull API) from code that is not async.

A Django view, a Flask route or a script calls it like any blocking client. It is a
`Scheduler` whose store runs over pymongo's synchronous ``MongoClient``
(`backends.sync.AwaitableCollection`): each call runs the very store code, and so the same
documents, queries and checks, in a private event loop on the caller's thread. Consumers,
and the iterators of changes (`Scheduler.watch`, `Scheduler.events`), stay async.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import anyio
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from . import layout
from .api import Scheduler
from .backends.sync import AwaitableCollection, open_sync_collection, open_task_stream
from .backends.uri import DEFAULT_SERVER_SELECTION_TIMEOUT_MS, open_collection
from .clock import Clock
from .collection import TasksCollection
from .errors import BackendUnavailable, ConfigurationError, TaskNotFound
from .models import Task
from .queries.changes import changes_pipeline
from .worker_options import Discovery

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long one read of the change stream blocks: the longest a wait overruns its timeout.
_STREAM_AWAIT_MS = 1_000


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
    and an option added to the method is offered here at once."""

    def __init__(self, method: Callable[Concatenate[Scheduler, P], Awaitable[T]]) -> None:
        self._method = method

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
                return _blocking(method, sync.scheduler, *args, **kwargs)

            return unbound
        scheduler = instance.scheduler

        @functools.wraps(method.__get__(scheduler))
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return _blocking(method, scheduler, *args, **kwargs)

        return call


class SyncScheduler:
    """`Scheduler`'s operations without ``await``: the same methods, blocking.

    ``SyncScheduler.connect(uri)`` opens ``mongodb://`` URIs with pymongo's synchronous
    client (thread-safe: one per process serves every thread) and ``memory://NAME`` on the
    process's embedded database of that name, shared with the async schedulers of the same
    URI (that backend is not thread-safe: use it from one thread at a time). Use it as a
    context manager, or call `close`. ``SyncScheduler(collection)`` wraps a pymongo
    ``Collection`` you already have (its client stays yours to close). Over pymongo, one
    `SyncScheduler` serves every thread at once: each call runs in an event loop of its
    own thread, and what these calls reach in the store is bound to no one loop.
    """

    def __init__(
        self, collection: Collection[Any] | TasksCollection, *, clock: Clock | None = None
    ) -> None:
        if isinstance(collection, Collection):
            collection = AwaitableCollection(collection)
        self._scheduler = Scheduler(collection, clock=clock)
        self._close: Callable[[], None] | None = None

    @classmethod
    def connect(
        cls,
        uri: str = "memory://",
        *,
        database: str | None = None,
        collection: str = layout.DEFAULT_COLLECTION,
        clock: Clock | None = None,
        server_selection_timeout_ms: int = DEFAULT_SERVER_SELECTION_TIMEOUT_MS,
    ) -> SyncScheduler:
        """Open ``uri`` and ensure the indexes, as `Scheduler.connect` does: a bad URI or
        an unreachable server fails here, within the server-selection timeout."""
        if not isinstance(uri, str):
            raise ConfigurationError(f"uri: expected a string, got {type(uri).__name__}")
        close: Callable[[], None]
        if uri.startswith("memory:"):
            connection = _blocking(
                open_collection,
                uri,
                database=database,
                collection=collection,
                server_selection_timeout_ms=server_selection_timeout_ms,
            )
            tasks: Any = connection.collection

            def close() -> None:
                _blocking(connection.close)

        else:
            tasks, close = open_sync_collection(
                uri,
                database=database,
                collection=collection,
                server_selection_timeout_ms=server_selection_timeout_ms,
            )
        scheduler = cls(tasks, clock=clock)
        scheduler._close = close
        try:
            scheduler.ensure_indexes()
        except BaseException:
            scheduler.close()
            raise
        return scheduler

    @property
    def scheduler(self) -> Scheduler:
        """The async `Scheduler` underneath (its ``store`` and ``clock``)."""
        return self._scheduler

    @property
    def collection(self) -> TasksCollection:
        return self._scheduler.collection

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
    own = _Blocking(Scheduler.own)
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
    workers = _Blocking(Scheduler.workers)
    stop_worker = _Blocking(Scheduler.stop_worker)

    # `wait` and `wait_many` are this class's own: the async ones wait through the process's
    # discovery hub, which lives in an event loop that outlives any one call; a blocking call
    # has none, so it reads the driver's synchronous change stream (or polls) itself.
    def wait(
        self,
        key: str,
        timeout: float | None = None,
        *,
        missing_ok: bool = False,
        discovery: Discovery = "auto",
        poll_interval_ms: int = 1_000,
    ) -> Task:
        """The task once it is terminal, blocking this thread: `Scheduler.wait`."""
        found = self.wait_many(
            [key],
            timeout,
            missing_ok=missing_ok,
            discovery=discovery,
            poll_interval_ms=poll_interval_ms,
        )
        return found[key]

    def wait_many(
        self,
        keys: Sequence[str],
        timeout: float | None = None,
        *,
        missing_ok: bool = False,
        discovery: Discovery = "auto",
        poll_interval_ms: int = 1_000,
    ) -> dict[str, Task]:
        """Every task of ``keys`` once terminal, in the order given; `TimeoutError` after
        ``timeout`` seconds on the scheduler's clock. On a change stream where the server
        has them (opened before the first read, so nothing ends unseen in between), else
        by reading every ``poll_interval_ms``; ``memory://`` is polled."""
        if discovery not in ("auto", "stream", "poll"):
            raise ConfigurationError(
                f"discovery: {discovery!r} is not one of 'auto', 'stream', 'poll'"
            )
        if not isinstance(poll_interval_ms, int) or poll_interval_ms < 10:
            raise ConfigurationError(f"poll_interval_ms: {poll_interval_ms!r} is not an int >= 10")
        clock = self._scheduler.clock
        deadline = None if timeout is None else clock.now() + dt.timedelta(seconds=timeout)
        wanted = list(dict.fromkeys(keys))
        finished: dict[str, Task] = {}

        def remaining() -> list[str]:
            return [key for key in wanted if key not in finished]

        def take(task: Task) -> None:
            if task.key in wanted and task.state.is_terminal:
                finished[task.key] = task

        while remaining():
            stream = self._open_stream(remaining(), discovery, poll_interval_ms)
            try:
                found = {t.key: t for t in _blocking(self._scheduler.store.get_many, remaining())}
                missing = [key for key in remaining() if key not in found]
                if missing and not missing_ok:
                    raise TaskNotFound(f"no task has the key(s) {missing}")
                for task in found.values():
                    take(task)
                while remaining():
                    left = None if deadline is None else (deadline - clock.now()).total_seconds()
                    if left is not None and left <= 0:
                        raise TimeoutError(
                            f"after {timeout} s these tasks have not finished: {remaining()[:20]}"
                        )
                    if stream is None:
                        time.sleep(min(poll_interval_ms / 1000, left or poll_interval_ms / 1000))
                        for task in _blocking(self._scheduler.store.get_many, remaining()):
                            take(task)
                        continue
                    event = stream.try_next()
                    if event is not None and event.get("fullDocument") is not None:
                        take(Task.model_validate(event["fullDocument"]))
            except PyMongoError as exc:
                if not remaining():
                    break
                log.warning("wait: change stream lost (%s); reading again", exc)
            finally:
                if stream is not None:
                    stream.close()
        return {key: finished[key] for key in wanted}

    def _open_stream(self, keys: list[str], discovery: Discovery, poll_interval_ms: int) -> Any:
        collection = self._scheduler.collection
        if not isinstance(collection, AwaitableCollection):
            return None  # memory://: its change feed serves async readers; polled here
        try:
            stream, refusal = open_task_stream(
                collection,
                changes_pipeline(states=keys),
                discovery,
                max_await_ms=min(_STREAM_AWAIT_MS, poll_interval_ms),
            )
        except PyMongoError as exc:
            raise BackendUnavailable(f"wait: cannot open a change stream: {exc}") from exc
        if refusal is not None:
            log.warning(
                "wait: the server refused a change stream (%s); polling every %.1f s",
                refusal,
                poll_interval_ms / 1000,
                extra={"action": "polling_fallback"},
            )
        return stream
