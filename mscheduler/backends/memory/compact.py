"""Stored documents in less memory: a document the memory backend keeps is a dict whose table of
keys is shared with every other stored document of the same fields in the same order.

A task's document is a dict of a couple of dozen fields and an ``options`` dict of a dozen, and
a backlog holds as many of each as it has tasks: most of a pending task's memory is those two
dicts' tables of keys and hashes, the same for every task. CPython keeps the attributes of the
instances of one class in a *key-sharing* dict (PEP 412): one table of keys for the class, and
per instance only its values. A document whose items are set as the attributes of an instance
of a class of its own shape, and then taken as that instance's ``__dict__``, is such a dict: a
plain `dict` (``type(d) is dict``), equal, ordered, read and written as any other, at about a
third of the memory. Whatever a write does to it stays correct: a field added beyond what the
shared table can hold, or a rewrite in another order, turns it into an ordinary dict (CPython
does that by itself); an interpreter without key-sharing gives an ordinary dict from the start.

Nothing here changes a value or the order of the fields: the stored document is the same
document, in another layout.
"""

from __future__ import annotations

from typing import Any

MAX_SHAPES = 64  # distinct field lists given a class of their own (a collection has a few)
_MAX_FIELDS = 30  # CPython shares at most this many keys per class

_shapes: dict[tuple[str, ...], type] = {}


def compact(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (its top level, and ``options`` when it is a dict) in a key-sharing dict;
    returned as it is when its fields cannot be attributes (not strings, or a name Python gives
    a meaning to) or there are too many shapes already."""
    options = document.get("options")
    if type(options) is dict:
        shared = _shared(options)
        if shared is not options:
            document = {**document, "options": shared}
    return _shared(document)


def _shared(document: dict[str, Any]) -> dict[str, Any]:
    fields = tuple(document)
    holder = _shapes.get(fields)
    if holder is None:
        if (
            len(_shapes) >= MAX_SHAPES
            or not 0 < len(fields) <= _MAX_FIELDS
            or not all(type(field) is str and not field.startswith("__") for field in fields)
        ):
            return document
        holder = _shapes[fields] = type("StoredDocument", (), {})
    instance = holder()
    for field, value in document.items():
        setattr(instance, field, value)
    shared: dict[str, Any] = instance.__dict__
    return shared
