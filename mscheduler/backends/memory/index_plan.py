"""Would MongoDB answer a query from an index? The memory backend's ``notablescan`` check.

A small model of the planner, enough to keep every query of the store index-served: an
index serves a query when its first key is matched (equality or range), and a sort when the
sort keys follow in index order (or all reversed) with only equality-matched keys between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_RANGE_OPERATORS = {"$lt", "$lte", "$gt", "$gte", "$ne", "$nin", "$exists"}
_EQUALITY_OPERATORS = {"$eq", "$in"}


def _field_kinds(query: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Top-level fields a plan could seek on: (equality fields, range fields)."""
    equality: set[str] = set()
    ranges: set[str] = set()
    for field, condition in query.items():
        if field.startswith("$"):
            continue
        if isinstance(condition, Mapping) and any(str(k).startswith("$") for k in condition):
            operators = set(condition)
            if operators <= _EQUALITY_OPERATORS:
                equality.add(field)
            elif operators & _RANGE_OPERATORS:
                ranges.add(field)
        else:
            equality.add(field)
    return equality, ranges


def index_serves(
    index_keys: Sequence[tuple[str, int]],
    query: Mapping[str, Any],
    sort: Sequence[tuple[str, int]] | None = None,
    *,
    partial: Mapping[str, Any] | None = None,
) -> bool:
    """Whether an index gives a plan without a collection scan and without an in-memory sort:
    its first key is sought on, and the sort keys follow in order (or all reversed), with only
    equality-matched keys in between. An index with a ``partial`` filter (its
    ``partialFilterExpression``) serves only a query that implies it (`implies_partial`)."""
    if not implies_partial(query, partial):
        return False
    equality, ranges = _field_kinds(query)
    fields = [field for field, _ in index_keys]
    if not sort and fields[0] not in equality | ranges:
        return False
    if not sort:
        return True
    if fields[0] not in equality | ranges and fields[0] != sort[0][0]:
        return False
    directions = dict(index_keys)
    position = 0
    flip: int | None = None
    for field, direction in sort:
        while position < len(fields) and fields[position] != field:
            if fields[position] not in equality:
                return False
            position += 1
        if position == len(fields):
            return False
        relative = 1 if directions[field] == direction else -1
        if flip is None:
            flip = relative
        elif flip != relative:
            return False
        position += 1
    return True


def bounded_keys(index_keys: Sequence[tuple[str, int]], query: Mapping[str, Any]) -> list[str]:
    """The leading keys of an index that ``query`` bounds: equalities, then at most one
    range. Past them the server reads every index key in the bounds (keys examined)."""
    equality, ranges = _field_kinds(query)
    bounded: list[str] = []
    for field, _ in index_keys:
        if field in equality:
            bounded.append(field)
        elif field in ranges:
            bounded.append(field)
            break
        else:
            break
    return bounded


def implies_partial(query: Mapping[str, Any], partial: Mapping[str, Any] | None) -> bool:
    """Whether the planner may use an index with this ``partialFilterExpression``: here, when
    every condition of the filter is written in the query as is (the server proves more, but
    a query written so is always accepted)."""
    for field, condition in (partial or {}).items():
        written = query.get(field)
        if isinstance(condition, Mapping) and isinstance(written, Mapping):
            if any(written.get(op) != value for op, value in condition.items()):
                return False
        elif written != condition:
            return False
    return True
