"""Declared indexes, kept in order, so that the memory backend answers a query as an index scan
does: it walks the candidates in index order and stops at the first ``limit`` that match,
instead of testing every document of the collection and sorting them (mongomock's way).

With mongomock alone a claim cost time in proportion to every pending and finished document of
the collection (bench/bench_scale.py measures it). An index scan costs
what it walks: the claim of a due task reads one candidate.

Only what the store's queries need, and nothing that could change an answer:
- an index is used when the query has equality (a scalar, or ``$in`` of scalars) on a prefix
  of its keys and the sort, if any, is exactly the keys that follow (as declared); every
  candidate is still tested against the whole filter with mongomock's own matcher, so the
  index only decides the order and what need not be looked at;
- indexes on array fields (multikey: ``worker_states.run_id``, ``depends_on``) are not kept;
  a document whose indexed field holds an array, a document or a value whose order against
  the others is not BSON's here (see `_ordered`) is not indexed: a query that could match it
  goes to mongomock.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
import itertools
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bson import ObjectId

MAX_PREFIX_COMBINATIONS = 10_000  # $in values multiplied out over the prefix fields

_MISSING = object()


class _Descending:
    """A key of a descending index field: compares in reverse."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.value < self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and bool(self.value == other.value)

    def __hash__(self) -> int:
        return hash(self.value)


class _Unorderable(Exception):
    pass


def _directed(ordered: tuple[int, Any], direction: int) -> Any:
    """A key part in the index's direction. A descending number is negated (plain tuples
    compare in C: an insert into 10,000 entries stays cheap); anything else descending is
    wrapped."""
    if direction >= 0:
        return ordered
    rank, value = ordered
    if rank in (0, 1):  # null, numbers
        return (-rank, -value)
    return (-rank, _Descending(value))


def _ordered(value: Any) -> tuple[int, Any]:
    """A value's place in BSON's order across the types the store writes: null (or missing),
    numbers, strings, ObjectIds, booleans, dates. Anything else is not indexed."""
    if value is None or value is _MISSING:
        return (0, 0)
    if isinstance(value, bool):
        return (8, value)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, ObjectId):
        return (7, value)
    if isinstance(value, dt.datetime):  # naive UTC, as BSON stores it
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return (9, value)
    raise _Unorderable


def _field(document: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path; an array on the way (or at the end) makes the document
    multikey for this index, which is not kept in order here."""
    value: Any = document
    for part in path.split("."):
        if isinstance(value, (list, tuple)):
            raise _Unorderable
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


class OrderedIndex:
    """One declared index: a sorted list of (key tuple, _id) over the indexable documents."""

    def __init__(self, keys: Sequence[tuple[str, int]]) -> None:
        self.keys = list(keys)
        self.fields = [field for field, _ in self.keys]
        self._entries: list[tuple[tuple[Any, ...], tuple[int, Any]]] = []
        self._key_of: dict[Any, tuple[Any, ...]] = {}  # _id -> its key, when indexed
        self.unindexed: set[Any] = set()  # ids of documents this index cannot order

    def _key(self, document: Mapping[str, Any]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for field, direction in self.keys:
            value = _field(document, field)
            if isinstance(value, (list, dict)):
                raise _Unorderable
            parts.append(_directed(_ordered(value), direction))
        return tuple(parts)

    def remove(self, document_id: Any) -> None:
        self.unindexed.discard(document_id)
        key = self._key_of.pop(document_id, None)
        if key is None:
            return
        entry = (key, _id_key(document_id))
        position = bisect.bisect_left(self._entries, entry)
        if position < len(self._entries) and self._entries[position] == entry:
            del self._entries[position]

    def replace(self, document: Mapping[str, Any]) -> None:
        """``document`` written again: moved only if its key changed (most writes change no
        field of most indexes)."""
        try:
            if self._key_of.get(document["_id"]) == self._key(document):
                return
        except _Unorderable:
            pass
        self.remove(document["_id"])
        self.add(document)

    def add(self, document: Mapping[str, Any]) -> None:
        document_id = document["_id"]
        try:
            key = self._key(document)
        except _Unorderable:
            self.unindexed.add(document_id)
            return
        self._key_of[document_id] = key
        bisect.insort(self._entries, (key, _id_key(document_id)))

    def scan(
        self, query: Mapping[str, Any], sort: Sequence[tuple[str, int]] | None
    ) -> tuple[int, Iterator[Any]] | None:
        """The ids of the candidates for ``query``, in the order of ``sort``; None when this
        index cannot give that (the caller tries another, or mongomock)."""
        prefix_values: list[list[Any]] = []
        for field in self.fields:
            values = _equality_values(query.get(field, _MISSING))
            if values is None:
                break
            prefix_values.append(values)
        if not prefix_values:
            return None
        rest = self.keys[len(prefix_values) :]
        if sort and list(sort) != rest[: len(sort)]:
            return None
        try:
            ordered_values = [[_ordered(v) for v in values] for values in prefix_values]
        except _Unorderable:
            return None
        combinations = 1
        for values in ordered_values:
            combinations *= len(values)
        if combinations > MAX_PREFIX_COMBINATIONS:
            return None
        directions = [direction for _, direction in self.keys]
        ranges = []
        for combination in itertools.product(*ordered_values):
            prefix = tuple(_directed(v, directions[n]) for n, v in enumerate(combination))
            ranges.append(self._range(prefix))
        depth = len(prefix_values)
        bounded = _key_bounds(query, self.keys, depth)
        if bounded:
            ranges = [_within(entries, bounded) for entries in ranges]
        if len(ranges) == 1 or not sort:  # one range, or no order asked: one after another
            return depth, (entry[1][1] for entry in itertools.chain(*ranges))
        merged = heapq.merge(*ranges, key=lambda entry: (entry[0][depth:], entry[1]))
        return depth, (entry[1][1] for entry in merged)

    def _range(self, prefix: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], tuple[int, Any]]]:
        entries = self._entries
        position = bisect.bisect_left(entries, (prefix,))
        size = len(prefix)
        while position < len(entries) and entries[position][0][:size] == prefix:
            yield entries[position]
            position += 1


_COMPARISONS: dict[str, Any] = {
    "$lt": operator.lt,
    "$lte": operator.le,
    "$gt": operator.gt,
    "$gte": operator.ge,
}


def _key_bounds(
    query: Mapping[str, Any], keys: Sequence[tuple[str, int]], depth: int
) -> list[tuple[int, int, Any, Any]]:
    """Ranges on ascending key fields after the equality prefix (``next_claim_at`` of the
    claim's index), tested on the index keys as MongoDB's index bounds are: a candidate out of
    them is never read. As (position, BSON type rank, comparison, bound): a comparison
    matches only values of its bound's type, as on MongoDB (a null ``next_claim_at`` never
    matches ``$lte`` a date)."""
    bounds = []
    for position in range(depth, len(keys)):
        field, direction = keys[position]
        condition = query.get(field)
        if direction < 0 or not isinstance(condition, Mapping) or not condition:
            continue
        if not set(condition) <= _COMPARISONS.keys():
            continue
        for name, bound in condition.items():
            if bound is None or isinstance(bound, (list, tuple, dict)):
                continue
            try:
                rank, value = _ordered(bound)
            except _Unorderable:
                continue
            bounds.append((position, rank, _COMPARISONS[name], value))
    return bounds


def _within(
    entries: Iterator[tuple[tuple[Any, ...], tuple[int, Any]]],
    bounds: list[tuple[int, int, Any, Any]],
) -> Iterator[tuple[tuple[Any, ...], tuple[int, Any]]]:
    for entry in entries:
        key = entry[0]
        if all(
            key[position][0] == rank and compare(key[position][1], bound)
            for position, rank, compare, bound in bounds
        ):
            yield entry


def _id_key(document_id: Any) -> tuple[int, Any]:
    """An ``_id`` in an entry: ties of equal keys are ordered by it, as an index's are."""
    try:
        return _ordered(document_id)
    except _Unorderable:
        return (99, repr(document_id))


def _equality_values(condition: Any) -> list[Any] | None:
    """The values an equality on a field allows: ``x``, ``{"$eq": x}`` or ``{"$in": [...]}`` of
    scalars; None for anything else (a range, an operator mix, an array or a document)."""
    if condition is _MISSING:
        return None
    if isinstance(condition, Mapping):
        if set(condition) == {"$in"} and isinstance(condition["$in"], (list, tuple)):
            values = list(condition["$in"])
        elif set(condition) == {"$eq"}:
            values = [condition["$eq"]]
        else:
            return None
    else:
        values = [condition]
    if any(isinstance(v, (list, tuple, dict)) or v is None for v in values):
        return None  # null also matches a missing field; arrays match elements: mongomock's
    return list(dict.fromkeys(values))  # a value named twice is one range, walked once


class IndexSet:
    """The ordered indexes of one collection, shared by every wrapper of it."""

    def __init__(self) -> None:
        self._indexes: dict[str, OrderedIndex] = {}

    def declare(self, name: str, keys: Sequence[tuple[str, int]], documents: Any) -> None:
        if name in self._indexes or name == "_id_":
            return
        index = OrderedIndex(keys)
        for document in documents:
            index.add(document)
        self._indexes[name] = index

    def drop(self, name: str) -> None:
        self._indexes.pop(name, None)

    def changed(self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        for index in self._indexes.values():
            if before is not None and after is not None:
                index.replace(after)
                continue
            if before is not None:
                index.remove(before["_id"])
            if after is not None:
                index.add(after)

    def exact(self, query: Mapping[str, Any]) -> Iterator[Any] | None:
        """The ids of exactly the documents matching ``query``, when it is equalities (or
        ``$in``) on strings over fields an index's prefix covers: its ranges hold those and
        only those, so the filter need not be tested on each (mongomock's ``$in`` walks its
        list for every document: a read of 5,000 keys compared 25 million pairs)."""
        if not all(
            (values := _equality_values(condition)) is not None
            and all(type(value) is str for value in values)
            for condition in query.values()
        ):
            return None
        planned = self._plan(query, None)
        return planned[1] if planned is not None and planned[0] == len(query) else None

    def candidates(
        self, query: Mapping[str, Any], sort: Sequence[tuple[str, int]] | None
    ) -> Iterator[Any] | None:
        """Candidate ids in ``sort`` order from the index with the longest equality prefix
        (None: no index gives them; mongomock must scan)."""
        planned = self._plan(query, sort)
        return None if planned is None else planned[1]

    def _plan(
        self, query: Mapping[str, Any], sort: Sequence[tuple[str, int]] | None
    ) -> tuple[int, Iterator[Any]] | None:
        """The scan of the index with the longest equality prefix: (its depth, the ids)."""
        best: tuple[int, Iterator[Any]] | None = None
        for index in self._indexes.values():
            if index.unindexed:
                continue
            planned = index.scan(query, sort)
            if planned is not None and (best is None or planned[0] > best[0]):
                best = planned
        return best
