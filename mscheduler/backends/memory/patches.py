"""Where mongomock differs from MongoDB in what the store relies on, made to agree, and one
place where it is slower than it needs to be. Applied once, on import of the memory backend.

- ``$add`` of a date and milliseconds gives a date (mongomock only adds numbers);
- the elements of an array literal are evaluated as expressions (mongomock stores them
  unevaluated);
- a query by ``_id`` alone (or ``_id`` ``$in`` a list) reads those documents, as the server's
  ``_id`` index does, instead of testing every document of the collection (the memory
  backend looks each written document up by ``_id`` before and after the write, for its
  change feed); any other query tests only the candidates of a declared index when one
  applies (`ordered_index`).
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
from mongomock import helpers as mongomock_helpers
from mongomock.filtering import filter_applies

# The attribute of a mongomock collection store that holds its ordered indexes.
INDEX_SET_ATTRIBUTE = "_mscheduler_ordered_indexes"

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
        millis = value.microsecond // 1000 * 1000
        if value.tzinfo is not None:
            offset = value.utcoffset() or dt.timedelta(0)
            return (value - offset).replace(tzinfo=None, microsecond=millis)
        return value.replace(microsecond=millis)
    return _original_datetime_patch(value)  # OrderedDict, subclasses, Timestamp, ...


_original_datetime_patch = mongomock_helpers.patch_datetime_awareness_in_document
mongomock_helpers.patch_datetime_awareness_in_document = datetimes_as_stored

mongomock_aggregate._Parser._handle_arithmetic_operator = _arithmetic_with_dates  # type: ignore[method-assign]
mongomock_aggregate._Parser._parse_basic_expression = _basic_expression_with_arrays  # type: ignore[method-assign]


_original_iter_documents = mongomock_collection.Collection._iter_documents


_HASHABLE_IDS = (ObjectId, str, int)  # compare as they hash; floats and documents do not


@functools.wraps(_original_iter_documents)
def _iter_documents_indexed(self: Any, filter: Any) -> Iterator[Any]:
    """The documents that may match ``filter``: by ``_id`` when it names them, else the
    candidates of an ordered index (`ordered_index.IndexSet`) when one applies, else all."""
    if type(filter) is not dict:
        return _original_iter_documents(self, filter)
    store = self._store
    wanted = filter.get("_id")
    if type(wanted) in _HASHABLE_IDS:
        if wanted not in store:
            return iter([])
        if len(filter) == 1:
            return iter([store[wanted]])
        # `_id` and more (a batched claim's write): that one document, tested.
        return iter([store[wanted]] if filter_applies(filter, store[wanted]) else [])
    if (
        len(filter) == 1
        and "_id" in filter
        and (
            type(wanted) is dict
            and list(wanted) == ["$in"]
            and all(type(one) in _HASHABLE_IDS for one in wanted["$in"])
        )
    ):
        return iter([store[one] for one in dict.fromkeys(wanted["$in"]) if one in store])
    index_set = getattr(store, INDEX_SET_ATTRIBUTE, None)
    if index_set is not None:
        candidates = index_set.candidates(filter, None)
        if candidates is not None:
            return (
                store[one]
                for one in list(candidates)
                if one in store and filter_applies(filter, store[one])
            )
    return _original_iter_documents(self, filter)


mongomock_collection.Collection._iter_documents = _iter_documents_indexed  # type: ignore[method-assign]
