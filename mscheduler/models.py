"""Pydantic models of the documents (tasks, workers, limits) and of what the API returns;
field names are the document's, so the shell reads them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import secrets
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from typing import Annotated, Any, Literal, TypedDict

from bson import ObjectId
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import Required

from . import constants as c
from .clock import UTC, Clock, to_bson_time
from .errors import ConfigurationError, field_errors
from .retry_policy import BACKOFF_DEFAULTS


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

ReplaceFinished = bool | Collection[TaskState | str]
"""A publish's ``replace_finished``: ``True`` (every finished state), ``False`` (none), or the
finished states whose task is published anew, e.g. ``("fail", "cancelled")``."""


def finished_states_to_replace(value: object) -> frozenset[TaskState]:
    """The finished states a ``replace_finished`` names (`ReplaceFinished`), the one reading
    of it for every surface (publish, specs, the CLI, the HTTP API). Anything else raises a
    ValueError naming ``replace_finished``: a bare string too, which would otherwise read as
    its letters."""
    if value is True:
        return TERMINAL_STATES
    if value is False:
        return frozenset()
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise ValueError(
            "replace_finished: expected True, False or a collection of finished states "
            f"(success, fail, cancelled), got {value!r}"
        )
    states: set[TaskState] = set()
    finished = ", ".join(sorted(state.value for state in TERMINAL_STATES))
    for item in value:
        try:
            state = TaskState(item)
        except ValueError:
            state = None
        if state is None or state not in TERMINAL_STATES:
            raise ValueError(
                f"replace_finished: {item!r} is not a finished state (one of {finished})"
            )
        states.add(state)
    return frozenset(states)


# What every document format keeps: a document of a format newer than this version knows
# (`constants.DOCUMENT_FORMAT`) is read as these fields alone, and left to a newer worker.
_ENVELOPE = ("_id", "key", "name", "created_at", "updated_at", "format")


class WorkerStateKind(str, enum.Enum):
    RUNNING = "running"
    SUCCESS = "success"
    FAIL = "fail"  # the handler failed: counts against max_unexpected_retries
    TIMEOUT = "timeout"  # the worker stopped pinging: counts against max_unexpected_retries
    RELEASED = "released"  # given back (shutdown, cancel): does not count as a failure


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    # pymongo returns naive UTC unless tz_aware=True, mongomock always does. A time read back
    # is already whole milliseconds (BSON's precision): the common case returns at once.
    if value is None:
        return None
    if value.tzinfo is None and not value.microsecond % 1000:
        return value.replace(tzinfo=UTC)
    return to_bson_time(value)


UtcDatetime = Annotated[dt.datetime, AfterValidator(_utc)]
# What a user gives: a naive time is refused, not guessed to be UTC (it may be local time).
AwareUtcDatetime = Annotated[AwareDatetime, AfterValidator(_utc)]


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
        raise ValueError(f"{field}: must be a non-empty string")
    if len(value) > max_length:
        raise ValueError(f"{field}: {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise ValueError(f"{field}: must not contain NUL characters")
    bad = _lone_surrogate(value)
    if bad is not None:
        raise ValueError(
            f"{field}: not valid UTF-8 text: a lone surrogate {value[bad]!r} at position {bad}"
        )
    return value


def _lone_surrogate(text: str) -> int | None:
    """Where ``text`` cannot be UTF-8 (BSON strings are): a lone surrogate's index, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


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

    priority: int = Field(default=c.DEFAULT_PRIORITY, ge=c.MIN_PRIORITY, le=c.MAX_PRIORITY)
    concurrent_worker_cnt: int = Field(
        default=c.DEFAULT_CONCURRENT_WORKER_CNT, ge=1, le=c.MAX_CONCURRENT_WORKER_CNT
    )
    max_unexpected_retries: int = Field(
        default=c.DEFAULT_MAX_UNEXPECTED_RETRIES, ge=0, le=c.MAX_UNEXPECTED_RETRIES
    )
    # Durations are bounded so that no date computed from them (here or on the server) can
    # overflow: an unbounded one would be accepted by publish, then crash the consumer.
    unexpected_retry_delay_ms: int = Field(
        default=c.DEFAULT_UNEXPECTED_RETRY_DELAY_MS, ge=0, le=c.MAX_RETRY_DELAY_MS
    )
    ping_interval_ms: int = Field(default=c.DEFAULT_PING_INTERVAL_MS, ge=1, le=86_400_000)
    worker_timeout_ms: int = Field(default=c.DEFAULT_WORKER_TIMEOUT_MS, ge=1, le=7 * 86_400_000)
    timeout_ms: int | None = Field(default=None, ge=1, le=7 * 86_400_000)
    """Hard time limit of one attempt: past it the handler is cancelled and the attempt is an
    unexpected failure (`TaskTimeout`). None: no limit, only the lease's pings bound it."""
    specific_worker_ids: list[str] = Field(default_factory=list, max_length=c.MAX_SPECIFIC_WORKERS)
    not_before: AwareUtcDatetime | None = None
    """No claim before this time (timezone-aware); ``publish(delay=...)`` sets it for you."""
    max_tries: int | None = Field(default=None, ge=1, le=c.MAX_TRIES)
    """Attempts in all, ``RetryLater`` ones included; None: only the retry limit applies.
    At least ``concurrent_worker_cnt``: each of those workers' successes is an attempt."""
    expires_at: AwareUtcDatetime | None = None
    """Not started by then, the task is never claimed and ends as ``cancelled`` (its error
    says ``expired``); a task already running is not affected."""
    on_dependency_failure: Literal["cancel", "run"] = "cancel"
    """When a dependency fails or is cancelled: cancel this task too, or run it anyway."""
    retry_backoff: float = Field(
        default=BACKOFF_DEFAULTS["retry_backoff"], ge=1.0, le=c.MAX_RETRY_BACKOFF
    )
    """After the n-th unexpected failure the task waits ``unexpected_retry_delay_ms`` times
    ``retry_backoff ** (n - 1)`` (`retry_policy`); 1: the same delay every time."""
    retry_backoff_max_ms: int | None = Field(
        default=BACKOFF_DEFAULTS["retry_backoff_max_ms"], gt=0, le=c.MAX_RETRY_DELAY_MS
    )
    """The longest a failure's delay grows to before jitter; None: no maximum of its own."""
    retry_jitter: float = Field(default=BACKOFF_DEFAULTS["retry_jitter"], ge=0.0, le=1.0)
    """Each failure's delay is multiplied by a factor drawn uniformly from
    ``[1 - retry_jitter, 1 + retry_jitter]``, so tasks that failed together retry apart."""
    partition: str | None = None
    """The task's partition (a tenant, a customer): among claimable tasks of its name and
    priority, claims take partitions in turn, and ``set_limit(partition_max_running=N)``
    runs at most N of each partition at once. None: no partition (the task takes its place
    by its publish time)."""

    @field_validator("specific_worker_ids")
    @classmethod
    def _worker_ids(cls, ids: list[str]) -> list[str]:
        if not ids:  # nearly every task: not pinned to workers
            return ids
        for index, worker_id in enumerate(ids):
            _check_text(worker_id, f"specific_worker_ids[{index}]", c.MAX_WORKER_ID_LENGTH)
        return sorted(set(ids))

    @field_validator("partition")
    @classmethod
    def _partition(cls, partition: str | None) -> str | None:
        if partition is None:
            return None
        return _check_text(partition, "partition", c.MAX_PARTITION_LENGTH)

    @model_validator(mode="after")
    def _timeout_exceeds_ping(self) -> TaskOptions:
        if self.worker_timeout_ms <= self.ping_interval_ms:
            raise ValueError(
                f"worker_timeout_ms ({self.worker_timeout_ms}) must be greater than "
                f"ping_interval_ms ({self.ping_interval_ms}), or every lease expires "
                "between two pings"
            )
        return self

    @model_validator(mode="after")
    def _tries_allow_success(self) -> TaskOptions:
        # Each success is an attempt: fewer tries than successes needed can only end in "fail".
        if self.max_tries is not None and self.max_tries < self.concurrent_worker_cnt:
            raise ValueError(
                f"max_tries ({self.max_tries}) must be at least concurrent_worker_cnt "
                f"({self.concurrent_worker_cnt}): the task succeeds only once that many "
                "workers succeeded, and each success is an attempt"
            )
        return self

    def to_document(self) -> dict[str, Any]:
        """The stored ``options``: ``not_before`` lives at the top level of the task instead.
        The retry backoff's options and the partition are stored only when chosen: a task
        that keeps them at their defaults pays nothing for them, and every reader (the
        failure's write included) takes a missing one as its default."""
        left_out = {"not_before"} | {
            name for name, default in BACKOFF_DEFAULTS.items() if getattr(self, name) == default
        }
        if self.partition is None:  # no partition: nothing stored (a missing one is none)
            left_out.add("partition")
        return self.model_dump(exclude=left_out)


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
        tail = "".join(frames[-c.MAX_TRACEBACK_LINES :])
        return cls(
            type=_bounded(type(exc).__qualname__, c.MAX_ERROR_TYPE_BYTES),
            message=_bounded(_message_of(exc), c.MAX_ERROR_MESSAGE_BYTES),
            traceback=_bounded(tail, c.MAX_TRACEBACK_BYTES, keep_end=True),
        )

    @classmethod
    def from_message(cls, type_: str, message: str) -> ErrorInfo:
        return cls(
            type=_bounded(type_, c.MAX_ERROR_TYPE_BYTES),
            message=_bounded(message, c.MAX_ERROR_MESSAGE_BYTES),
        )


def _message_of(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` fails: one task's
    odd exception must never take the consumer down."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<str() of this {type(exc).__qualname__} raised {type(inner).__qualname__}>"


def _bounded(text: str, max_bytes: int, *, keep_end: bool = False) -> str:
    """At most ``max_bytes`` of UTF-8 (the document's size budget counts bytes, and one
    character may take four), with lone surrogates replaced: BSON strings are UTF-8, and one
    would make the whole write fail."""
    data = text.encode("utf-8", "replace")
    if len(data) > max_bytes:
        data = data[-max_bytes:] if keep_end else data[:max_bytes]
    return data.decode("utf-8", "ignore")  # a character cut in two is dropped


class WorkerState(BaseModel):
    """One worker's claim on a task and how it ended."""

    model_config = ConfigDict(extra="ignore")

    worker_id: str
    run_id: str
    state: WorkerStateKind
    started_at: UtcDatetime
    ping_expire_at: UtcDatetime | None = None  # set only while running
    # The holder's last ping (None: none since the claim): when it was last heard, which for
    # an attempt whose lease expired is when its worker died, as far as anyone can tell.
    pinged_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    error: ErrorInfo | None = None
    result: Any = None


class EarlierAttempt(WorkerState):
    """An attempt of an earlier run of the key, as it ended (kept across a retry or a
    ``replace_finished`` publish, without its result): ``run`` says which run it was part
    of, 1 for the key's first."""

    run: int = 1


class Progress(BaseModel):
    """How far a running handler says it is (`Lease.progress`): written within a second."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    fraction: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    message: str = Field(default="", max_length=c.MAX_PROGRESS_MESSAGE)
    worker_id: str | None = None
    at: UtcDatetime | None = None


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
    created_at: UtcDatetime  # when the task was published
    # A partitioned task's place in its name's claim order (`store.partitions`), stored in the
    # document's ``created_at`` (the claim index's field), its publish time being then in
    # ``published_at``; None for a task without a partition, whose place is ``created_at``.
    turn: UtcDatetime | None = None
    updated_at: UtcDatetime
    version: int = 0
    depends_on: list[str] = Field(default_factory=list)
    deps_pending: list[str] = Field(default_factory=list)  # dependencies not yet succeeded
    deps_failed: list[str] = Field(default_factory=list)  # dependencies that failed/cancelled
    dependent_count: int = 0
    dependents_notified: bool | None = None
    finished_at: UtcDatetime | None = None  # when the task ended
    settled_at: UtcDatetime | None = None  # ended and its dependents told: the TTL's date
    worker_states: list[WorkerState] = Field(default_factory=list)
    # Finished states dropped from worker_states to bound the document (constants), counted.
    dropped_attempts: int = 0
    dropped_failures: int = 0  # of those, failed or timed out
    # The key's earlier runs (a retry or a replace_finished publish starts the next one): which
    # run this is, when the first was published, the last KEPT_EARLIER_ATTEMPTS attempts of
    # the earlier runs (oldest first) and how many older ones were dropped. Written only when
    # a run is replaced (`queries.history`); no other write reads or changes them.
    runs: int = 1
    first_created_at: UtcDatetime | None = None
    earlier_attempts: list[EarlierAttempt] = Field(default_factory=list)
    earlier_dropped: int = 0
    # Bumped by each write that may give a consumer work: what consumers' change streams wake on.
    wakes: int = 0
    progress: Progress | None = None  # the latest a running handler reported; null once none runs
    trace_context: dict[str, str] | None = None  # the publisher's OpenTelemetry context
    result: Any = None
    error: ErrorInfo | None = None
    # The document format that wrote the task (`constants.DOCUMENT_FORMAT`); absent is 1, the
    # format of the releases before the marker.
    format: int = 1

    @property
    def newer_format(self) -> bool:
        """Written in a format newer than this version reads: only its envelope (key, name,
        times) was read, as ``blocked``; no worker of this version claims or runs it."""
        return self.format > c.DOCUMENT_FORMAT

    @model_validator(mode="before")
    @classmethod
    def _options_with_not_before(cls, data: Any) -> Any:
        stored = data.get("format") if isinstance(data, dict) else None
        if isinstance(stored, int) and stored > c.DOCUMENT_FORMAT:
            # A newer format: what every format keeps, and no more.
            envelope = {field: data[field] for field in _ENVELOPE if field in data}
            return {**envelope, "options": {}, "state": TaskState.BLOCKED.value}
        if isinstance(data, dict) and data.get("published_at") is not None:
            # A partitioned task: its document's created_at is its turn (`turn`).
            data = {**data, "turn": data.get("created_at"), "created_at": data["published_at"]}
        # not_before is a top-level field (the claim index uses it); TaskOptions carries it too.
        if isinstance(data, dict) and isinstance(data.get("options"), dict):
            data = dict(data)
            # Stored times come back naive UTC from pymongo: aware, as TaskOptions wants them.
            options = {**data["options"], "not_before": data.get("not_before")}
            for field in ("not_before", "expires_at"):
                if isinstance(options.get(field), dt.datetime):
                    options[field] = to_bson_time(options[field])
            data["options"] = options
        return data

    def states(self, kind: WorkerStateKind) -> list[WorkerState]:
        return [ws for ws in self.worker_states if ws.state is kind]

    @property
    def unexpected_failures(self) -> int:
        failed = len(self.states(WorkerStateKind.FAIL)) + len(self.states(WorkerStateKind.TIMEOUT))
        return failed + self.dropped_failures

    @property
    def attempts(self) -> int:
        """Claims made in all, those whose states were dropped from the history included."""
        return len(self.worker_states) + self.dropped_attempts

    @property
    def attempts_in_all(self) -> int:
        """Attempts of every run of the key: this run's and the earlier runs' (dropped ones
        included)."""
        return self.attempts + len(self.earlier_attempts) + self.earlier_dropped

    def taken_over_by(self, run_id: str) -> WorkerState | None:
        """The attempt whose expired lease the claim ``run_id`` took over, or None: the
        attempt just before that claim's, when it ended by its lease expiring (``timeout``)
        rather than by an outcome, a release or a cancel. Claims are appended in order, so
        the attempt just before is the one whose slot the claim took."""
        for index, ws in enumerate(self.worker_states):
            if ws.run_id == run_id:
                if index == 0:
                    return None
                before = self.worker_states[index - 1]
                return before if before.state is WorkerStateKind.TIMEOUT else None
        return None


class StatsRow(BaseModel):
    """Tasks of one name in one state (`Scheduler.stats`)."""

    name: str
    state: TaskState
    count: int
    running_workers: int = 0  # running attempts (a task of concurrent_worker_cnt=3 has 3)
    oldest_age_s: float | None = None  # pending only: how long the oldest has waited
    paused: bool = False  # the name is paused (`Scheduler.pause`): no consumer claims it
    pause_reason: str | None = None  # and why, as given to it
    live_workers: int = 0  # live consumers serving the name (`Scheduler.workers`)


@dataclasses.dataclass(frozen=True)
class TaskPage:
    """One page of `Browse.task_page`: its tasks, and where the next page starts."""

    tasks: list[Task]
    # Where the next page starts (an opaque token for ``after``); None on the last page.
    after: str | None
    # The order of the rows: "key" (a key prefix), "claim" (a name or a state), or "newest".
    order: str


@dataclasses.dataclass(frozen=True)
class PausedName:
    """When and why a name was paused (`Browse.paused_names`)."""

    paused_at: dt.datetime
    reason: str


@dataclasses.dataclass(frozen=True)
class FinishedCount:
    """How many tasks succeeded and failed in one time bucket (since, until]
    (`Browse.finished_counts`)."""

    since: dt.datetime
    until: dt.datetime
    success: int
    fail: int


class PublishResult(BaseModel):
    """What publish did: ``created`` a new task, ``replaced`` a finished one, or neither."""

    task: Task
    created: bool
    replaced: bool = False
    payload_updated: bool = False
    # `Scheduler.retry` with ``with_dependents``: the keys of the dependents it ran again
    # (cancelled by this task's failure, or by a dependency they revive), in the order revived.
    revived: list[str] = Field(default_factory=list)


class _Reported:
    """What `Lease.progress` returns: the report is made, so awaiting this returns at once."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_REPORTED = _Reported()


def new_run_id() -> str:
    """A claim's fencing token: 128 random bits as url-safe base64, 22 characters (every
    write of the lease carries it, so it is kept short)."""
    return secrets.token_urlsafe(16)


class Lease(BaseModel):
    """A worker's fenced hold on a task: every write for it matches ``key + worker_id + run_id``."""

    model_config = ConfigDict(frozen=True)

    key: str
    worker_id: str
    run_id: str
    task: Task
    _progress: Progress | None = PrivateAttr(default=None)
    # The executor's: brings the lease's ping forward (`Executor.progress_reported`).
    _on_progress: Callable[[], None] | None = PrivateAttr(default=None)
    # The claim core's (`consumer.limits`): the name whose limit slot this lease took, "" for
    # none; None where this process does not know (a lease found by key).
    _slot: str | None = PrivateAttr(default=None)

    def progress(self, fraction: float, message: str = "") -> Awaitable[None]:
        """Report how far the handler is, from 0 to 1, with a short message: written within a
        second by the lease's ping, brought forward (at most one write a second per task, and
        one for all the tasks of a worker with progress to write), shown by ``get``, ``show``
        and ``watch``, and cleared when the attempt ends. A bad value raises at once, naming
        the field.

        The call itself reports, from an async handler (``await lease.progress(...)``) or a
        sync one's thread (``lease.progress(...)``, no ``await``): it returns an awaitable
        already done, not a coroutine, so nothing is lost or warned about when it is dropped."""
        try:
            self._progress = Progress(fraction=fraction, message=message)
        except ValidationError as exc:
            raise ConfigurationError(f"progress: {field_errors(exc)}") from None
        if self._on_progress is not None:
            self._on_progress()
        return _REPORTED

    def on_progress(self, callback: Callable[[], None]) -> None:
        """``callback`` runs on each report, in the thread that reports (a sync handler's
        worker thread too): the executor's hands the report to its event loop."""
        self._on_progress = callback

    @property
    def reported_progress(self) -> Progress | None:
        return self._progress

    @property
    def ping_expire_at(self) -> dt.datetime | None:
        own = (ws.ping_expire_at for ws in self.task.worker_states if ws.run_id == self.run_id)
        return next(own, None)


TaskEventKind = Literal["published", "started", "progress", "succeeded", "failed", "cancelled"]


class TaskEvent(BaseModel):
    """What happened to a task, as `Scheduler.events` tells it: derived from the task's
    writes, by any process, as the process's discovery hub hears of them.

    ``published``: the task was published (or a finished one replaced). ``started``: an
    attempt claimed it (``worker_id``, ``run_id``). ``progress``: a running attempt reported
    ``progress``. ``failed``: an attempt failed or its lease expired (``error``);
    ``will_retry`` says whether the task runs again. A task that fails for good tells one
    ``failed`` with ``will_retry=False``: by the attempt whose failure ended it, or, when its
    tries ran out on an attempt that did not fail, with the task's own error.
    ``succeeded``: the task succeeded (``result``, and the attempt that completed it).
    ``cancelled``: the task was cancelled or expired (``error`` says why)."""

    model_config = ConfigDict(frozen=True)

    kind: TaskEventKind
    key: str
    name: str
    at: UtcDatetime
    version: int  # the task's version the event was derived from
    worker_id: str | None = None
    run_id: str | None = None
    will_retry: bool | None = None  # ``failed`` only
    result: Any = None  # ``succeeded`` only
    error: ErrorInfo | None = None  # ``failed`` and ``cancelled``
    progress: Progress | None = None  # ``progress`` only


class FoundDead(BaseModel):
    """When a worker was first found dead, and why, as the reader that found it recorded
    it (`store.workers`)."""

    since: UtcDatetime
    because: str


class WorkerInfo(BaseModel):
    """One consumer as it last described itself, with what it holds now read from the tasks
    (``running``, ``running_keys``) and ``alive`` and ``dead_since`` judged against a clock
    when read (`liveness.judged`): a worker that stopped gracefully has no document at all."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    worker_id: str = Field(alias="_id")
    host: str
    pid: int
    names: list[str]
    max_running: int
    running: int = 0  # its live leases, from the tasks when read through `Workers`
    running_keys: list[str] = Field(default_factory=list)  # `store.workers.MAX_LISTED_KEYS` of them
    started_at: UtcDatetime
    last_seen_at: UtcDatetime
    heartbeat_ms: int
    # Drawn afresh each time a consumer starts: tells a restarted worker from the one that had
    # its id before (a remote stop is for one instance: `store.stops`). Empty in entries
    # written by a version that did not draw one.
    instance: str = ""
    alive: bool = True  # set by the reader (`liveness.judged`)
    dead_since: UtcDatetime | None = None  # set by the reader (`liveness.judged`): when found dead
    # The latest expiry of its leases that are live, and of those that expired (set by the
    # reader, from the tasks): why it was found dead, or that it still pings.
    lease_until: UtcDatetime | None = None
    lease_lost_at: UtcDatetime | None = None
    lease_lost_claimed_at: UtcDatetime | None = None  # the latest claim of the leases lost
    # Its death as first found, written once into its entry and void at its next heartbeat:
    # later reads say the same time and reason, whatever ended since (the leases whose
    # expiry showed it may belong to tasks that ended, which are not read).
    found_dead: FoundDead | None = None

    @property
    def dead_because(self) -> str:
        """Why it was found dead (empty while alive), in an operator's words."""
        if self.alive or self.dead_since is None:
            return ""
        if self.found_dead is not None:
            return self.found_dead.because
        if self.lease_lost_at is not None and self.dead_since == self.lease_lost_at:
            return "its leases expired"
        return "it missed its heartbeats"


class _Entry(BaseModel):
    id: str
    until: UtcDatetime | None = None
    partition: str | None = None  # a slot's: the partition of its run's task, if it counts one


class Limit(BaseModel):
    """The limits of one name, and what counts against them now."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(alias="_id")
    rate: int | None = None
    per_ms: int | None = None
    max_running: int | None = None
    partition_max_running: int | None = None  # running at once in each partition of the name
    starts: list[_Entry] = Field(default_factory=list)
    slots: list[_Entry] = Field(default_factory=list)

    def usage(self, now: dt.datetime) -> dict[str, Any]:
        """The limits, and what counts against them at ``now``: the starts within the window,
        the running slots, and the most running in one partition (what ``limit ls --json``
        and the HTTP API show)."""
        return {
            "name": self.name,
            "rate": self.rate,
            "per_ms": self.per_ms,
            "max_running": self.max_running,
            "partition_max_running": self.partition_max_running,
            "starts_in_window": sum(1 for e in self.starts if e.until and e.until > now),
            "running": sum(1 for e in self.slots if e.until and e.until > now),
            "busiest_partition_running": max(
                Counter(
                    e.partition for e in self.slots if e.partition and e.until and e.until > now
                ).values(),
                default=0,
            ),
        }


def check_params(params: Mapping[str, object], declared: type, method: str) -> None:
    """Refuse a keyword a declared parameter list (one of the ``*Params`` below) does not
    name, as a signature that lists them would (the type checker refuses it too)."""
    fields = declared.__annotations__.keys()
    if params.keys() <= fields:  # the common case: one comparison of key views, no set built
        return
    unknown = sorted(params.keys() - fields)
    raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r}")


class TaskParams(TypedDict, total=False):
    """What a task is published with besides its key, name and payload: the keyword options
    of `Scheduler.replace` (and `SyncScheduler.replace`), read by `specs.PublishSpec.of`,
    which holds their defaults, and the first of `PublishParams`.

    ``options``: the task's `TaskOptions`. ``depends_on``: keys this task waits for;
    ``allow_missing``: a missing one counts as met."""

    options: TaskOptions | None
    depends_on: Sequence[str] | None
    allow_missing: bool


class PublishParams(TaskParams, total=False):
    """The keyword options of `Scheduler.publish` (and of `SyncScheduler.publish`, its
    blocking twin), declared once: each method takes them as ``**params``, so the type
    checker checks every call against these fields, and `specs.publish_spec` reads them
    (with their defaults) into the one `PublishSpec` that travels down.

    `TaskParams` (``options``, ``depends_on``, ``allow_missing``), and:
    ``update_payload``: an existing task not running gets the new payload.
    ``replace_finished``: a finished task is published anew (``True``), or only one in the
    finished states named (``("fail", "cancelled")``). ``delay`` (a timedelta or seconds):
    start that long from now. ``debounce`` (the same): start that long from now, and a
    publish of the key again before it started gives it the new payload and pushes its
    start back."""

    update_payload: bool
    replace_finished: ReplaceFinished
    delay: dt.timedelta | float | None
    debounce: dt.timedelta | float | None


class ConnectParams(TypedDict, total=False):
    """The keyword options of `Scheduler.connect` and `SyncScheduler.connect`, declared once
    (`backends.uri.open_options` reads them, with their defaults).

    ``database``: the database (by default the URI's, else ``mscheduler``). ``collection``:
    the tasks' collection (``tasks`` by default; the documents beside the tasks are in
    collections named after it). ``clock``: the scheduler's clock (`testing.ManualClock` in
    tests). ``server_selection_timeout_ms``: how long connecting waits for a server."""

    database: str | None
    collection: str
    clock: Clock | None
    server_selection_timeout_ms: int


class OwnParams(TypedDict, total=False):
    """The keyword options of `Scheduler.own` (and `SyncScheduler.own`), declared once and
    read by the pull API's owner, which holds their defaults.

    ``worker_id`` (required): who holds the leases. ``max_tasks``: the most one call claims
    (1 by default). ``lease``: each lease's length (a timedelta or seconds; the task's
    ``worker_timeout_ms`` by default). ``wait``: when none is claimable, how long to wait
    for one (a timedelta or seconds; not at all by default)."""

    worker_id: Required[str]
    max_tasks: int
    lease: dt.timedelta | float | None
    wait: dt.timedelta | float | None


CatchUp = Literal["latest", "all", "none"]


class ScheduleParams(TypedDict, total=False):
    """The keyword options of `Scheduler.schedule` (and `SyncScheduler.schedule`), declared
    once and read by `specs.new_schedule`, which holds their defaults.

    Either ``cron`` (an expression, in ``timezone``, an IANA name, ``UTC`` by default) or
    ``every`` (a timedelta). ``payload`` and ``options``: each occurrence's.
    ``skip_if_running``: no occurrence while the previous one has not ended. ``catch_up``
    after downtime: ``latest`` (the default) runs the last missed occurrence, ``all`` each
    one, ``none`` none. ``jitter``: each start is delayed by up to that much."""

    cron: str | None
    every: dt.timedelta | None
    timezone: str
    payload: Any
    options: TaskOptions | None
    skip_if_running: bool
    catch_up: CatchUp
    jitter: dt.timedelta | None


# Public: what the API takes and returns. The validators and check_* helpers stay inside.
__all__ = [
    "ConnectParams",
    "EarlierAttempt",
    "ErrorInfo",
    "FinishedCount",
    "FoundDead",
    "Lease",
    "Limit",
    "OwnParams",
    "PausedName",
    "Progress",
    "PublishParams",
    "PublishResult",
    "ScheduleParams",
    "StatsRow",
    "Task",
    "TaskEvent",
    "TaskOptions",
    "TaskPage",
    "TaskParams",
    "TaskState",
    "WorkerInfo",
    "WorkerState",
    "WorkerStateKind",
]
