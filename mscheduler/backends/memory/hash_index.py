"""A single-field index of the memory backend, kept as a hash of its values: MongoDB's
multikey indexes (``worker_states.run_id``, ``depends_on``) and the unique ``key``, for the
equality and ``$in`` reads the store makes on them (see `ordered_index.IndexSet`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bson import ObjectId

MISSING = object()  # a field the document (or the query) does not have
_HASHED = (str, int, ObjectId)  # scalars whose equality is their hash's, here as in BSON


def _leaves(value: Any, path: Sequence[str]) -> Iterator[Any]:
    """The values at ``path``, through arrays on the way and at the end (multikey)."""
    if isinstance(value, (list, tuple)):
        for element in value:
            yield from _leaves(element, path)
        return
    if not path:
        yield value
    elif isinstance(value, Mapping) and path[0] in value:
        yield from _leaves(value[path[0]], path[1:])


class HashIndex:
    """A single-field index as a hash from each value (each element of an array) to the ids
    holding it. Equality and ``$in`` of strings, numbers and ObjectIds only: the candidates
    are every document that holds such a value, which is exactly those that match."""

    def __init__(self, field: str) -> None:
        self.field = field
        self._path = field.split(".")
        self._ids: dict[Any, Any] = {}  # value -> an _id, or a set of them when several
        self._values_of: dict[Any, tuple[Any, ...]] = {}  # _id -> its values, when any

    def _values(self, document: Mapping[str, Any]) -> tuple[Any, ...]:
        # The first part of the path read directly: a top-level scalar (a task's key) needs no
        # walk, and neither does an empty array on the way (a new task's ``depends_on`` and
        # ``worker_states``: no value).
        value = document.get(self._path[0], MISSING)
        if value is MISSING or (type(value) is list and not value):
            return ()
        if len(self._path) == 1 and type(value) in _HASHED:
            return (value,)
        leaves = _leaves(document, self._path)
        return tuple(dict.fromkeys(v for v in leaves if type(v) in _HASHED))

    def add(self, document: Mapping[str, Any], _id_key: object = None) -> None:
        document_id = document["_id"]
        values = self._values(document)
        if not values:
            return
        self._values_of[document_id] = values
        ids = self._ids
        for value in values:
            held = ids.get(value, MISSING)
            if held is MISSING:
                ids[value] = document_id
            elif type(held) is _IdSet:
                held.add(document_id)
            elif held != document_id:
                ids[value] = _IdSet((held, document_id))

    def remove(self, document: Mapping[str, Any], _id_key: object = None) -> None:
        document_id = document["_id"]
        ids = self._ids
        for value in self._values_of.pop(document_id, ()):
            held = ids.get(value, MISSING)
            if type(held) is _IdSet:
                held.discard(document_id)
                if len(held) == 1:
                    ids[value] = next(iter(held))
            elif held is not MISSING and held == document_id:
                del ids[value]

    def replace(
        self, before: Mapping[str, Any], after: Mapping[str, Any], _id_key: object = None
    ) -> None:
        if self._values_of.get(after["_id"], ()) == self._values(after):
            return
        self.remove(after)
        self.add(after)

    def holds(self, value: Any) -> bool | None:
        if type(value) not in _HASHED:
            return None
        return value in self._ids

    def scan(
        self, query: Mapping[str, Any], sort: Sequence[tuple[str, int]] | None
    ) -> tuple[int, Iterator[Any]] | None:
        if sort:
            return None
        values = equality_values(query.get(self.field, MISSING))
        if values is None or not all(type(value) in _HASHED for value in values):
            return None
        found: dict[Any, None] = {}
        for value in values:
            held = self._ids.get(value, MISSING)
            if type(held) is _IdSet:
                found.update(dict.fromkeys(held))
            elif held is not MISSING:
                found[held] = None
        return 1, iter(list(found))


class _IdSet(set[Any]):
    """The ids holding one value of a `HashIndex`, when more than one does."""


def equality_values(condition: Any) -> list[Any] | None:
    """The values an equality on a field allows: ``x``, ``{"$eq": x}`` or ``{"$in": [...]}`` of
    scalars; None for anything else (a range, an operator mix, an array or a document)."""
    if condition is MISSING:
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
