"""The bodies the HTTP API reads and writes: pydantic models, so FastAPI validates them (a
bad body is refused before anything is written) and writes the OpenAPI document from them.

A task is JSON with the task's field names (`encoding.task_json`: times as ISO 8601 strings;
a payload or result holding other BSON values as relaxed extended JSON); a payload or result
sent in extended JSON, canonical or relaxed (``{"$date": ...}``), is stored as the BSON value it
names (`encoding.from_extended`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..consumer.owner import MAX_TASKS
from ..models import StatsRow, TaskOptions, TaskState, finished_states_to_replace

Task = dict[str, Any]  # `encoding.task_json`: the document's fields, as JSON
_LONGEST_MS = 7 * 24 * 3600 * 1000
_LONGEST_WAIT_MS = 5 * 60 * 1000  # one request holds a connection at most this long


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishBody(_Body):
    key: str = Field(min_length=1)
    name: str = Field(min_length=1)
    payload: Any = None
    options: TaskOptions | None = None
    depends_on: list[str] = Field(default_factory=list)
    delay_ms: int | None = Field(default=None, ge=0, le=_LONGEST_MS)
    replace_finished: bool | list[TaskState] = False
    """`ReplaceFinished`: true, or the finished states whose task is published anew."""

    @field_validator("replace_finished")
    @classmethod
    def _replace_finished(cls, value: bool | list[TaskState]) -> bool | list[TaskState]:
        finished_states_to_replace(value)  # refuses a state that is not a finished one
        return value


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


class LeaseOut(BaseModel):
    key: str
    worker_id: str
    run_id: str
    expires_at: str | None  # ISO 8601: extend before it
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
