"""The input specs: the API's arguments checked once where they enter (a bad one raises a
`ConfigurationError` naming its field) and handed down whole. What to publish
(`publish_spec` into `PublishSpec`; `TaskSpec` and the structures built from it: `chain`,
`group`, `chord`), the limits of a name (`limit_spec` into `LimitSpec`) and a schedule
(`new_schedule` into a `periodic.Schedule`, which computes its occurrences).

A structure is only specs with their ``depends_on`` filled in; `Scheduler.publish_many`
writes it in one all-or-nothing call. Keys stay the caller's: re-publishing a structure is
idempotent like any publish.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from typing_extensions import Unpack

from .encoding import check_document_size, to_storable
from .errors import ConfigurationError, DependencyError, field_errors
from .models import (
    PublishParams,
    ReplaceFinished,
    ScheduleParams,
    TaskOptions,
    TaskParams,
    TaskState,
    check_key,
    check_name,
    check_params,
    checked,
    finished_states_to_replace,
)
from .periodic import Schedule, check_schedule_id
from .start_delay import with_start_delay


class TaskSpec(BaseModel):
    """One task to publish: the arguments of `Scheduler.publish`, as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    name: str
    payload: Any = None
    options: TaskOptions = Field(default_factory=TaskOptions)
    depends_on: tuple[str, ...] = ()
    replace_finished: frozenset[TaskState] = frozenset()
    """The finished states in which the task of this key is published anew (`ReplaceFinished`:
    ``True`` is every one)."""

    @field_validator("replace_finished", mode="before")
    @classmethod
    def _replace_finished(cls, value: object) -> frozenset[TaskState]:
        return finished_states_to_replace(value)


class Flow(BaseModel):
    """Specs with their edges; ``heads`` start the flow, ``tails`` end it."""

    model_config = ConfigDict(frozen=True)

    specs: tuple[TaskSpec, ...]
    heads: tuple[str, ...]
    tails: tuple[str, ...]


Step = TaskSpec | Flow


def check_dependencies(key: str, depends_on: Iterable[str]) -> list[str]:
    """``depends_on`` without repeats, each a valid key other than ``key``."""
    keys: list[str] = []
    for dependency in depends_on:
        try:
            check_key(dependency)
        except ValueError as exc:
            raise DependencyError(f"depends_on: {exc}") from None
        if dependency == key:
            raise DependencyError(f"depends_on: task {key!r} cannot depend on itself")
        if dependency not in keys:
            keys.append(dependency)
    return keys


@dataclasses.dataclass(frozen=True)
class PublishSpec:
    """One publish, checked: built once where it enters (`PublishSpec.of`, `publish_spec`)
    and handed down whole, so the store's publisher, a batch and a schedule's occurrences
    take it as it is and nothing about its fields can fail once writing starts (only the
    size of the whole document, which the store checks before its first write)."""

    key: str
    name: str
    payload: Any  # as stored (`encoding.to_storable`)
    options: TaskOptions
    depends_on: tuple[str, ...] = ()
    allow_missing: bool = False  # a missing dependency is left out (counted as met)
    update_payload: bool = False  # an existing task not running gets this payload
    # A finished task in one of these states is published anew.
    replace_finished: frozenset[TaskState] = frozenset()
    debounce: bool = False  # a task not started yet gets this payload and start instead

    @classmethod
    def of(
        cls,
        key: str,
        payload: Any = None,
        *,
        name: str,
        update_payload: bool = False,
        replace_finished: ReplaceFinished = False,
        debounce: bool = False,
        **params: Unpack[TaskParams],
    ) -> PublishSpec:
        """The spec of these arguments; a bad one raises a `ConfigurationError` (or
        `DependencyError`, `PayloadError`) naming its field. The task's own options are
        `TaskParams` (as `Scheduler.replace` takes them), read here with their defaults."""
        check_params(params, TaskParams, "replace")
        options = params.get("options")
        depends_on = params.get("depends_on")
        allow_missing = params.get("allow_missing", False)
        key = checked(check_key, key)
        dependencies = check_dependencies(key, depends_on or [])
        name = checked(check_name, name)
        if options is not None and not isinstance(options, TaskOptions):
            raise ConfigurationError(f"options: expected TaskOptions, got {type(options).__name__}")
        return cls(
            key=key,
            name=name,
            payload=to_storable(payload, "payload"),
            options=options or TaskOptions(),
            depends_on=tuple(dependencies),
            allow_missing=allow_missing,
            update_payload=update_payload,
            replace_finished=_replacing(replace_finished),
            debounce=debounce,
        )

    @classmethod
    def of_task(cls, spec: TaskSpec, *, allow_missing: bool = False) -> PublishSpec:
        """A `TaskSpec` of a batch (`Scheduler.publish_many`, `Scheduler.commit`), checked."""
        return cls.of(
            spec.key,
            spec.payload,
            name=spec.name,
            options=spec.options,
            depends_on=spec.depends_on,
            allow_missing=allow_missing,
            replace_finished=spec.replace_finished,
        )


def _replacing(value: object) -> frozenset[TaskState]:
    try:
        return finished_states_to_replace(value)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def publish_spec(
    key: str, payload: Any, *, name: str, now: dt.datetime, **params: Unpack[PublishParams]
) -> PublishSpec:
    """The spec of `Scheduler.publish`'s (and `SyncScheduler.publish`'s) arguments, with the
    defaults of the options a call leaves out: a ``delay`` or a ``debounce`` window becomes
    ``options.not_before``, from ``now``."""
    check_params(params, PublishParams, "publish")
    options = params.get("options")
    depends_on = params.get("depends_on")
    allow_missing = params.get("allow_missing", False)
    debounce = params.get("debounce")
    delay = params.get("delay")
    if debounce is not None:
        if delay is not None:
            raise ConfigurationError("debounce: give either debounce or delay, not both")
        window = with_start_delay(options, debounce, now, field="debounce")
        return PublishSpec.of(
            key,
            payload,
            name=name,
            options=window,
            depends_on=depends_on,
            allow_missing=allow_missing,
            debounce=True,
        )
    return PublishSpec.of(
        key,
        payload,
        name=name,
        options=with_start_delay(options, delay, now),
        update_payload=params.get("update_payload", False),
        replace_finished=params.get("replace_finished", False),
        depends_on=depends_on,
        allow_missing=allow_missing,
    )


def _flow(step: Step) -> Flow:
    if isinstance(step, Flow):
        return step
    if isinstance(step, TaskSpec):
        return Flow(specs=(step,), heads=(step.key,), tails=(step.key,))
    raise TypeError(f"expected a TaskSpec or a flow, got {type(step).__name__}")


def _after(flow: Flow, dependencies: Sequence[str]) -> Flow:
    """``flow`` with each of its heads also waiting for ``dependencies``."""
    heads = set(flow.heads)
    specs = tuple(
        spec.model_copy(update={"depends_on": (*spec.depends_on, *dependencies)})
        if spec.key in heads
        else spec
        for spec in flow.specs
    )
    return flow.model_copy(update={"specs": specs})


def chain(*steps: Step) -> Flow:
    """Each step starts once the previous one has succeeded."""
    if not steps:
        raise ValueError("chain: give at least one step")
    flows = [_flow(step) for step in steps]
    result = flows[0]
    for following in flows[1:]:
        following = _after(following, result.tails)
        result = Flow(
            specs=result.specs + following.specs, heads=result.heads, tails=following.tails
        )
    return result


def group(*steps: Step) -> Flow:
    """Steps that run independently (in parallel, with enough workers)."""
    if not steps:
        raise ValueError("group: give at least one step")
    flows = [_flow(step) for step in steps]
    return Flow(
        specs=tuple(spec for flow in flows for spec in flow.specs),
        heads=tuple(key for flow in flows for key in flow.heads),
        tails=tuple(key for flow in flows for key in flow.tails),
    )


def chord(header: Step | Iterable[Step], body: Step) -> Flow:
    """``body`` runs once every step of ``header`` has succeeded (a fan-in). With no step in
    ``header`` there is nothing to wait for: ``body`` runs at once, as Celery runs an empty
    chord's body (a fan-out over a list that turned out empty still reaches its join)."""
    if isinstance(header, (TaskSpec, Flow)):
        return chain(header, body)
    steps = list(header)
    if not steps:
        return _flow(body)
    return chain(group(*steps), body)


def flatten(specs: Step | Iterable[Step]) -> list[TaskSpec]:
    if isinstance(specs, (TaskSpec, Flow)):
        return list(_flow(specs).specs)
    return [spec for step in specs for spec in _flow(step).specs]


def dependency_order(specs: Sequence[TaskSpec]) -> list[TaskSpec]:
    """The specs with every in-batch dependency before its dependent; a duplicate key or a
    cycle is a `DependencyError`."""
    by_key: dict[str, TaskSpec] = {}
    for spec in specs:
        if spec.key in by_key and by_key[spec.key] != spec:
            raise DependencyError(f"publish_many: key {spec.key!r} is given twice")
        by_key[spec.key] = spec
    ordered: list[TaskSpec] = []
    state: dict[str, str] = {}

    def visit(key: str, path: tuple[str, ...]) -> None:
        if state.get(key) == "done":
            return
        if state.get(key) == "visiting":
            cycle = " → ".join((*path[path.index(key) :], key))
            raise DependencyError(f"publish_many: the dependencies form a cycle: {cycle}")
        state[key] = "visiting"
        for dependency in by_key[key].depends_on:
            if dependency in by_key:
                visit(dependency, (*path, key))
        state[key] = "done"
        ordered.append(by_key[key])

    for key in by_key:
        visit(key, ())
    return ordered


def _checked_limits(
    rate: Any, per: Any, max_running: Any, partition_max_running: Any = None
) -> int | None:
    """``per`` in milliseconds, once every value is one a limit can have."""
    counts = (
        ("rate", rate),
        ("max_running", max_running),
        ("partition_max_running", partition_max_running),
    )
    for field, value in counts:
        number = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and not (number and 1 <= value <= 1_000_000):
            raise ConfigurationError(
                f"{field}: expected an integer from 1 to 1000000, got {value!r}"
            )
    if (rate is None) != (per is None):
        raise ConfigurationError("per: give rate and per together (rate=100, per=1 minute)")
    if rate is None and max_running is None and partition_max_running is None:
        raise ConfigurationError(
            "set_limit: give rate and per, max_running, partition_max_running, or several"
        )
    if per is None:
        return None
    longest = dt.timedelta(days=366)
    if not isinstance(per, dt.timedelta) or not dt.timedelta(milliseconds=1) <= per <= longest:
        raise ConfigurationError(f"per: expected a timedelta from 1 ms to a year, got {per!r}")
    return round(per.total_seconds() * 1000)


@dataclasses.dataclass(frozen=True)
class LimitSpec:
    """The limits of one name, checked (`limit_spec`): what `Limits.set` writes."""

    name: str
    rate: int | None
    per_ms: int | None
    max_running: int | None
    partition_max_running: int | None = None


def limit_spec(
    name: str,
    *,
    rate: int | None = None,
    per: dt.timedelta | None = None,
    max_running: int | None = None,
    partition_max_running: int | None = None,
) -> LimitSpec:
    """The spec of `Scheduler.set_limit`'s arguments; a bad one raises a `ConfigurationError`
    naming its field."""
    name = checked(check_name, name)
    per_ms = _checked_limits(rate, per, max_running, partition_max_running)
    return LimitSpec(
        name=name,
        rate=rate,
        per_ms=per_ms,
        max_running=max_running,
        partition_max_running=partition_max_running,
    )


def new_schedule(
    schedule_id: str, *, name: str, now: dt.datetime, **params: Unpack[ScheduleParams]
) -> Schedule:
    """A validated schedule whose first occurrence is the first one after ``now``; the
    options a call leaves out take their defaults here."""
    unknown = sorted(set(params) - set(ScheduleParams.__annotations__))
    if unknown:  # as a signature that lists them would (the type checker refuses them too)
        raise TypeError(f"schedule() got an unexpected keyword argument {unknown[0]!r}")
    checked(check_schedule_id, schedule_id)
    every = params.get("every")
    jitter = params.get("jitter")
    for field, span in (("every", every), ("jitter", jitter)):
        if span is not None and not isinstance(span, dt.timedelta):
            raise ConfigurationError(f"{field}: expected a timedelta, got {type(span).__name__}")
    options = params.get("options")
    payload = params.get("payload")
    fields: dict[str, Any] = {
        "_id": schedule_id,
        "name": name,
        "cron": params.get("cron"),
        "every_ms": None if every is None else round(every.total_seconds() * 1000),
        "timezone": params.get("timezone", "UTC"),
        "payload": to_storable(payload, "payload"),  # as each occurrence's is
        "options": options or TaskOptions(),
        "skip_if_running": params.get("skip_if_running", False),
        "catch_up": params.get("catch_up", "latest"),
        "jitter_ms": 0 if jitter is None else round(jitter.total_seconds() * 1000),
        "anchor": now,
        "next_at": now,  # replaced below, once the schedule can compute it
        "created_at": now,
        "updated_at": now,
    }
    if not isinstance(fields["options"], TaskOptions):
        raise ConfigurationError(f"options: expected TaskOptions, got {type(options).__name__}")
    if fields["options"].not_before is not None:
        raise ConfigurationError(
            "options.not_before: a schedule sets each occurrence's start itself"
        )
    try:
        draft = Schedule.model_validate(fields)
    except ValidationError as exc:
        raise ConfigurationError(field_errors(exc, "schedule")) from None
    check_document_size({"payload": payload}, draft.options)  # each occurrence's payload
    return draft.model_copy(update={"next_at": draft.after(now)})
