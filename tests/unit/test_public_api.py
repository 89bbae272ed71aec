"""The public API is what ``__all__`` says, and every name in it exists."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

import mscheduler as ms

# Reached through a public method, yet internal: `Handlers.spec` serves the consumer only.
# Giving it a private name belongs to the consumer's own change; nothing else may join.
INTERNAL_BUT_REACHABLE = {"HandlerSpec"}


def test_all_names_exist_and_are_listed_once() -> None:
    assert len(set(ms.__all__)) == len(ms.__all__)
    missing = [name for name in ms.__all__ if not hasattr(ms, name)]
    assert missing == []


def test_every_public_class_is_exported() -> None:
    public = {
        name
        for name, value in vars(ms).items()
        if isinstance(value, type) and not name.startswith("_")
    }
    assert public <= set(ms.__all__)


def test_every_exception_is_a_library_error_or_a_handler_signal_never_both() -> None:
    exceptions = {
        name: value
        for name in ms.__all__
        if isinstance(value := getattr(ms, name), type) and issubclass(value, BaseException)
    }
    signals = {name for name, e in exceptions.items() if issubclass(e, ms.HandlerSignal)}
    errors = {name for name, e in exceptions.items() if issubclass(e, ms.MSchedulerError)}
    assert signals == {"HandlerSignal", "Abort", "RetryLater"}
    assert errors == set(exceptions) - signals
    assert ms.TaskTimeout in [exceptions[name] for name in errors]  # raised by the consumer


@pytest.mark.parametrize("signal", [ms.Abort("no"), ms.RetryLater(5.0)])
def test_a_handlers_except_mscheduler_error_does_not_swallow_its_signal(
    signal: ms.HandlerSignal,
) -> None:
    """A handler guards its calls to the library with ``except ms.MSchedulerError``; the
    `Abort` or `RetryLater` it raises inside that block must still reach the consumer."""

    def handler() -> str:
        try:
            raise signal  # after some call to the library that may fail
        except ms.MSchedulerError:
            return "swallowed: the task would succeed"

    with pytest.raises(type(signal)):
        handler()


def _classes_in(hint: Any, found: set[type]) -> None:
    for inner in typing.get_args(hint):
        _classes_in(inner, found)
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and origin.__module__.startswith("mscheduler"):
        found.add(origin)


def test_every_type_a_public_name_hands_out_or_takes_is_exported() -> None:
    """What a public method returns or takes, or a public model holds, a user touches: it is
    exported, so it can be imported, annotated and found in the reference."""
    reached: set[type] = set()
    for name in ms.__all__:
        value = getattr(ms, name)
        if not isinstance(value, type):
            continue
        for attr, member in vars(value).items():
            function = member.fget if isinstance(member, property) else member
            function = getattr(function, "__func__", function)  # class and static methods
            if attr.startswith(("_", "model_")) or not callable(function):  # model_: pydantic
                continue
            for hint in typing.get_type_hints(function).values():
                _classes_in(hint, reached)
        if issubclass(value, BaseModel):
            for field, info in value.model_fields.items():
                if not field.startswith("_"):
                    _classes_in(info.annotation, reached)
    internal = {cls.__qualname__ for cls in reached if cls.__name__.startswith("_")}
    unexported = {cls.__qualname__ for cls in reached} - internal - set(ms.__all__)
    assert unexported == INTERNAL_BUT_REACHABLE


def test_every_exported_name_is_loaded_on_first_use() -> None:
    """The package loads its modules lazily (so the command starts fast): each name of
    ``__all__`` has a home, and nothing else is listed."""
    assert set(ms._HOMES) == set(ms.__all__) - {"__version__"}
    assert all(getattr(ms, name) is not None for name in ms._HOMES)
