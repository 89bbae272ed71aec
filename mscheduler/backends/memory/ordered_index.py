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
- a single-field index is kept as a hash of its values (`HashIndex`), arrays element by
  element, as MongoDB's multikey indexes are (``worker_states.run_id``, ``depends_on``): it
  answers equality and ``$in`` of scalars, never an order;
- in a compound index, a document whose indexed field holds an array, a document or a value
  whose order against the others is not BSON's here (see `_ordered`) is not indexed: a query
  that could match it goes to mongomock.

`IndexSet.examined` counts the documents each query tested against its filter, as
``explain``'s ``totalDocsExamined`` does: the candidates an index scan fetched, or the whole
collection when none applied (`server`, `indexed`).
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

from .hash_index import MISSING, HashIndex, equality_values

MAX_PREFIX_COMBINATIONS = 10_000  # $in values multiplied out over the prefix fields
_NOTHING = object()  # no value seen yet


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
    if value is None or value is MISSING:
        return (0, 0)
    if isinstance(value, bool):
        return (8, value)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, ObjectId):  # ordered by its bytes, compared in C
        return _object_id_part(value)
    if isinstance(value, dt.datetime):  # naive UTC, as BSON stores it
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return (9, value)
    raise _Unorderable


def _field(document: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at a path (a dotted one, split); an array on the way (or at the end) makes
    the document multikey for this index, which is not kept in order here."""
    value: Any = document
    for part in path:
        if isinstance(value, (list, tuple)):
            raise _Unorderable
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


_PLAIN_KEYS = {str: 2, int: 1, float: 1, dt.datetime: 9}  # exact types: their rank
# Types whose equal values of the same type make equal keys (1 == 1.0 == True do not: each
# has its own rank; an array or a document may hold such values).
_SCALAR_KEYS = frozenset({str, int, float, bool, type(None), dt.datetime, ObjectId})


def _same(before: Any, after: Any) -> bool:
    if before is after:
        return True
    kind = type(before)
    return kind is type(after) and kind in _SCALAR_KEYS and before == after


class OrderedIndex:
    """One declared index: a sorted list of (key tuple, _id) over the indexable documents."""

    def __init__(self, keys: Sequence[tuple[str, int]]) -> None:
        self.keys = list(keys)
        self.fields = [field for field, _ in self.keys]
        self._paths = [(field.split("."), direction) for field, direction in self.keys]
        # No map from each _id to its key (a dict entry per document and index): a write
        # gives the document as it was (`IndexSet.changed`), whose key is that of its entry.
        self._entries: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
        self.unindexed: set[Any] = set()  # ids of documents this index cannot order
        # The parts of the latest key made, and that key: the next document's equal parts
        # (its name, state, priority; a batch's shared times) and equal key are these very
        # objects, not copies (a key part is 56 bytes, and a task is in several indexes).
        self._latest_parts: list[Any] = [None] * len(self.keys)
        # The values those parts were made of: the very same object again (a batch's name,
        # state and dates) is that part, with no test of its type and no new tuple. Only
        # values that made a part are kept, never an array or a document (those raise).
        self._latest_values: list[Any] = [_NOTHING] * len(self.keys)
        self._latest_key: tuple[Any, ...] = ()
        # Top-level fields only: a write that leaves each of them as it was (`_same`) leaves
        # the entry where it is, and its key need not be made again.
        self._top_level = all(len(path) == 1 for path, _ in self._paths)

    def keeps_place(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
        """Whether a write from ``before`` to ``after`` (one document) leaves this index as
        it was: every field of its key the same value of the same type."""
        return self._top_level and all(
            _same(before.get(field, MISSING), after.get(field, MISSING)) for field in self.fields
        )

    def _key(self, document: Mapping[str, Any]) -> tuple[Any, ...]:
        parts: list[Any] = []
        latest = self._latest_parts
        seen = self._latest_values
        for position, (path, direction) in enumerate(self._paths):
            # A top-level field needs no walk.
            value = document.get(path[0], MISSING) if len(path) == 1 else _field(document, path)
            if value is seen[position]:
                parts.append(latest[position])
                continue
            rank = _PLAIN_KEYS.get(type(value))
            if rank is not None and direction > 0 and (rank != 9 or value.tzinfo is None):
                part = (rank, value)  # the common case, without `_ordered`'s tests
            elif isinstance(value, (list, tuple, dict)):
                raise _Unorderable
            else:
                part = _directed(_ordered(value), direction)
            if part == latest[position]:
                part = latest[position]
            else:
                latest[position] = part
            seen[position] = value
            parts.append(part)
        key = tuple(parts)
        if key == self._latest_key:
            return self._latest_key
        self._latest_key = key
        return key

    def remove(self, document: Mapping[str, Any], id_key: tuple[Any, ...] | None = None) -> None:
        """``document``: as it was when last indexed (its entry is found by its key)."""
        document_id = document["_id"]
        if document_id in self.unindexed:
            self.unindexed.discard(document_id)
            return
        id_key = id_key or _id_key(document_id)
        entries = self._entries
        try:
            entry = (self._key(document), id_key)
        except _Unorderable:
            pass
        else:
            position = bisect.bisect_left(entries, entry)
            if position < len(entries) and entries[position] == entry:
                del entries[position]
                return
        # Not where its key says (not as it was indexed): found by its _id, whatever it costs.
        for position, (_, held) in enumerate(entries):
            if held == id_key:
                del entries[position]
                return

    def replace(
        self,
        before: Mapping[str, Any],
        after: Mapping[str, Any],
        id_key: tuple[Any, ...] | None = None,
    ) -> None:
        """A document written again: moved only if its key changed (most writes change no
        field of most indexes)."""
        try:
            if before["_id"] not in self.unindexed and self._key(before) == self._key(after):
                return
        except _Unorderable:
            pass
        self.remove(before, id_key)
        self.add(after, id_key)

    def add(self, document: Mapping[str, Any], id_key: tuple[Any, ...] | None = None) -> None:
        """``id_key``: the document's `_id_key`, made once for all the indexes of a write."""
        document_id = document["_id"]
        try:
            key = self._key(document)
        except _Unorderable:
            self.unindexed.add(document_id)
            return
        bisect.insort(self._entries, (key, id_key or _id_key(document_id)))

    def scan(
        self, query: Mapping[str, Any], sort: Sequence[tuple[str, int]] | None
    ) -> tuple[int, Iterator[Any]] | None:
        """The ids of the candidates for ``query``, in the order of ``sort``; None when this
        index cannot give that (the caller tries another, or mongomock)."""
        prefix_values: list[list[Any]] = []
        for field in self.fields:
            values = equality_values(query.get(field, MISSING))
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
        depth = len(prefix_values)
        bounded = _key_bounds(query, self.keys, depth)
        # Bounds on the key right after the prefix narrow the walk itself (the server's index
        # bounds): it starts at the bound's type and stops past an upper bound.
        adjacent = [bound for bound in bounded if bound[0] == depth]
        ranges = []
        for combination in itertools.product(*ordered_values):
            prefix = tuple(_directed(v, directions[n]) for n, v in enumerate(combination))
            ranges.append(self._range(prefix, adjacent))
        if bounded:
            ranges = [_within(entries, bounded) for entries in ranges]
        # Ranked by the keys it seeks on: an index whose bounds apply beats one as deep without.
        rank = depth + len({position for position, *_ in bounded})
        if len(ranges) == 1 or not sort:  # one range, or no order asked: one after another
            return rank, (_entry_id(entry[1]) for entry in itertools.chain(*ranges))
        merged = heapq.merge(*ranges, key=lambda entry: (entry[0][depth:], entry[1]))
        return rank, (_entry_id(entry[1]) for entry in merged)

    def _range(
        self, prefix: tuple[Any, ...], adjacent: Sequence[tuple[int, int, Any, Any]] = ()
    ) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        entries = self._entries
        size = len(prefix)
        rank = adjacent[0][1] if adjacent else None
        if any(bound[1] != rank for bound in adjacent):
            return  # bounds of two types: nothing is within both
        # A comparison matches only values of its bound's type: the walk starts at that type.
        start = prefix if rank is None else (*prefix, (rank,))
        uppers = [(compare, value) for _, _, compare, value in adjacent if compare in _UPPER]
        position = bisect.bisect_left(entries, (start,))
        while position < len(entries) and entries[position][0][:size] == prefix:
            if rank is not None:
                part = entries[position][0][size]
                if part[0] != rank or not all(compare(part[1], v) for compare, v in uppers):
                    return  # ascending: every later key is past the bound too
            yield entries[position]
            position += 1


_COMPARISONS: dict[str, Any] = {
    "$lt": operator.lt,
    "$lte": operator.le,
    "$gt": operator.gt,
    "$gte": operator.ge,
}


_UPPER = (operator.lt, operator.le)
_TYPE_RANKS = {"date": 9, "string": 2, "objectId": 7, "bool": 8}


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
        comparisons = {name: bound for name, bound in condition.items() if name != "$type"}
        if not comparisons or not set(comparisons) <= _COMPARISONS.keys():
            continue
        if "$type" in condition:  # {"$type": "date", "$lte": now}: the bound's type already
            rank = _TYPE_RANKS.get(condition["$type"])  # restricts it; anything else: no bound
            if rank is None or any(_rank_or_none(bound) != rank for bound in comparisons.values()):
                continue
        for name, bound in comparisons.items():
            if bound is None or isinstance(bound, (list, tuple, dict)):
                continue
            try:
                rank, value = _ordered(bound)
            except _Unorderable:
                continue
            bounds.append((position, rank, _COMPARISONS[name], value))
    return bounds


def _rank_or_none(value: Any) -> int | None:
    try:
        return _ordered(value)[0]
    except _Unorderable:
        return None


def _within(
    entries: Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]],
    bounds: list[tuple[int, int, Any, Any]],
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    for entry in entries:
        key = entry[0]
        if all(
            key[position][0] == rank and compare(key[position][1], bound)
            for position, rank, compare, bound in bounds
        ):
            yield entry


def _id_key(document_id: Any) -> tuple[Any, ...]:
    """An ``_id`` in an entry, the id itself last: ties of equal keys are ordered by it, as an
    index's are (a batch published at once shares every other key)."""
    if type(document_id) is ObjectId:
        # The usual _id, as its bytes alone: an entry of strings, numbers, dates and bytes is
        # one the garbage collector stops tracking, where an ObjectId in it (an object with
        # slots) would have each full collection walk every entry of every index.
        return _object_id_part(document_id)
    try:
        return (*_ordered(document_id), document_id)
    except _Unorderable:
        return (99, repr(document_id), document_id)


def _object_id_part(value: ObjectId) -> tuple[int, bytes]:
    """An ObjectId's place in the order; the one of the latest ObjectId is that very tuple
    (a write's _id is its entries' tie-breaker and a key part of the indexes that hold it)."""
    global _latest_object_id
    if _latest_object_id[0] is value:
        return _latest_object_id[1]
    part = (7, value.binary)
    _latest_object_id = (value, part)
    return part


_latest_object_id: tuple[Any, tuple[int, bytes]] = (None, (7, b""))


def _entry_id(id_key: tuple[Any, ...]) -> Any:
    """The ``_id`` of an entry's `_id_key`."""
    return ObjectId(id_key[1]) if len(id_key) == 2 else id_key[-1]


class IndexSet:
    """The indexes of one collection, shared by every wrapper of it, and the documents its
    queries examined."""

    def __init__(self) -> None:
        self._indexes: dict[str, OrderedIndex | HashIndex] = {}
        self.examined = 0

    def declare(self, name: str, keys: Sequence[tuple[str, int]], documents: Any) -> None:
        if name in self._indexes or name == "_id_":
            return
        index: OrderedIndex | HashIndex
        index = HashIndex(keys[0][0]) if len(keys) == 1 else OrderedIndex(keys)
        for document in documents:
            index.add(document)
        self._indexes[name] = index

    def holds(self, field: str, value: Any) -> bool | None:
        """Whether a document holds ``value`` in ``field`` (None: no hash index of that field
        can tell, or the value is not one it keeps)."""
        for index in self._indexes.values():
            if isinstance(index, HashIndex) and index.field == field:
                return index.holds(value)
        return None

    def drop(self, name: str) -> None:
        self._indexes.pop(name, None)

    def changed(self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        written = after if after is not None else before
        id_key = None if written is None else _id_key(written["_id"])  # shared by the entries
        for index in self._indexes.values():
            if before is not None and after is not None:
                if isinstance(index, OrderedIndex) and index.keeps_place(before, after):
                    continue
                index.replace(before, after, id_key)
                continue
            if before is not None:
                index.remove(before, id_key)
            if after is not None:
                index.add(after, id_key)

    def exact(self, query: Mapping[str, Any]) -> Iterator[Any] | None:
        """The ids of exactly the documents matching ``query``, when it is equalities (or
        ``$in``) on strings over fields an index's prefix covers: its ranges hold those and
        only those, so the filter need not be tested on each (mongomock's ``$in`` walks its
        list for every document: a read of 5,000 keys compared 25 million pairs)."""
        if not all(
            (values := equality_values(condition)) is not None
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
            if isinstance(index, OrderedIndex) and index.unindexed:
                continue
            planned = index.scan(query, sort)
            if planned is not None and (best is None or planned[0] > best[0]):
                best = planned
        return best
