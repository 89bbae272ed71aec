"""The size a stored document may have, which mongomock does not check: MongoDB refuses over
16 MiB of BSON and over 100 levels of nesting. The memory backend checks every document it is
about to keep, so a test sees the refusal a server would give (unchecked, a task could grow
past 16 MiB with no error here, where a server would have refused the write and left the task
stuck).

The server refuses an insert of a document over the limit (the driver, before sending it) and
an update whose result would be over it (code 17419); nothing is written either way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import bson
from bson import ObjectId
from pymongo.errors import DocumentTooLarge, WriteError

from ... import constants as c

UPDATE_TOO_LARGE = 17419  # "Resulting document after update is larger than ..."
OVERFLOW = 15  # the server's code for a document nested too deep


def refuse_insert(document: Mapping[str, Any]) -> None:
    size = len(bson.encode(document))
    if size > c.MAX_DOCUMENT_BYTES:
        raise DocumentTooLarge(
            f"BSON document too large ({size} bytes) - the connected server supports BSON "
            f"document sizes up to {c.MAX_DOCUMENT_BYTES} bytes."
        )
    _refuse_depth(document)


def refuse_update(document: Mapping[str, Any]) -> None:
    size = len(bson.encode(document))
    if size > c.MAX_DOCUMENT_BYTES:
        raise WriteError(
            f"Resulting document after update is larger than {c.MAX_DOCUMENT_BYTES}",
            UPDATE_TOO_LARGE,
        )
    _refuse_depth(document)


def _refuse_depth(document: Mapping[str, Any]) -> None:
    if _depth(document) > c.MAX_NESTING_DEPTH:
        raise WriteError(
            f"cannot store a document nested more than {c.MAX_NESTING_DEPTH} levels deep",
            OVERFLOW,
        )


def _depth(value: Any) -> int:
    """Levels of non-empty objects and arrays, the document itself the first (an empty one
    does not count, as on the server). Iterative: a deep document must not overflow the
    Python stack here either. Only containers are pushed: a task is mostly scalars."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if type(item) is dict or isinstance(item, Mapping) else item
        if not children:
            continue
        deepest = max(deepest, level)
        for child in children:
            kind = type(child)
            if kind in _SCALARS:
                continue
            if kind is dict or kind is list or isinstance(child, (Mapping, list, tuple)):
                stack.append((child, level + 1))
    return deepest


_SCALARS = frozenset({str, int, float, bool, type(None), bytes, dt.datetime, ObjectId})
