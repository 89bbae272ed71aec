"""The bodies the HTTP API reads and writes: pydantic models, so FastAPI validates them (a
bad body is refused before anything is written) and writes the OpenAPI document from them.

A task is JSON with the task's field names (`encoding.task_json`: times as ISO 8601 strings;
a payload or result holding other BSON values as relaxed extended JSON); a payload or result
sent in extended JSON, canonical or relaxed (``{"$date": ...}``), is stored as the BSON value it
names (`encoding.from_extended`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, cast, get_type_hints

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
)

from ..constants import MAX_TASKS
from ..models import (
    PublishParams,
    ReplaceFinished,
    StatsRow,
    TaskOptions,
    TaskState,
    UtcDatetime,
    finished_states_to_replace,
)

Task = dict[str, Any]  # `encoding.task_json`: the document's fields, as JSON
_LONGEST_MS = 7 * 24 * 3600 * 1000
_LONGEST_WAIT_MS = 5 * 60 * 1000  # one request holds a connection at most this long


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishHead(_Body):
    """What every publish names: the task's key, name and payload. The rest of the body is
    `PublishParams`, one field each (`_publish_fields`)."""

    key: str = Field(min_length=1)
    name: str = Field(min_length=1)
    payload: Any = None

    def params(self) -> PublishParams:
        """The parameters the body set, as `Scheduler.publish` takes them; one left out keeps
        publish's own default (`specs.publish_spec` holds them)."""
        given = {
            param: to_param(getattr(self, field))
            for field, (param, to_param) in _FROM_BODY.items()
            if field in self.model_fields_set
        }
        return cast(PublishParams, given)


def milliseconds(value: int | None) -> dt.timedelta | None:
    """A duration of the API (``*_ms``) as `Scheduler`'s methods take it."""
    return None if value is None else dt.timedelta(milliseconds=value)


def _same(value: Any) -> Any:
    return value


def _replace_finished(value: Any, handler: ValidatorFunctionWrapHandler) -> bool | list[TaskState]:
    """JSON true or false, or a list of finished states: one refusal naming the field, not one
    per form it could have taken."""
    try:
        chosen: bool | list[TaskState] = handler(value)
    except ValidationError:
        raise ValueError("must be true, false or a list of finished states") from None
    finished_states_to_replace(chosen)  # refuses a state that is not a finished one
    return chosen


# How each type of publish parameter travels as JSON: its body field's suffix, type and
# bounds, and how the field's value becomes the parameter. A duration is whole milliseconds
# (``delay`` is ``delay_ms``), as every duration of the API is.
_JSON_FORMS: list[tuple[Any, str, Any, Callable[[], Any], Callable[[Any], Any]]] = [
    (
        dt.timedelta | float | None,
        "_ms",
        int | None,
        lambda: Field(default=None, ge=0, le=_LONGEST_MS),
        milliseconds,
    ),
    (TaskOptions | None, "", TaskOptions | None, lambda: Field(default=None), _same),
    (Sequence[str] | None, "", list[str] | None, lambda: Field(default=None), _same),
    # A flag is JSON true or false, nothing read as one ("false", 1): strict.
    (bool, "", bool, lambda: Field(default=False, strict=True), _same),
    (
        ReplaceFinished,
        "",
        Annotated[StrictBool | list[TaskState], WrapValidator(_replace_finished)],
        lambda: Field(default=False),
        _same,
    ),
]
_FROM_BODY: dict[str, tuple[str, Callable[[Any], Any]]] = {}


def _publish_fields() -> dict[str, Any]:
    """The body's fields, one per `PublishParams` field: a parameter added there is in the body
    too, and one of a type with no JSON form here stops the import, naming it."""
    fields: dict[str, Any] = {}
    for param, annotation in get_type_hints(PublishParams).items():
        form = next((f for f in _JSON_FORMS if f[0] == annotation), None)
        if form is None:
            raise TypeError(
                f"PublishParams.{param}: no JSON form for {annotation}; add one to "
                "mscheduler.http.bodies._JSON_FORMS"
            )
        _, suffix, kind, field, to_param = form
        fields[param + suffix] = (kind, field())
        _FROM_BODY[param + suffix] = (param, to_param)
    return fields


if TYPE_CHECKING:
    PublishBody = PublishHead
else:
    PublishBody = create_model(
        "PublishBody",
        __base__=PublishHead,
        __doc__="A publish: the key, name and payload, and `Scheduler.publish`'s parameters.",
        **_publish_fields(),
    )


class OwnBody(_Body):
    names: list[str] = Field(min_length=1)
    worker_id: str = Field(min_length=1)
    max_tasks: int = Field(default=1, ge=1, le=MAX_TASKS)
    lease_ms: int | None = Field(default=None, ge=1, le=_LONGEST_MS)
    wait_ms: int | None = Field(default=None, ge=0, le=_LONGEST_WAIT_MS)


class LeaseRef(_Body):
    """A lease, by the three fields that fence its writes."""

    key: str = Field(min_length=1)
    worker_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)


class ExtendBody(LeaseRef):
    lease_ms: int | None = Field(default=None, ge=1, le=_LONGEST_MS)


class SucceedBody(LeaseRef):
    result: Any = None


class FailBody(LeaseRef):
    error: str = Field(min_length=1)


class PauseBody(_Body):
    reason: str = ""


class RetryBody(_Body):
    """``with_dependents``: run again too the dependents its end cancelled (and theirs)."""

    with_dependents: bool = Field(default=False, strict=True)


class LimitBody(_Body):
    """The limits of one name (`Scheduler.set_limit`): at most ``rate`` starts in any window
    of ``per_ms``, at most ``max_running`` running at once, and at most
    ``partition_max_running`` running at once in each partition of the name. Set anew: one
    left out is removed."""

    rate: int | None = None
    per_ms: int | None = Field(default=None, ge=1)
    max_running: int | None = None
    partition_max_running: int | None = None


class LimitOut(BaseModel):
    """A name's limits, and what counts against them now (`Limit.usage`)."""

    name: str
    rate: int | None
    per_ms: int | None
    max_running: int | None
    partition_max_running: int | None = None
    starts_in_window: int
    running: int
    busiest_partition_running: int = 0  # the most running at once in one partition now


class Limits(BaseModel):
    limits: list[LimitOut]


class LeaseOut(BaseModel):
    key: str
    worker_id: str
    run_id: str
    expires_at: UtcDatetime | None  # extend before it
    task: Task


class Leases(BaseModel):
    leases: list[LeaseOut]


class Tasks(BaseModel):
    tasks: list[Task]


class Stats(BaseModel):
    stats: list[StatsRow]


class Done(BaseModel):
    """Whether the call changed anything (``false``: it was so already)."""

    changed: bool


class Error(BaseModel):
    error: str
    message: str
