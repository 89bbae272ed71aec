"""A consumer's entry in the live workers (`store.workers`): written at start, rewritten every
``heartbeat_ms`` with what it runs, deleted at stop. It costs one small upsert per heartbeat
(two a minute by default) and one delete at stop, on the collection beside the tasks; a
failed write is logged and retried at the next beat, never the consumer's end. The ``spread``
claim policy (`spread`) reads the live workers here too: at each heartbeat, and before it lets
a task wait on a count older than a spread."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence

import anyio
from anyio.abc import TaskGroup

from ..clock import sleep
from ..errors import BackendUnavailable, StoreError
from ..models import WorkerInfo
from ..store.components import Store
from ..store.workers import MAX_LISTED_KEYS
from ..worker_options import WorkerOptions
from .heap import ClaimHeap
from .spread import ClaimSpread

log = logging.getLogger(__name__)

_REMOVE_TIMEOUT_S = 5.0  # real seconds the delete at stop may take before we give up


class Presence:
    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        options: WorkerOptions,
        heap: ClaimHeap,
        running_keys: Callable[[], list[str]],
    ) -> None:
        # The claim policy that needs the live workers this entry is among (`spread`).
        self.spread = ClaimSpread(
            options.claim_spread_ms, heap, options.heap_size, options.worker_id
        )
        self._store = store
        self._names = list(names)
        self._options = options
        self._running_keys = running_keys
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
        keys = self._running_keys()
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

    async def admit(self, due: list[str], now: dt.datetime) -> list[str]:
        """Of the due keys, those the claim policy lets this consumer claim now. Before it
        decides on peers counted more than a spread ago, it counts them again: peers that
        stopped or filled up since are not waited for, and peers that started since get
        their share."""
        running = len(self._running_keys())
        if self.spread.stale(now) and self.spread.decides(due, running):
            await self._count_peers()
            now = self._store.clock.now()
        return self.spread.admit(due, running, self._options.max_running, now)

    async def beat(self) -> None:
        try:
            await self._store.workers.beat(self.info())
        except (BackendUnavailable, StoreError) as exc:
            log.warning(
                "live workers entry not refreshed: %s",
                exc,
                extra={"action": "heartbeat_failed", "worker_id": self._options.worker_id},
            )
        await self._count_peers()

    async def _count_peers(self) -> None:
        """One small read of the live workers serving our names, for the spread policy only
        (a failure keeps the count it had, read again a spread later at the soonest)."""
        if not self.spread.enabled:
            return
        try:
            peers = await self._store.workers.registered(self._names)
        except (BackendUnavailable, StoreError) as exc:
            log.warning(
                "live workers not counted: %s",
                exc,
                extra={"action": "peers_not_counted", "worker_id": self._options.worker_id},
            )
            self.spread.count_failed(self._store.clock.now())
            return
        self.spread.count_peers(peers, self._store.clock.now())

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
