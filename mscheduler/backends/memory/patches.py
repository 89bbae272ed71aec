"""Where mongomock differs from MongoDB in what the store relies on, made to agree, and where
it is slower than it needs to be. Applied once, on import of the memory backend.

- ``$add`` of a date and milliseconds gives a date (mongomock only adds numbers);
- the elements of an array literal are evaluated as expressions (mongomock stores them
  unevaluated);
- ``$and`` stops at its first false operand, and the ``$unset`` stage exists, as on MongoDB;
- an update pipeline's dates are converted as it is evaluated, not by a walk of the whole
  pipeline first; operators are dispatched by a dict, and ``$$var`` read directly; ``$add``
  evaluates its operands once, and an array literal's plain strings and numbers are taken
  as they are;
- documents are copied by `document_copy` (dicts, lists and mongomock's stored OrderedDicts
  rebuilt, immutable values shared), where mongomock used `copy.deepcopy`.

Reads by index are not here: they belong to the memory server's own collections alone
(`indexed`).
"""

from __future__ import annotations

import collections
import copy
import datetime as dt
import functools
import numbers
from typing import Any

from bson import Int64, ObjectId
from mongomock import aggregate as mongomock_aggregate
from mongomock import collection as mongomock_collection
from mongomock import helpers as mongomock_helpers
from pymongo.errors import OperationFailure

_original_arithmetic = mongomock_aggregate._Parser._handle_arithmetic_operator


@functools.wraps(_original_arithmetic)
def _arithmetic_with_dates(self: Any, operator: str, values: Any) -> Any:
    """``$add`` evaluates its operands once (mongomock's evaluated them twice when they were
    all numbers: ours, then its own)."""
    if operator == "$add" and isinstance(values, (list, tuple)):
        parsed = list(self.parse_many(values))
        dates = [v for v in parsed if isinstance(v, dt.datetime)]
        if len(dates) <= 1 and all(
            v is None or isinstance(v, (dt.datetime, numbers.Number)) for v in parsed
        ):
            if any(v is None for v in parsed):
                return None
            total = sum(v for v in parsed if not isinstance(v, dt.datetime))
            return dates[0] + dt.timedelta(milliseconds=total) if dates else total
    return _original_arithmetic(self, operator, values)


_original_basic_expression = mongomock_aggregate._Parser._parse_basic_expression
_PLAIN = frozenset({str, int, float, bool, type(None)})


@functools.wraps(_original_basic_expression)
def _basic_expression_with_arrays(self: Any, expression: Any) -> Any:
    """Array literals evaluated element by element, dates as stored, and ``$$var.path`` read
    from the variable itself (mongomock merged every variable into a new mapping for each
    read: the ``$$ws`` of every ``$filter`` and ``$map``)."""
    kind = type(expression)
    if kind is str:
        if expression.startswith("$$"):
            path = expression[2:]
            name = path.split(".", 1)[0]
            variables = self._user_vars
            if name in variables:
                return mongomock_helpers.get_value_by_dot(
                    {name: variables[name]}, path, can_generate_array=True
                )
        return _original_basic_expression(self, expression)
    if kind is list:
        # A plain string or number is itself (the lists of states that `$in` tests, for every
        # element of every `$filter`); anything else is an expression.
        return [
            element
            if type(element) in _PLAIN and not (type(element) is str and element[:1] == "$")
            else self.parse(element)
            for element in expression
        ]
    if kind is dt.datetime:
        return datetimes_as_stored(expression)
    return _original_basic_expression(self, expression)


_original_projection_operator = mongomock_aggregate._Parser._handle_projection_operator


@functools.wraps(_original_projection_operator)
def _literal_as_stored(self: Any, operator: str, value: Any) -> Any:
    if operator == "$literal":
        return datetimes_as_stored(value)
    return _original_projection_operator(self, operator, value)


def _operator_handlers() -> dict[str, str]:
    """Operator -> the `_Parser` method that evaluates it, in the order `_Parser.parse`
    tests its lists (an operator in two lists goes to the first)."""
    a = mongomock_aggregate
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


_original_boolean_operator = mongomock_aggregate._Parser._handle_boolean_operator


@functools.wraps(_original_boolean_operator)
def _and_stops_at_false(self: Any, operator: str, values: Any) -> Any:
    """``$and`` stops at its first false operand, as on MongoDB (mongomock evaluated them all;
    its ``$or`` already stops at the first true one)."""
    if operator == "$and":
        return all(self._parse_to_bool(value) for value in values)
    return _original_boolean_operator(self, operator, values)


def _without(document: Any, path: list[str]) -> None:
    """Remove ``path`` from ``document`` in place; through an array, from each element."""
    if isinstance(document, list):
        for element in document:
            _without(element, path)
    elif isinstance(document, dict) and path[0] in document:
        if len(path) == 1:
            del document[path[0]]
        else:
            document[path[0]] = copy.deepcopy(document[path[0]])
            _without(document[path[0]], path[1:])


def _unset_stage(in_collection: list[Any], _database: Any, options: Any) -> list[Any]:
    """The ``$unset`` stage (MongoDB 4.2+, in aggregations and update pipelines), which
    mongomock lists but does not implement."""
    fields = [options] if isinstance(options, str) else options
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise OperationFailure("$unset specification must be a string or an array of strings")
    out = []
    for document in in_collection:
        document = dict(document)
        for field in fields:
            _without(document, field.split("."))
        out.append(document)
    return out


_HANDLERS = _operator_handlers()
_original_parse = mongomock_aggregate._Parser.parse


@functools.wraps(_original_parse)
def _parse_by_dispatch(self: Any, expression: Any) -> Any:
    """An operator expression goes straight to its handler: mongomock tested the operator
    against each of its thirteen lists in turn, for every node of every pipeline."""
    if type(expression) is dict and len(expression) == 1:
        for operator, value in expression.items():
            method = _HANDLERS.get(operator)
            if method is not None:
                return getattr(self, method)(operator, value)
    elif type(expression) is not dict:
        return self._parse_basic_expression(expression)
    return _original_parse(self, expression)


def datetimes_as_stored(value: Any) -> Any:
    """mongomock's ``patch_datetime_awareness_in_document`` (dates as naive UTC to the
    millisecond, as MongoDB stores them), dispatching on the exact type first: it walks every
    filter and update of every write, and was a quarter of the backend's time per task."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None or kind is float:
        return value
    if kind is dict:
        return {key: datetimes_as_stored(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [datetimes_as_stored(item) for item in value]
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
    return _original_datetime_patch(value)  # OrderedDict, subclasses, Timestamp, ...


# The latest date converted (datetimes are immutable: sharing the result is safe).
_latest_date: tuple[Any, Any] = (None, None)


def _documents_as_stored(value: Any) -> Any:
    """What mongomock calls on every filter, update and inserted document. A top-level list
    can only be an update pipeline (filters, documents and classic updates are documents):
    it is not walked, its dates are converted as the pipeline is evaluated
    (`_basic_expression_with_arrays`, `_literal_as_stored`). A claim's or a finish's
    pipeline has about a thousand nodes, and walking each one before evaluating it was a
    large share of the memory backend's time per task (see bench/README.md)."""
    if type(value) is list:
        return value
    return datetimes_as_stored(value)


_original_datetime_patch = mongomock_helpers.patch_datetime_awareness_in_document
mongomock_helpers.patch_datetime_awareness_in_document = _documents_as_stored

mongomock_aggregate._Parser._handle_arithmetic_operator = _arithmetic_with_dates  # type: ignore[method-assign]
mongomock_aggregate._Parser._parse_basic_expression = _basic_expression_with_arrays  # type: ignore[method-assign]
mongomock_aggregate._Parser._handle_projection_operator = _literal_as_stored  # type: ignore[method-assign]
mongomock_aggregate._Parser.parse = _parse_by_dispatch  # type: ignore[method-assign]
mongomock_aggregate._Parser._handle_boolean_operator = _and_stops_at_false  # type: ignore[method-assign]
mongomock_aggregate._PIPELINE_HANDLERS["$unset"] = _unset_stage


# Values that no write changes in place: a copy of a document may share them with the original.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes, dt.datetime, ObjectId, Int64})


def document_copy(value: Any) -> Any:
    """A deep copy of a stored document: its dicts and lists copied, immutable values shared.
    mongomock copies every document it reads or updates with `copy.deepcopy`, which was the
    largest part of its reads; anything else (a subclass, a Timestamp) still goes to it."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {key: document_copy(item) for key, item in value.items()}
    if kind is list:
        return [document_copy(item) for item in value]
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


mongomock_collection.copy = _DocumentCopies  # type: ignore[attr-defined,assignment]

_original_copy_field = mongomock_collection._copy_field


@functools.wraps(_original_copy_field)
def _copy_field(value: Any, container: Any) -> Any:
    """mongomock's copy of each document a read returns (and of each field a projection
    keeps): `document_copy` when documents are plain dicts, the default codec. It tested
    each value's type in Python, then copied it: a fifth of the consumer's fetch."""
    if container is dict:
        if isinstance(value, dict):  # a stored document (an OrderedDict) is returned as a dict
            return {key: document_copy(item) for key, item in value.items()}
        return document_copy(value)
    return _original_copy_field(value, container)


mongomock_collection._copy_field = _copy_field
