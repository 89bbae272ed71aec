"""Where mongomock evaluates otherwise than MongoDB in what the store relies on, made to agree.
Applied to the memory server's own copy of mongomock's engine (`engine`), never to mongomock.

- ``$add`` of a date and milliseconds gives a date (mongomock only adds numbers), and
  evaluates its operands once;
- ``$trunc`` takes MongoDB's array form, ``[number]`` (its decimal place left out; mongomock
  takes a bare number only, which the wire tier's engine refuses);
- the elements of an array literal are evaluated as expressions (mongomock stores them
  unevaluated), and a date in a pipeline (or under ``$literal``) is the date as stored
  (naive UTC to the millisecond): an update pipeline's dates are converted as it is
  evaluated (`fast_paths.documents_as_stored` does not walk it first);
- ``$and`` stops at its first false operand, and the ``$unset`` stage exists, as on MongoDB.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import numbers
from typing import Any

from pymongo.errors import OperationFailure

from .fast_paths import datetimes_as_stored


def apply(aggregate: Any) -> None:
    """Change ``aggregate`` (the engine's own copy of mongomock's module) in place."""
    parser = aggregate._Parser
    parser._handle_arithmetic_operator = _arithmetic_with_dates(parser._handle_arithmetic_operator)
    parser._parse_basic_expression = _basic_expression_with_arrays(parser._parse_basic_expression)
    parser._handle_projection_operator = _literal_as_stored(parser._handle_projection_operator)
    parser._handle_boolean_operator = _and_stops_at_false(parser._handle_boolean_operator)
    aggregate._PIPELINE_HANDLERS["$unset"] = _unset_stage


def _arithmetic_with_dates(original: Any) -> Any:
    @functools.wraps(original)
    def handle(self: Any, operator: str, values: Any) -> Any:
        if operator == "$trunc" and isinstance(values, (list, tuple)) and len(values) == 1:
            values = values[0]
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
        return original(self, operator, values)

    return handle


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _basic_expression_with_arrays(original: Any) -> Any:
    @functools.wraps(original)
    def parse(self: Any, expression: Any) -> Any:
        kind = type(expression)
        if kind is list:
            # A plain string or number is itself (the lists of states that `$in` tests, for
            # every element of every `$filter`: not parsed, for speed); anything else is an
            # expression.
            return [
                element
                if type(element) in _PLAIN and not (type(element) is str and element[:1] == "$")
                else self.parse(element)
                for element in expression
            ]
        if kind is dt.datetime:
            return datetimes_as_stored(expression)
        return original(self, expression)

    return parse


def _literal_as_stored(original: Any) -> Any:
    @functools.wraps(original)
    def handle(self: Any, operator: str, value: Any) -> Any:
        if operator == "$literal":
            return datetimes_as_stored(value)
        return original(self, operator, value)

    return handle


def _and_stops_at_false(original: Any) -> Any:
    """mongomock evaluated every operand of ``$and`` (its ``$or`` already stops at the first
    true one)."""

    @functools.wraps(original)
    def handle(self: Any, operator: str, values: Any) -> Any:
        if operator == "$and":
            return all(self._parse_to_bool(value) for value in values)
        return original(self, operator, values)

    return handle


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
