"""Update pipelines built once per shape, their arguments filled in per call.

A claim or a finish pipeline is a few hundred nested dicts and lists, of which only a handful
of leaves depend on the call (the worker, the run, the time, the result). Building them anew
for every task was a large part of a consumer's own CPU per task. `templated` builds a
builder's pipeline once, with a `Param` where each argument goes, and then copies per call
only the containers on the way to an argument: everything else is shared between the
pipelines it returns.

Shared parts are never mutated: the store only sends a pipeline (the driver encodes it; the
memory backend reads it), and no builder writes into a pipeline it did not make.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Fill = Callable[[tuple[Any, ...]], Any]


class Param:
    """Where argument ``index`` goes in a pipeline being built once."""

    __slots__ = ("index", "name")

    def __init__(self, index: int, name: str) -> None:
        self.index = index
        self.name = name

    def __repr__(self) -> str:
        return f"Param({self.name!r})"


def _compile(node: Any) -> _Fill | None:
    """A function of the arguments that rebuilds ``node`` with them; None when ``node``
    holds no `Param` (it is then shared as it is).

    Generated as one expression (dict and list displays, the shared parts as constants): a
    function per container cost as much as building the pipeline anew."""
    shared: list[Any] = []
    source = _source(node, shared)
    if source is None:
        return None
    fill: _Fill = eval(f"lambda args: {source}", {"__builtins__": {}, "shared": shared})
    return fill


def _source(node: Any, shared: list[Any]) -> str | None:
    """Python source that builds ``node`` from ``args``; None when it holds no `Param`."""
    if isinstance(node, Param):
        return f"args[{node.index}]"
    if isinstance(node, dict):
        items = {key: _source(value, shared) for key, value in node.items()}
        if all(item is None for item in items.values()):
            return None
        parts = []
        for key, item in items.items():
            if not isinstance(key, str):
                raise TypeError(f"a template's keys are strings, not {key!r}")
            parts.append(f"{key!r}: {_shared(node[key], shared) if item is None else item}")
        return "{" + ", ".join(parts) + "}"
    if isinstance(node, list):
        entries = [_source(value, shared) for value in node]
        if all(entry is None for entry in entries):
            return None
        return (
            "["
            + ", ".join(
                _shared(value, shared) if entry is None else entry
                for value, entry in zip(node, entries, strict=True)
            )
            + "]"
        )
    return None


def _shared(value: Any, shared: list[Any]) -> str:
    shared.append(value)
    return f"shared[{len(shared) - 1}]"


def templated(build: Callable[P, T]) -> Callable[P, T]:
    """``build`` called once with a `Param` for each argument, then filled per call.

    ``build`` must place its arguments in what it returns as they are (inside ``$literal``,
    say), never compute with them or branch on them: a builder that does raises or returns
    a pipeline holding a `Param`, which `templated` refuses at its first call. Arguments
    passed by keyword are accepted; defaults are used as the builder declares them."""
    signature = inspect.signature(build)
    names = list(signature.parameters)
    fill: _Fill | None = None
    built: Any = None

    @functools.wraps(build)
    def instantiate(*args: P.args, **kwargs: P.kwargs) -> T:
        nonlocal fill, built
        if kwargs or len(args) < len(names):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args  # type: ignore[assignment]
        if built is None:
            params = [Param(index, name) for index, name in enumerate(names)]
            built = build(*params)  # type: ignore[arg-type, call-arg]
            fill = _compile(built)
            if fill is None:
                raise TypeError(f"{build.__name__}: its pipeline uses none of its arguments")
            _check_filled(fill(tuple(range(len(names)))), build.__name__)
        assert fill is not None
        result: T = fill(args)
        return result

    return instantiate


def _check_filled(node: Any, builder: str) -> None:
    """No `Param` is left where the fill does not reach (a builder that hid one in a
    tuple or an object would send it to the database)."""
    if isinstance(node, Param):
        raise TypeError(f"{builder}: a template cannot fill argument {node.name!r} where it is")
    if isinstance(node, dict):
        for value in node.values():
            _check_filled(value, builder)
    elif isinstance(node, list | tuple):
        for value in node:
            _check_filled(value, builder)
