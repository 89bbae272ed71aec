"""Task specs and the structures built from them: `chain`, `group`, `chord`.

A structure is only specs with their ``depends_on`` filled in; `Scheduler.publish_many`
writes it in one all-or-nothing call. Keys stay the caller's: re-publishing a structure is
idempotent like any publish.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import DependencyError
from .models import TaskOptions


class TaskSpec(BaseModel):
    """One task to publish: the arguments of `Scheduler.publish`, as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    name: str
    payload: Any = None
    options: TaskOptions = Field(default_factory=TaskOptions)
    depends_on: tuple[str, ...] = ()


class Flow(BaseModel):
    """Specs with their edges; ``heads`` start the flow, ``tails`` end it."""

    model_config = ConfigDict(frozen=True)

    specs: tuple[TaskSpec, ...]
    heads: tuple[str, ...]
    tails: tuple[str, ...]


Step = TaskSpec | Flow


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
    """``body`` runs once every step of ``header`` has succeeded (a fan-in)."""
    if isinstance(header, (TaskSpec, Flow)):
        return chain(header, body)
    return chain(group(*header), body)


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
