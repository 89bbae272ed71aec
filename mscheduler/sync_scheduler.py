"""`SyncScheduler`: publish, inspect and cancel tasks from code that is not async.

A Django view, a Flask route or a script calls it like any blocking client. It is a
`Scheduler` whose store runs over pymongo's synchronous ``MongoClient``
(`backends.sync.AwaitableCollection`): each call runs the very store code, and so the same
documents, queries and checks, in a private event loop on the caller's thread. Consumers
stay async (`Scheduler.consumer`); this is the publishing side.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import anyio
from pymongo.collection import Collection
from pymongo.errors import PyMongoError
from typing_extensions import Unpack

from . import constants as c
from .api import Scheduler
from .backends.sync import AwaitableCollection, open_sync_collection, open_task_stream
from .backends.uri import DEFAULT_SERVER_SELECTION_TIMEOUT_MS, open_collection
from .clock import Clock
from .errors import BackendUnavailable, ConfigurationError, TaskNotFound
from .models import ErrorInfo, Lease, PublishParams, PublishResult, Task
from .specs import Step
from .store.streams import task_changes
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


class SyncScheduler:
    """Publish, get, wait for and cancel tasks without ``await``.

    ``SyncScheduler.connect(uri)`` opens ``mongodb://`` URIs with pymongo's synchronous
    client (thread-safe: one per process serves every thread) and ``memory://NAME`` on the
    process's embedded database of that name, shared with the async schedulers of the same
    URI (that backend is not thread-safe: use it from one thread at a time). Use it as a
    context manager, or call `close`. ``SyncScheduler(collection)`` wraps a pymongo
    ``Collection`` you already have (its client stays yours to close). Over pymongo, one
    `SyncScheduler` serves every thread at once: each call runs in an event loop of its
    own thread, and what these calls reach in the store is bound to no one loop.
    """

    def __init__(self, collection: Any, *, clock: Clock | None = None) -> None:
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
        collection: str = c.DEFAULT_COLLECTION,
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
    def collection(self) -> Any:
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

    def ensure_indexes(self) -> list[str]:
        return _blocking(self._scheduler.ensure_indexes)

    def publish(
        self, key: str, payload: Any = None, *, name: str, **params: Unpack[PublishParams]
    ) -> PublishResult:
        """Publish a task, idempotently by ``key``: `Scheduler.publish`, blocking."""
        return _blocking(self._scheduler.publish, key, payload, name=name, **params)

    def publish_many(
        self, specs: Step | Iterable[Step], *, allow_missing: bool = False
    ) -> list[PublishResult]:
        """Many tasks, all or nothing (a transaction on a replica set): `Scheduler.publish_many`."""
        return _blocking(self._scheduler.publish_many, specs, allow_missing=allow_missing)

    def get(self, key: str) -> Task | None:
        return _blocking(self._scheduler.get, key)

    def cancel(self, key: str, reason: str = "cancelled") -> bool:
        """Cancel a task that has not finished: `Scheduler.cancel`."""
        return _blocking(self._scheduler.cancel, key, reason)

    def own(
        self,
        names: Sequence[str],
        *,
        worker_id: str,
        max_tasks: int = 1,
        lease: dt.timedelta | float | None = None,
        wait: dt.timedelta | float | None = None,
    ) -> list[Lease]:
        """Claim up to ``max_tasks`` tasks of ``names``: `Scheduler.own`, blocking."""
        return _blocking(
            self._scheduler.own,
            names,
            worker_id=worker_id,
            max_tasks=max_tasks,
            lease=lease,
            wait=wait,
        )

    def extend(self, lease: Lease, length: dt.timedelta | float | None = None) -> Lease:
        """`Scheduler.extend`, blocking."""
        return _blocking(self._scheduler.extend, lease, length)

    def succeed(self, lease: Lease, result: Any = None) -> Task:
        """`Scheduler.succeed`, blocking."""
        return _blocking(self._scheduler.succeed, lease, result)

    def fail(self, lease: Lease, error: BaseException | ErrorInfo | str) -> Task:
        """`Scheduler.fail`, blocking."""
        return _blocking(self._scheduler.fail, lease, error)

    def release(self, lease: Lease) -> Task:
        """`Scheduler.release`, blocking."""
        return _blocking(self._scheduler.release, lease)

    def find_lease(self, key: str, *, worker_id: str, run_id: str) -> Lease:
        """`Scheduler.find_lease`, blocking."""
        return _blocking(self._scheduler.find_lease, key, worker_id=worker_id, run_id=run_id)

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
                task_changes(key=keys),
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
