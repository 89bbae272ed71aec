"""How a consumer runs (`WorkerOptions`): the options of a process, never stored in a task."""

from __future__ import annotations

import os
import secrets
import socket
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .models import check_worker_id
from .retry_policy import doubling_delay_s


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


Discovery = Literal["auto", "stream", "poll"]
_DAY_MS = 86_400_000


class WorkerOptions(BaseModel):
    """How a consumer runs: its identity, capacity, local retries and shutdown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker_id: str = Field(default_factory=_default_worker_id)
    max_running: int = Field(default=16, ge=1, le=100_000)
    handler_retries: int = Field(default=0, ge=0, le=100)
    """Local re-runs of a failed handler, within the same lease, before recording ``fail``."""
    # Durations are bounded (a day; an hour for reconnects) so that no clock arithmetic on
    # them can overflow a datetime (``now + shutdown_grace_ms`` is computed at ``stop()``).
    retry_backoff_ms: int = Field(default=200, ge=0, le=_DAY_MS)
    retry_backoff_max_ms: int = Field(default=10_000, ge=0, le=_DAY_MS)
    shutdown_grace_ms: int = Field(default=30_000, ge=0, le=_DAY_MS)
    cancel_timeout_ms: int = Field(default=10_000, ge=0, le=_DAY_MS)
    """How long a cancelled handler (shutdown, remote cancel, lost lease) may take to unwind.
    Past it the handler is abandoned: left running, its outcome never written, logged as an
    error, so that `stop()` returns."""
    # Bounded so that a typo cannot ask for memory or a cursor limit no server gives.
    heap_size: int = Field(default=10_000, ge=1, le=10_000_000)
    fetch_batch_size: int = Field(default=500, ge=1, le=100_000)
    """Tasks read by one fetch of the consumer (at start, after a lost stream, when its heap
    drains after it was full, each poll): what it may claim soonest. The heap holds up to
    ``heap_size``, fed by change events too."""
    poll_interval_ms: int = Field(default=5_000, ge=10, le=_DAY_MS)
    """Where the server has no change streams (a standalone mongod): how often the process
    reads the writes of its names whatever it was told. Between these reads it reads the
    signal that writers bump (`store.signal`, a fraction of a second apart:
    `services.discovery.poller.SIGNAL_INTERVAL`) and reads the writes at once when it moved:
    a task starts about as soon as with a change stream, so this is only the backstop of a
    lost signal, and lowering it buys no speed."""
    schedule_refresh_ms: int = Field(default=60_000, ge=10, le=_DAY_MS)
    """How often a consumer looks for new schedules of its names (it wakes for the next
    occurrence of those it knows on its own), ends its names' expired tasks, and reads their
    paused names and limits again (it is told of their changes at once; this bounds how late
    a change whose signal was lost on the network holds): the reads an idle consumer makes."""
    heartbeat_ms: int = Field(default=30_000, ge=10, le=_DAY_MS)
    """How often a consumer rewrites its entry in the live workers (`Scheduler.workers`):
    one small write each time; it is shown dead after two missed heartbeats (or once its
    leases expired unpinged)."""
    claim_spread_ms: int | None = Field(default=1_000, ge=1, le=_DAY_MS)
    """The ``spread`` policy (`consumer.spread`): a burst is shared across the live workers
    of its name that have a free slot, instead of all going to whichever looked first. A busy
    consumer lets a new task wait this long, so that an idle peer gets it; what no peer took
    by then is claimed, a share per worker, the rest after one more wait. A consumer with
    more due than free slots (a drain), or whose name no other worker with a free slot
    serves, claims at once. One second: more than a peer takes to see a task, with change
    streams or without (the signal, `store.signal`). It costs one small read of the live
    workers per heartbeat, and one more at most once a spread while claiming beside running
    tasks. None: greedy, as many due tasks as there are free slots."""
    discovery: Discovery = "auto"
    """How new work is found: ``auto`` listens on a change stream and, when the server refuses
    one (for any reason), polls instead and tries the stream again every
    ``stream_retry_interval_ms``; ``stream`` fails loudly when it is refused; ``poll`` never
    opens one. The process's consumers and waiters share one stream or poll: it polls by
    choice only while every one of them asked to poll."""
    stream_retry_interval_ms: int = Field(default=60_000, ge=10, le=_DAY_MS)
    backstop_interval_ms: int = Field(default=60_000, ge=10, le=_DAY_MS)
    """While the change stream is open, one page of the tasks claimable soonest (a read of up
    to ``fetch_batch_size`` tasks on the claim index) is fetched this often: a stream can
    stall without an error (a primary that lost its majority beside an arbiter; a quiet shard
    delays a sharded cluster's events), and this bounds how long a consumer then stays idle
    beside claimable work."""
    reconnect_backoff_ms: int = Field(default=500, ge=1, le=3_600_000)
    reconnect_backoff_max_ms: int = Field(default=30_000, ge=1, le=3_600_000)
    burst: bool = False
    """Stop by itself (as `Consumer.stop`) once none of its names has a task it may claim now
    and its handlers are done: a drain for a CI job or a cron-driven run. Tasks due later
    (a delay, a retry to come) and tasks other workers run do not keep it; a paused name's
    tasks do not either."""
    max_tasks: int | None = Field(default=None, ge=1, le=2**31 - 1)
    """Stop by itself once this many handler runs (claims it started) have ended; None: no
    bound. It claims no more than that many, so the last runs finish before it stops."""

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, worker_id: str) -> str:
        return check_worker_id(worker_id)

    def handler_retry_delay(self, attempt: int) -> float:
        """Seconds before local handler retry ``attempt`` (0-based): doubling, capped
        (`retry_policy`)."""
        return doubling_delay_s(self.retry_backoff_ms, self.retry_backoff_max_ms, attempt)

    def reconnect_delay(self, attempt: int) -> float:
        """Seconds before retrying the database after ``attempt`` failures: the same doubling
        curve, capped."""
        return doubling_delay_s(self.reconnect_backoff_ms, self.reconnect_backoff_max_ms, attempt)
