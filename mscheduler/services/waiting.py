"""Waiting for tasks to finish through the process's discovery hub
(`discovery.TaskHub`): its one change stream, or its one poll loop, shared with the consumers.

A waiter subscribes *before* it reads the current states, so a task that finishes in between
is seen either by the read or by the hub; on a resync the states are read again. It hears of
state changes of its keys only, tested on the event before any look-up of a document, so
pings cost it nothing. ``discovery`` follows the consumer's rule (`WorkerOptions.discovery`)
when this waiter is the one that runs the hub: a server that refuses a change stream is
polled every ``poll_interval_ms`` (``auto``), or the refusal is an error (``stream``);
``poll`` never opens one, unless another subscriber of the process wants one (the hub polls
by choice only while every subscriber asked to). Joining a hub that already runs, it shares
what the hub does.
A watch shares the hub when it runs, and otherwise keeps its own stream (see `watch_tasks`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import anyio
from pymongo.errors import OperationFailure

from ..clock import sleep
from ..errors import ConfigurationError, StoreError, TaskNotFound
from ..models import Task
from ..queries.changes import changes_pipeline
from ..store.streams import (
    MAX_AWAIT_MS,
    RESUME_IMPOSSIBLE,
    ResumePoint,
    close_quietly,
    open_change_stream,
    refuses_streams,
)
from ..store.whole import WholeStore
from ..worker_options import Discovery, WorkerOptions
from .discovery import CLOCK_SKEW, RESYNC, Subscription, TaskHub

log = logging.getLogger(__name__)


class _Waiter:
    def __init__(
        self,
        store: WholeStore,
        hub: TaskHub,
        keys: Sequence[str],
        poll_interval_ms: int,
        missing_ok: bool,
        discovery: Discovery,
    ) -> None:
        self._store = store
        self._hub = hub
        self._missing_ok = missing_ok
        self._keys = list(dict.fromkeys(keys))  # the order given, for the result
        self._wanted = frozenset(self._keys)  # each finish is a set lookup, not a list walk
        options = WorkerOptions(discovery=discovery, poll_interval_ms=poll_interval_ms)
        self._subscription = Subscription(options, states=self._keys)
        self.finished: dict[str, Task] = {}
        # The newest version of each key known here (``(_id, version)``), read or handed out.
        self._known: dict[str, tuple[Any, int]] = {}
        self.error: BaseException | None = None
        self.done = anyio.Event()
        self.looked = anyio.Event()  # the first read is done (or failed)

    @property
    def remaining(self) -> list[str]:
        return [key for key in self._keys if key not in self.finished]

    def _take(self, task: Task) -> None:
        """Invariant: a waiter never takes a version older than one it knows of the same
        task (same ``_id``). The hub may hand out a write made before the waiter's own read
        (a stream reopened wider from a place behind it replays what came since): a failure
        before the retry the waiter read as pending is not the end it waits for."""
        if task.key not in self._wanted:
            return
        known = self._known.get(task.key)
        if known is not None and known[0] == task.id and known[1] > task.version:
            return
        self._known[task.key] = (task.id, task.version)
        if task.state.is_terminal:
            self.finished[task.key] = task
            if len(self.finished) == len(self._wanted):
                self.done.set()

    async def _read_all(self) -> None:
        """Take the finished tasks; the hub hands out the others as they end (the poll reads
        their names' writes from now on, and their keys in turns)."""
        found = {task.key: task for task in await self._store.get_many(self.remaining)}
        missing = [key for key in self.remaining if key not in found]
        if missing and not self._missing_ok:
            raise TaskNotFound(f"no task has the key(s) {missing}")
        for task in found.values():
            self._subscription.note(task)
            self._take(task)

    async def follow(self) -> None:
        """Subscribed to the process's hub before the first read, so a task that finishes in
        between is seen by the read or by the hub; a resync reads the states again."""
        try:
            async with self._hub.subscription(self._subscription) as subscription:
                await self._read_all()
                self.looked.set()
                while not self.done.is_set():
                    task = await subscription.next()
                    if task is RESYNC:
                        await self._read_all()
                    else:
                        self._take(task)
        except Exception as exc:
            self.error = exc
            self.done.set()
            self.looked.set()


def _deadline(store: WholeStore, timeout: object) -> dt.datetime | None:
    """When a wait of ``timeout`` seconds ends (None: never); a timeout that is no number of
    seconds to wait is refused, naming it."""
    if timeout is None:
        return None
    refused = ConfigurationError(
        f"timeout: expected seconds to wait, 0 or more (None: no end), got {timeout!r}"
    )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise refused
    if not 0 <= timeout < math.inf:  # NaN too
        raise refused
    try:
        return store.clock.now() + dt.timedelta(seconds=timeout)
    except OverflowError:
        raise refused from None


async def wait_for(
    store: WholeStore,
    hub: TaskHub,
    keys: Sequence[str],
    *,
    timeout: float | None,  # noqa: ASYNC109 - the API (DESIGN.md), on the injectable clock
    missing_ok: bool = False,
    poll_interval_ms: int = 1_000,
    discovery: Discovery = "auto",
) -> dict[str, Task]:
    """Every task of ``keys`` once terminal, in the order given; `TimeoutError` after
    ``timeout`` seconds (on the store's clock), `TaskNotFound` for a key with no task unless
    ``missing_ok`` (then it is waited for, as a task a flow will publish)."""
    if discovery not in ("auto", "stream", "poll"):
        raise ConfigurationError(f"discovery: {discovery!r} is not one of 'auto', 'stream', 'poll'")
    if not isinstance(poll_interval_ms, int) or poll_interval_ms < 10:
        raise ConfigurationError(f"poll_interval_ms: {poll_interval_ms!r} is not an int >= 10")
    deadline = _deadline(store, timeout)
    waiter = _Waiter(store, hub, keys, poll_interval_ms, missing_ok, discovery)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(waiter.follow)
        await store.clock.wait_until(deadline, waiter.done)
        await waiter.looked.wait()  # however short the timeout, 0 included: one look
        task_group.cancel_scope.cancel()
    if waiter.error is not None:
        raise waiter.error
    if waiter.remaining:
        raise TimeoutError(
            f"after {timeout} s these tasks have not finished: {waiter.remaining[:20]}"
        )
    return {key: waiter.finished[key] for key in dict.fromkeys(keys)}


async def watch_tasks(
    store: WholeStore, hub: TaskHub, names: Sequence[str] | None, poll_interval_ms: int = 1_000
) -> AsyncIterator[Task]:
    """Every change to a task (of ``names``), as the task after the change. In a process
    whose hub runs (consumers or a waiter hold it) the watch shares it (`_shared_watch`);
    otherwise it keeps a stream (or poll) of its own, as the hub's life is its subscribers'
    task groups and an async iterator, which a caller may leave at any point, cannot hold one:
    a hub started by the watch would close its stream at every yield.

    Its own stream: a drop or rename of the collection ends the server's stream
    (``invalidate``); the watch goes on after it (``startAfter``), with the tasks written to
    the collection of that name from then on. A server that refuses change streams is polled
    instead (`_poll_changes`), said once."""
    if hub.subscribers:
        shared_watch = _shared_watch(store, hub, names, poll_interval_ms)
        async with contextlib.aclosing(shared_watch) as shared:
            async for task in shared:
                yield task
        return
    pipeline = changes_pipeline(every=list(names) if names else [None])
    position = ResumePoint()
    while True:
        try:
            stream = await open_change_stream(
                store, pipeline, max_await_time_ms=MAX_AWAIT_MS, **position.open_options()
            )
        except OperationFailure as exc:
            if position.token is None and refuses_streams(exc):
                since = store.clock.now()
                log.warning(
                    "watch: the server refused a change stream (%s); polling every %.1f s "
                    "instead (changes between two polls show as the latest of them)",
                    exc,
                    poll_interval_ms / 1000,
                    extra={"action": "polling_fallback"},
                )
                async for task in _poll_changes(store, names, since, poll_interval_ms):
                    yield task
                return  # pragma: no cover - the poll never ends
            if position.token is None or exc.code not in RESUME_IMPOSSIBLE:
                raise StoreError(
                    f"watching needs change streams, and the server refused one: {exc}"
                ) from exc
            log.warning("watch: cannot resume (%s); changes meanwhile are not shown", exc)
            position = ResumePoint()
            continue
        if position.token is None:
            position.opened(stream)
        try:
            while stream.alive:
                event = await stream.try_next()
                position.read(stream, event)
                if event is not None and event.get("fullDocument") is not None:
                    yield Task.model_validate(event["fullDocument"])
        finally:
            await close_quietly(stream)
        log.info("watch: the stream ended (its collection dropped or renamed); going on after it")


async def _shared_watch(
    store: WholeStore, hub: TaskHub, names: Sequence[str] | None, poll_interval_ms: int
) -> AsyncGenerator[Task, None]:
    """The watch as a subscriber of the process's hub: every write of its names, in the hub's
    order, and the hub's reconnects and poll fallback. Unsubscribed when the caller closes the
    iterator (or drops it: its finalizer closes it). A resync (this watch fell further behind
    than the hub keeps, or the stream lost its place) reads the tasks written since the last
    one shown, less `CLOCK_SKEW`: changes meanwhile show as the latest of them, and a task
    shown just before may show again."""
    options = WorkerOptions(poll_interval_ms=poll_interval_ms)
    sub = Subscription(options, every=list(names) if names else [None])
    latest = store.clock.now()
    async with contextlib.aclosing(hub.follow(sub)) as events:
        async for event in events:
            if event is not RESYNC:
                latest = max(latest, event.updated_at)
                yield event
                continue
            log.warning(
                "watch: fell behind the process's change stream (or it lost its place); "
                "reading the tasks written since %s again",
                latest,
                extra={"action": "watch_resync"},
            )
            for task in await store.changed_since(latest - CLOCK_SKEW, names):
                latest = max(latest, task.updated_at)
                yield task


async def _poll_changes(
    store: WholeStore, names: Sequence[str] | None, since: dt.datetime, poll_interval_ms: int
) -> AsyncIterator[Task]:
    """The tasks written since the last poll, by ``updated_at`` (set by every write, on the
    writer's clock), from the moment the watch started. A poll reads from the previous poll's
    latest ``updated_at`` on (inclusive: two writes may share a millisecond), minus what it
    already showed of that millisecond. Writers' clocks differ: a write stamped more than a
    poll interval in the past by a clock behind ours may be missed; the stream has no such gap.
    Each poll reads the interval's writes through the ``changes`` index."""
    shown: set[tuple[str, int]] = set()  # (key, version) shown at the ``since`` millisecond
    while True:
        await sleep(store.clock, poll_interval_ms / 1000)
        found = await store.changed_since(since, names)
        for task in found:
            seen = (task.key, task.version)
            if task.updated_at == since and seen in shown:
                continue
            yield task
        if found:
            latest = max(task.updated_at for task in found)
            if latest != since:
                since, shown = latest, set()
            shown |= {(t.key, t.version) for t in found if t.updated_at == latest}


class Waiting:
    """Waiting for tasks to end, and watching them change, through the process's hub
    (`root.Services` ``.waiting``)."""

    def __init__(self, store: WholeStore, hub: TaskHub) -> None:
        self._store = store
        self._hub = hub

    async def wait(
        self,
        keys: Sequence[str],
        *,
        timeout: float | None,  # noqa: ASYNC109 - the API (DESIGN.md), on the injectable clock
        missing_ok: bool = False,
        poll_interval_ms: int = 1_000,
        discovery: Discovery = "auto",
    ) -> dict[str, Task]:
        return await wait_for(
            self._store,
            self._hub,
            keys,
            timeout=timeout,
            missing_ok=missing_ok,
            poll_interval_ms=poll_interval_ms,
            discovery=discovery,
        )

    def watch(self, names: Sequence[str] | None) -> AsyncIterator[Task]:
        return watch_tasks(self._store, self._hub, names)
