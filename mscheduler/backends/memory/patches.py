"""Where mongomock differs from MongoDB in what the store relies on, made to agree, and one
place where it is slower than it needs to be. Applied once, on import of the memory backend.

- ``$add`` of a date and milliseconds gives a date (mongomock only adds numbers);
- the elements of an array literal are evaluated as expressions (mongomock stores them
  unevaluated);
- a query by ``_id`` alone reads that document, as the server's ``_id`` index does, instead
  of testing every document of the collection (the memory backend looks each written
  document up by ``_id`` before and after the write, for its change feed).
"""

from __future__ import annotations

import datetime as dt
import functools
import numbers
from collections.abc import Iterator
from typing import Any

from bson import ObjectId
from mongomock import aggregate as mongomock_aggregate
from mongomock import collection as mongomock_collection

_original_arithmetic = mongomock_aggregate._Parser._handle_arithmetic_operator


@functools.wraps(_original_arithmetic)
def _arithmetic_with_dates(self: Any, operator: str, values: Any) -> Any:
    if operator == "$add" and isinstance(values, (list, tuple)):
        parsed = list(self.parse_many(values))
        dates = [v for v in parsed if isinstance(v, dt.datetime)]
        if len(dates) == 1 and all(
            v is dates[0] or isinstance(v, numbers.Number) for v in parsed if v is not None
        ):
            if any(v is None for v in parsed):
                return None
            millis = sum(v for v in parsed if not isinstance(v, dt.datetime))
            return dates[0] + dt.timedelta(milliseconds=millis)
    return _original_arithmetic(self, operator, values)


_original_basic_expression = mongomock_aggregate._Parser._parse_basic_expression


@functools.wraps(_original_basic_expression)
def _basic_expression_with_arrays(self: Any, expression: Any) -> Any:
    if isinstance(expression, list):
        return [self.parse(element) for element in expression]
    return _original_basic_expression(self, expression)


mongomock_aggregate._Parser._handle_arithmetic_operator = _arithmetic_with_dates  # type: ignore[method-assign]
mongomock_aggregate._Parser._parse_basic_expression = _basic_expression_with_arrays  # type: ignore[method-assign]


_original_iter_documents = mongomock_collection.Collection._iter_documents


@functools.wraps(_original_iter_documents)
def _iter_documents_by_id(self: Any, filter: Any) -> Iterator[Any]:
    if type(filter) is dict and len(filter) == 1 and "_id" in filter:
        wanted = filter["_id"]
        # Only values that compare as they hash: an operator document, a list or a float
        # goes through mongomock's own matching.
        if type(wanted) in (ObjectId, str, int):
            store = self._store
            return iter([store[wanted]] if wanted in store else [])
    return _original_iter_documents(self, filter)


mongomock_collection.Collection._iter_documents = _iter_documents_by_id  # type: ignore[method-assign]
