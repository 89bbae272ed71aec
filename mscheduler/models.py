"""Pydantic models of the task document; field names are the document's, so the shell reads them."""

from __future__ import annotations

import datetime as dt
import enum
import os
import secrets
import socket
import traceback
from collections.abc import Callable
from typing import Annotated, Any, Literal

from bson import ObjectId
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from . import constants as c
from .clock import to_bson_time
from .errors import ConfigurationError


class TaskState(str, enum.Enum):
    PENDING = "pending"
    BLOCKED = "blocked"  # waiting on dependencies
    RUNNING = "running"
    SUCCESS = "success"
    FAIL = "fail"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({TaskState.SUCCESS, TaskState.FAIL, TaskState.CANCELLED})
CLAIMABLE_STATES = (TaskState.PENDING, TaskState.RUNNING)


class WorkerStateKind(str, enum.Enum):
    RUNNING = "running"
    SUCCESS = "success"
    FAIL = "fail"  # the handler failed: counts against max_unexpected_retries
    TIMEOUT = "timeout"  # the worker stopped pinging: counts against max_unexpected_retries
    RELEASED = "released"  # given back (shutdown, cancel): does not count as a failure


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    # pymongo returns naive UTC unless tz_aware=True, mongomock always does.
    return None if value is None else to_bson_time(value)


UtcDatetime = Annotated[dt.datetime, AfterValidator(_utc)]


def _object_id(value: Any) -> ObjectId:
    if isinstance(value, ObjectId):
        return value
    if isinstance(value, str) and ObjectId.is_valid(value):
        return ObjectId(value)
    raise ValueError(f"{value!r} is not an ObjectId")


ObjectIdField = Annotated[
    ObjectId,
    PlainValidator(_object_id),
    PlainSerializer(lambda oid: str(oid), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string"}),
]


def _check_text(value: str, field: str, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string")
    if len(value) > max_length:
        raise ValueError(f"{field} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL characters")
    return value


def checked(check: Callable[[str], str], value: str) -> str:
    """Run one of the checks below, as a `ConfigurationError` naming the problem."""
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def check_key(key: str) -> str:
    return _check_text(key, "key", c.MAX_KEY_LENGTH)


def check_name(name: str) -> str:
    return _check_text(name, "name", c.MAX_NAME_LENGTH)


def check_worker_id(worker_id: str) -> str:
    return _check_text(worker_id, "worker_id", c.MAX_WORKER_ID_LENGTH)


class TaskOptions(BaseModel):
    """How a task is claimed and retried; stored as the document's ``options``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: int = Field(default=c.DEFAULT_PRIORITY, ge=-(2**31), le=2**31 - 1)
    concurrent_worker_cnt: int = Field(
        default=c.DEFAULT_CONCURRENT_WORKER_CNT, ge=1, le=c.MAX_CONCURRENT_WORKER_CNT
    )
    max_unexpected_retries: int = Field(
        default=c.DEFAULT_MAX_UNEXPECTED_RETRIES, ge=0, le=c.MAX_UNEXPECTED_RETRIES
    )
    # Durations are bounded so that no date computed from them (here or on the server) can
    # overflow: an unbounded one was accepted by publish, then crashed the consumer.
    unexpected_retry_delay_ms: int = Field(
        default=c.DEFAULT_UNEXPECTED_RETRY_DELAY_MS, ge=0, le=30 * 86_400_000
    )
    ping_interval_ms: int = Field(default=c.DEFAULT_PING_INTERVAL_MS, ge=1, le=86_400_000)
    worker_timeout_ms: int = Field(default=c.DEFAULT_WORKER_TIMEOUT_MS, ge=1, le=7 * 86_400_000)
    specific_worker_ids: list[str] = Field(default_factory=list, max_length=c.MAX_SPECIFIC_WORKERS)
    not_before: UtcDatetime | None = None
    max_tries: int | None = Field(default=None, ge=1)
    """Attempts in all, ``RetryLater`` ones included; None: only the retry limit applies."""
    on_dependency_failure: Literal["cancel", "run"] = "cancel"
    """When a dependency fails or is cancelled: cancel this task too, or run it anyway."""

    @field_validator("specific_worker_ids")
    @classmethod
    def _worker_ids(cls, ids: list[str]) -> list[str]:
        for worker_id in ids:
            check_worker_id(worker_id)
        return sorted(set(ids))

    @model_validator(mode="after")
    def _timeout_exceeds_ping(self) -> TaskOptions:
        if self.worker_timeout_ms <= self.ping_interval_ms:
            raise ValueError(
                f"worker_timeout_ms ({self.worker_timeout_ms}) must be greater than "
                f"ping_interval_ms ({self.ping_interval_ms}), or every lease expires "
                "between two pings"
            )
        return self

    def to_document(self) -> dict[str, Any]:
        """The stored ``options``: ``not_before`` lives at the top level of the task instead."""
        return self.model_dump(exclude={"not_before"})


class ErrorInfo(BaseModel):
    """A bounded summary of why an attempt failed: enough to debug, never a 16 MiB traceback."""

    model_config = ConfigDict(extra="ignore")

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        # Frames only (the message is stored once, bounded): the innermost ones matter most.
        frames = traceback.format_tb(exc.__traceback__)
        tail = "".join(frames[-c.MAX_TRACEBACK_LINES :])[-c.MAX_TRACEBACK_CHARS :]
        return cls(
            type=type(exc).__qualname__,
            message=_storable_text(_message_of(exc))[: c.MAX_ERROR_MESSAGE_CHARS],
            traceback=_storable_text(tail),
        )

    @classmethod
    def from_message(cls, type_: str, message: str) -> ErrorInfo:
        return cls(type=type_, message=message[: c.MAX_ERROR_MESSAGE_CHARS])


def _message_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` fails: one task's
    odd exception must never take the consumer down."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<str() of this {type(exc).__qualname__} raised {type(inner).__qualname__}>"


def _storable_text(text: str) -> str:
    """BSON strings are UTF-8: a lone surrogate would make the whole write fail."""
    return text.encode("utf-8", "replace").decode("utf-8")


class WorkerState(BaseModel):
    """One worker's claim on a task and how it ended."""

    model_config = ConfigDict(extra="ignore")

    worker_id: str
    run_id: str
    state: WorkerStateKind
    started_at: UtcDatetime
    ping_expire_at: UtcDatetime | None = None  # set only while running
    finished_at: UtcDatetime | None = None
    error: ErrorInfo | None = None
    result: Any = None

    def is_live(self, now: dt.datetime) -> bool:
        return (
            self.state is WorkerStateKind.RUNNING
            and self.ping_expire_at is not None
            and self.ping_expire_at > now
        )


class Task(BaseModel):
    """A task document as read from the collection."""

    model_config = ConfigDict(extra="ignore")

    id: ObjectIdField = Field(alias="_id")
    key: str
    name: str
    payload: Any = None
    options: TaskOptions
    state: TaskState
    next_claim_at: UtcDatetime | None = None
    not_before: UtcDatetime | None = None
    retry_at: UtcDatetime | None = None
    created_at: UtcDatetime
    updated_at: UtcDatetime
    version: int = 0
    depends_on: list[str] = Field(default_factory=list)
    deps_pending: list[str] = Field(default_factory=list)  # dependencies not yet succeeded
    deps_failed: list[str] = Field(default_factory=list)  # dependencies that failed/cancelled
    dependent_count: int = 0
    dependents_notified: bool | None = None
    finished_at: UtcDatetime | None = None  # when the task ended
    worker_states: list[WorkerState] = Field(default_factory=list)
    result: Any = None
    error: ErrorInfo | None = None

    @model_validator(mode="before")
    @classmethod
    def _options_with_not_before(cls, data: Any) -> Any:
        # not_before is a top-level field (the claim index uses it); TaskOptions carries it too.
        if isinstance(data, dict) and isinstance(data.get("options"), dict):
            data = dict(data)
            data["options"] = {**data["options"], "not_before": data.get("not_before")}
        return data

    def states(self, kind: WorkerStateKind) -> list[WorkerState]:
        return [ws for ws in self.worker_states if ws.state is kind]

    @property
    def unexpected_failures(self) -> int:
        return len(self.states(WorkerStateKind.FAIL)) + len(self.states(WorkerStateKind.TIMEOUT))

    def next_claim_for(self, worker_id: str, now: dt.datetime) -> dt.datetime | None:
        """When ``worker_id`` might claim this task (None: not as things stand).

        The client-side half of the claim filter, used only to decide what to try: the claim
        itself re-checks everything atomically on the server."""
        if self.state not in CLAIMABLE_STATES or self.deps_pending:
            return None
        if self.options.specific_worker_ids and worker_id not in self.options.specific_worker_ids:
            return None
        for ws in self.worker_states:
            if ws.worker_id == worker_id and (
                ws.state is WorkerStateKind.SUCCESS or ws.is_live(now)
            ):
                return None
        return self.next_claim_at


class StatsRow(BaseModel):
    """Tasks of one name in one state (`Scheduler.stats`)."""

    name: str
    state: TaskState
    count: int
    running_workers: int = 0
    oldest_age_s: float | None = None  # pending only: how long the oldest has waited


class PublishResult(BaseModel):
    """What publish did: ``created`` a new task, ``replaced`` a finished one, or neither."""

    task: Task
    created: bool
    replaced: bool = False
    payload_updated: bool = False


class Lease(BaseModel):
    """A worker's fenced hold on a task: every write for it matches ``key + worker_id + run_id``."""

    model_config = ConfigDict(frozen=True)

    key: str
    worker_id: str
    run_id: str
    task: Task

    @property
    def ping_expire_at(self) -> dt.datetime | None:
        for ws in self.task.worker_states:
            if ws.run_id == self.run_id:
                return ws.ping_expire_at
        return None


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
    # them can overflow a datetime (``shutdown_grace_ms=10**15`` once crashed ``stop()``).
    retry_backoff_ms: int = Field(default=200, ge=0, le=_DAY_MS)
    retry_backoff_max_ms: int = Field(default=10_000, ge=0, le=_DAY_MS)
    shutdown_grace_ms: int = Field(default=30_000, ge=0, le=_DAY_MS)
    cancel_timeout_ms: int = Field(default=10_000, ge=0, le=_DAY_MS)
    """How long a cancelled handler (shutdown, remote cancel, lost lease) may take to unwind.
    Past it the handler is abandoned: left running, its outcome never written, logged as an
    error, so that `stop()` returns."""
    heap_size: int = Field(default=10_000, ge=1)
    fetch_batch_size: int = Field(default=500, ge=1)
    poll_interval_ms: int = Field(default=5_000, ge=10, le=_DAY_MS)
    """Re-fetch interval when the server has no change streams (standalone mongod)."""
    discovery: Discovery = "auto"
    """How new work is found: ``auto`` listens on a change stream and, when the server refuses
    one (for any reason), polls instead and tries the stream again every
    ``stream_retry_interval_ms``; ``stream`` fails loudly when it is refused; ``poll`` never
    opens one."""
    stream_retry_interval_ms: int = Field(default=60_000, ge=10, le=_DAY_MS)
    reconnect_backoff_ms: int = Field(default=500, ge=1, le=3_600_000)
    reconnect_backoff_max_ms: int = Field(default=30_000, ge=1, le=3_600_000)

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, worker_id: str) -> str:
        return check_worker_id(worker_id)

    def handler_retry_delay(self, attempt: int) -> float:
        """Seconds before local handler retry ``attempt`` (0-based): doubling, capped."""
        return _doubling(self.retry_backoff_ms, self.retry_backoff_max_ms, attempt)

    def reconnect_delay(self, attempt: int) -> float:
        """Seconds before retrying the database after ``attempt`` failures: doubling, capped."""
        return _doubling(self.reconnect_backoff_ms, self.reconnect_backoff_max_ms, attempt)


def _doubling(base_ms: int, max_ms: int, attempt: int) -> float:
    delay_ms: int = min(base_ms * 2 ** min(attempt, 32), max_ms)
    return delay_ms / 1000
