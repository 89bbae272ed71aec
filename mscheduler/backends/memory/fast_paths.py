"""Where mongomock is slower than it needs to be, made faster with the same results. Applied
to the memory server's own copy of mongomock's engine (`engine`), never to mongomock.

- operators are dispatched by a dict, and ``$$var`` read directly;
- documents are copied by `document_copy` (dicts, lists and mongomock's stored OrderedDicts
  rebuilt, immutable values shared), where mongomock used `copy.deepcopy`;
- dates are converted to their stored form by `datetimes_as_stored`, which dispatches on the
  exact type first, and an update pipeline is not walked before it is evaluated
  (`documents_as_stored`: `agreement` converts its dates as it evaluates them).

Reads by index are not here: they belong to the memory server's own collections alone
(`indexed`).
"""

from __future__ import annotations

import collections
import copy
import datetime as dt
import functools
from typing import Any

from bson import Int64, ObjectId
from mongomock import helpers as mongomock_helpers

_original_datetime_patch = mongomock_helpers.patch_datetime_awareness_in_document


def apply(aggregate: Any, collection: Any) -> None:
    """Change ``aggregate`` and ``collection`` (the engine's own copies of mongomock's modules)
    in place."""
    parser = aggregate._Parser
    parser.parse = _parse_by_dispatch(parser.parse, _operator_handlers(aggregate))
    parser._parse_basic_expression = _variables_read_directly(parser._parse_basic_expression)
    collection.copy = _DocumentCopies
    collection._copy_field = _copy_field(collection._copy_field)


def _operator_handlers(aggregate: Any) -> dict[str, str]:
    """Operator -> the `_Parser` method that evaluates it, in the order `_Parser.parse`
    tests its lists (an operator in two lists goes to the first)."""
    a = aggregate
    categories = [
        (a.arithmetic_operators, "_handle_arithmetic_operator"),
        (a.project_operators, "_handle_project_operator"),
        (a.projection_operators, "_handle_projection_operator"),
        (a.comparison_operators, "_handle_comparison_operator"),
        (a.date_operators, "_handle_date_operator"),
        (a.array_operators, "_handle_array_operator"),
        (a.conditional_operators, "_handle_conditional_operator"),
        (a.control_flow_operators, "_handle_control_flow_operator"),
        (a.set_operators, "_handle_set_operator"),
        (a.string_operators, "_handle_string_operator"),
        (a.type_convertion_operators, "_handle_type_convertion_operator"),
        (a.type_operators, "_handle_type_operator"),
        (a.boolean_operators, "_handle_boolean_operator"),
    ]
    handlers: dict[str, str] = {}
    for operators, method in categories:
        for operator in operators:
            handlers.setdefault(operator, method)
    return handlers


def _parse_by_dispatch(original: Any, handlers: dict[str, str]) -> Any:
    """An operator expression goes straight to its handler: mongomock tested the operator
    against each of its thirteen lists in turn, for every node of every pipeline."""

    @functools.wraps(original)
    def parse(self: Any, expression: Any) -> Any:
        if type(expression) is dict and len(expression) == 1:
            for operator, value in expression.items():
                method = handlers.get(operator)
                if method is not None:
                    return getattr(self, method)(operator, value)
        elif type(expression) is not dict:
            return self._parse_basic_expression(expression)
        return original(self, expression)

    return parse


def _variables_read_directly(original: Any) -> Any:
    """``$$var.path`` read from the variable itself: mongomock merged every variable into a new
    mapping for each read (the ``$$ws`` of every ``$filter`` and ``$map``)."""

    @functools.wraps(original)
    def parse(self: Any, expression: Any) -> Any:
        if type(expression) is str and expression.startswith("$$"):
            path = expression[2:]
            name = path.split(".", 1)[0]
            variables = self._user_vars
            if name in variables:
                return mongomock_helpers.get_value_by_dot(  # type: ignore[no-untyped-call]
                    {name: variables[name]}, path, can_generate_array=True
                )
        return original(self, expression)

    return parse


def datetimes_as_stored(value: Any) -> Any:
    """mongomock's ``patch_datetime_awareness_in_document`` (dates as naive UTC to the
    millisecond, as MongoDB stores them), dispatching on the exact type first: it walks every
    filter and update of every write."""
    kind = type(value)
    if kind in _NO_DATES:
        return value
    if kind is dict:  # a document is mostly scalars: those are not a call each
        return {
            key: item if type(item) in _NO_DATES else datetimes_as_stored(item)
            for key, item in value.items()
        }
    if kind is list or kind is tuple:
        return [item if type(item) in _NO_DATES else datetimes_as_stored(item) for item in value]
    if kind is dt.datetime:
        global _latest_date
        if _latest_date[0] is value:  # a write's `now`, in several fields: one stored object
            return _latest_date[1]
        millis = value.microsecond // 1000 * 1000
        if value.tzinfo is not None:
            offset = value.utcoffset() or dt.timedelta(0)
            stored = (value - offset).replace(tzinfo=None, microsecond=millis)
        else:
            stored = value.replace(microsecond=millis)
        _latest_date = (value, stored)
        return stored
    return _original_datetime_patch(value)  # type: ignore[no-untyped-call]  # OrderedDict, subclasses, Timestamp, ...


_NO_DATES = frozenset({str, int, float, bool, type(None), bytes, ObjectId, Int64})
# The latest date converted (datetimes are immutable: sharing the result is safe).
_latest_date: tuple[Any, Any] = (None, None)


def documents_as_stored(value: Any) -> Any:
    """What mongomock calls on every filter, update and inserted document. A top-level list
    can only be an update pipeline (filters, documents and classic updates are documents):
    it is not walked, its dates are converted as the pipeline is evaluated (`agreement`). A
    claim's or a finish's pipeline has about a thousand nodes."""
    if type(value) is list:
        return value
    return datetimes_as_stored(value)


# Values that no write changes in place: a copy of a document may share them with the original.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes, dt.datetime, ObjectId, Int64})


def document_copy(value: Any) -> Any:
    """A deep copy of a stored document: its dicts and lists copied, immutable values shared.
    mongomock copies every document it reads or updates with `copy.deepcopy`, the largest part
    of its reads; anything else (a subclass, a Timestamp) still goes to it."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:  # its immutable values taken as they are, without a call each
        return {
            key: item if type(item) in _IMMUTABLE else document_copy(item)
            for key, item in value.items()
        }
    if kind is list:
        return [item if type(item) in _IMMUTABLE else document_copy(item) for item in value]
    if kind is collections.OrderedDict:  # how mongomock stores each document
        return collections.OrderedDict((key, document_copy(item)) for key, item in value.items())
    return copy.deepcopy(value)


class _DocumentCopies:
    """What mongomock's collection module calls ``copy``: `document_copy` for its copies."""

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        return document_copy(value)

    @staticmethod
    def copy(value: Any) -> Any:
        return value if type(value) in _IMMUTABLE else copy.copy(value)


def _copy_field(original: Any) -> Any:
    """mongomock's copy of each document a read returns (and of each field a projection
    keeps): `document_copy` when documents are plain dicts, the default codec. It tested
    each value's type in Python, then copied it: a fifth of the consumer's fetch."""

    @functools.wraps(original)
    def copy_field(value: Any, container: Any) -> Any:
        if container is dict:
            if isinstance(value, dict):  # a stored document (an OrderedDict): returned as a dict
                return {
                    key: item if type(item) in _IMMUTABLE else document_copy(item)
                    for key, item in value.items()
                }
            return document_copy(value)
        return original(value, container)

    return copy_field
