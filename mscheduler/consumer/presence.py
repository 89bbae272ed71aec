"""A consumer's entry in the live workers (`store.workers`): written at start, rewritten every
``heartbeat_ms`` with what it runs, deleted at stop. It costs one small upsert per heartbeat
(two a minute by default) and one delete at stop, on the collection beside the tasks; a
failed write is logged and retried at the next beat, never the consumer's end.

It also supplies the peer counts of the ``spread`` claim policy (`spread`, owned by the
claimer): the live workers serving its names, read after each heartbeat and handed to the
policy (`PeerCounts`); the claimer reads them the same way (`count_peers`) before it lets a
task wait on a count older than a spread."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Iterable, Sequence
from typing import Protocol

import anyio
from anyio.abc import TaskGroup

from ..clock import Clock, sleep
from ..errors import BackendUnavailable, StoreError
from ..models import WorkerInfo
from ..store.components import Store
from ..store.workers import MAX_LISTED_KEYS
from ..worker_options import WorkerOptions

log = logging.getLogger(__name__)

_REMOVE_TIMEOUT_S = 5.0  # real seconds the delete at stop may take before we give up


class LiveWorkers(Protocol):
    """The live workers' entries (`store.workers`): those serving any of ``names``."""

    def registered(self, names: Sequence[str]) -> Awaitable[list[WorkerInfo]]: ...


class PeerCounts(Protocol):
    """What the peer counts are handed to: the claimer's spread policy (`ClaimSpread`).
    Invariant: each count replaces the last one; a failed read keeps it (`count_failed`)."""

    @property
    def enabled(self) -> bool: ...

    def count_peers(self, peers: Iterable[WorkerInfo], now: dt.datetime) -> None: ...

    def count_failed(self, now: dt.datetime) -> None: ...


class Running(Protocol):
    """The keys this worker runs now (the executor), listed in its entry."""

    @property
    def running_keys(self) -> list[str]: ...


async def count_peers(
    workers: LiveWorkers, names: Sequence[str], worker_id: str, counts: PeerCounts, clock: Clock
) -> None:
    """One small read of the live workers serving ``names``, handed to ``counts``, only when
    that policy is on (a failure keeps the count it had, read again a spread later at the
    soonest)."""
    if not counts.enabled:
        return
    try:
        peers = await workers.registered(names)
    except (BackendUnavailable, StoreError) as exc:
        log.warning(
            "live workers not counted: %s",
            exc,
            extra={"action": "peers_not_counted", "worker_id": worker_id},
        )
        counts.count_failed(clock.now())
        return
    counts.count_peers(peers, clock.now())


class Presence:
    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        options: WorkerOptions,
        running: Running,
        counts: PeerCounts,
    ) -> None:
        self._store = store
        self._names = list(names)
        self._options = options
        self._running = running
        self._counts = counts  # handed the peers read after each heartbeat
        self._started_at: dt.datetime | None = None
        self.instance = uuid.uuid4().hex  # this run of the worker id (`WorkerInfo.instance`)

    @property
    def started_at(self) -> dt.datetime | None:
        """When the first entry was written (None before `start`)."""
        return self._started_at

    def info(self) -> WorkerInfo:
        now = self._store.clock.now()
        if self._started_at is None:
            self._started_at = now
        keys = self._running.running_keys
        return WorkerInfo(
            worker_id=self._options.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            names=self._names,
            max_running=self._options.max_running,
            running=len(keys),
            running_keys=keys[:MAX_LISTED_KEYS],
            started_at=self._started_at,
            last_seen_at=now,
            heartbeat_ms=self._options.heartbeat_ms,
            instance=self.instance,
        )

    async def beat(self) -> None:
        try:
            await self._store.workers.beat(self.info())
        except (BackendUnavailable, StoreError) as exc:
            log.warning(
                "live workers entry not refreshed: %s",
                exc,
                extra={"action": "heartbeat_failed", "worker_id": self._options.worker_id},
            )
        await count_peers(
            self._store.workers,
            self._names,
            self._options.worker_id,
            self._counts,
            self._store.clock,
        )

    async def start(self, task_group: TaskGroup) -> None:
        """The first beat, before the consumer says it started; then one per heartbeat."""
        await self.beat()
        task_group.start_soon(self._beat_loop)

    async def _beat_loop(self) -> None:
        while True:
            await sleep(self._store.clock, self._options.heartbeat_ms / 1000)
            await self.beat()

    async def leave(self) -> None:
        """At a graceful stop, so the worker is no longer listed (shielded: a stop that is
        being cancelled still says goodbye, within a bound)."""
        with anyio.move_on_after(_REMOVE_TIMEOUT_S, shield=True):
            try:
                await self._store.workers.remove(self._options.worker_id)
            except (BackendUnavailable, StoreError) as exc:
                log.warning(
                    "live workers entry not removed (it will show dead): %s",
                    exc,
                    extra={"action": "unregister_failed", "worker_id": self._options.worker_id},
                )
