"""Every exception mscheduler defines, in two families that never mix:

- `MSchedulerError`: an operation of the library failed (a driver error that caused one is
  its ``__cause__``); catch it around calls to the library.
- `HandlerSignal`: raised by a handler to tell its consumer what to do with the task
  (`Abort`, `RetryLater`). Not an `MSchedulerError`, so a handler's own
  ``except MSchedulerError`` around its calls to the library never swallows one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError


class MSchedulerError(Exception):
    """An mscheduler operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(MSchedulerError, ValueError):
    """An option, URI or argument is invalid; nothing was written."""


class DependencyError(ConfigurationError):
    """A dependency is missing, would close a cycle, or comes too late; nothing was written."""


class PayloadError(MSchedulerError, ValueError):
    """A payload or result cannot be stored as a BSON document; nothing was written."""


class BackendUnavailable(MSchedulerError):
    """The MongoDB server could not be reached within the server-selection timeout.

    Transient: the consumer retries with backoff; other callers may retry too."""


class ClaimUncertain(BackendUnavailable):
    """A claim was sent and may have been applied (its reply lost, or a batch's reply said so),
    and the read that would return its leases failed. The worker may hold a lease under each
    of ``run_ids`` (one per task a batched claim tried): it looks them up again with
    `TaskStore.find_claims` before claiming anything else."""

    def __init__(self, message: str, *, worker_id: str, run_ids: Sequence[str]) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.run_ids = list(run_ids)

    @property
    def run_id(self) -> str:
        return self.run_ids[0]


class TaskNotFound(MSchedulerError, KeyError):
    """No task has this key."""

    def __str__(self) -> str:
        # KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class WorkerNotLive(MSchedulerError):
    """No live worker has this id (none registered, or it was found dead: it missed its
    heartbeats, or its leases expired unpinged)."""


class TaskRunning(MSchedulerError):
    """The task is running, so it cannot be replaced or have its payload changed."""


class LeaseLost(MSchedulerError):
    """This worker no longer holds the task: its lease expired, was taken over, or the task ended.

    Raised by ping, success, fail and release when the fenced write matches nothing; the
    worker must stop working on the task, because another worker may already be running it.
    ``state`` is what the task now records for this run (None: nothing, or not read): a
    finish retried after a lost reply finds there the outcome its first attempt wrote.
    """

    def __init__(self, message: str, *, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state


class PreconditionFailed(MSchedulerError):
    """A task a commit required to be unchanged has changed (or is gone); nothing was written."""

    def __init__(self, message: str | None = None, *, keys: list[str] | None = None) -> None:
        super().__init__(message)
        self.keys = keys or []


class StoreError(MSchedulerError):
    """MongoDB refused or failed an operation; the driver's error is in ``__cause__``."""


class TaskTimeout(MSchedulerError):
    """Recorded as the error of an attempt that outlived ``TaskOptions.timeout_ms``: its
    handler was cancelled, and the attempt counts as an unexpected failure. The consumer
    raises it, not the handler (which was cancelled), so it is an `MSchedulerError`, not a
    `HandlerSignal`; list it in ``retry_on`` for timed-out attempts to be retried."""


class HandlerProcessDied(MSchedulerError):
    """Recorded as the error of an attempt whose isolated handler's process (`isolated`) died
    before it answered: it exited (``os._exit``, a crash of the interpreter) or was killed by
    a signal (a segfault, the out-of-memory killer). The message names the exit code or the
    signal. The attempt counts as an unexpected failure, retried by the task's rules; the
    worker and its other tasks go on."""


class HandlerSignal(Exception):
    """Raised by a handler to decide its task's outcome, caught by the consumer running it.

    A signal, not an error of the library: it is not an `MSchedulerError`. A handler that
    catches ``Exception`` around code that raises one must re-raise it."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class Abort(HandlerSignal):
    """Raised by a handler to end its task as failed at once: no retries, dependents cancelled."""

    def __init__(self, reason: str = "aborted by the handler") -> None:
        super().__init__(reason)
        self.reason = reason


class RetryLater(HandlerSignal):
    """Raised by a handler to put its task back, claimable again after ``delay`` seconds.

    Not a failure: it does not count against ``max_unexpected_retries``, only against
    ``max_tries`` when that is set."""

    MAX_DELAY = 366 * 86_400.0  # a year: any later is a date no clock arithmetic survives

    def __init__(self, delay: float = 0.0, reason: str = "retry later") -> None:
        if not 0 <= delay <= self.MAX_DELAY:  # also refuses NaN
            raise ValueError(
                f"RetryLater: delay must be between 0 and {self.MAX_DELAY:.0f} seconds, got {delay}"
            )
        super().__init__(reason)
        self.delay = delay
        self.reason = reason

    def __reduce__(self) -> tuple[type[RetryLater], tuple[float, str]]:
        """Pickled with its own arguments: an isolated handler's signal crosses from its
        process by pickling, and ``args`` holds the reason alone."""
        return (type(self), (self.delay, self.reason))


def field_errors(exc: ValidationError, whole: str = "value") -> str:
    """Pydantic's errors on one line, each naming its field (``whole`` when it is about the
    model itself) and phrased in our words: ``priority: must be an integer; ...``. The
    wording is ours so that it stays the same whichever pydantic is installed; a kind of error
    we have no words for keeps pydantic's."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or whole}: {phrase(error)}"
        for error in exc.errors()
    )


# What each kind of pydantic error means, in our words (``{name}`` from the error's context).
_PHRASES = {
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "finite_number": "must be a finite number",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "string_type": "must be a string",
    "string_pattern_mismatch": "must match {pattern}",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "missing": "is required",
    "extra_forbidden": "is not an option here",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "datetime_type": "must be a date and time",
    "datetime_parsing": "must be a date and time (ISO 8601)",
    "datetime_from_date_parsing": "must be a date and time (ISO 8601)",
    "timezone_aware": "must have a timezone",
    "timedelta_type": "must be a duration",
    "timedelta_parsing": "must be a duration",
}


def phrase(error: Any) -> str:
    """One of pydantic's ``errors()``, without its field: a validator's own message as it
    raised it, a built-in check's in our words."""
    context = error.get("ctx") or {}
    if error["type"] in ("value_error", "assertion_error") and "error" in context:
        # A validator's message may start with the field it is about, which the caller
        # names already: said once.
        said = str(context["error"])
        field = f"{error['loc'][-1]}: " if error.get("loc") else ""
        return said[len(field) :] if field and said.startswith(field) else said
    phrase = _PHRASES.get(error["type"])
    if phrase is not None:
        try:
            return phrase.format(**context)
        except (KeyError, IndexError):  # a context without the value we name: say less
            return phrase.split(" {", 1)[0]
    return str(error["msg"])


# Public: what a caller catches, and what a handler raises. `ClaimUncertain` stays inside.
__all__ = [
    "Abort",
    "BackendUnavailable",
    "ConfigurationError",
    "DependencyError",
    "HandlerProcessDied",
    "HandlerSignal",
    "LeaseLost",
    "MSchedulerError",
    "PayloadError",
    "PreconditionFailed",
    "RetryLater",
    "StoreError",
    "TaskNotFound",
    "TaskRunning",
    "TaskTimeout",
    "WorkerNotLive",
]
