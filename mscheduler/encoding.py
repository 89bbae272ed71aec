"""Checks that payloads and results can be stored, before anything is written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson.errors import InvalidDocument
from pydantic import BaseModel

from . import constants as c
from .errors import PayloadError
from .models import TaskOptions


def to_storable(value: Any, field: str) -> Any:
    """A pydantic model becomes its JSON-mode dump; anything else must already be BSON. Field
    names are checked here; encoding is checked once, where the size is measured."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    _check_field_names(value, field)
    return value


def _encode(document: Mapping[str, Any], field: str, value: Any) -> bytes:
    """``document`` as BSON; what BSON cannot hold is a `PayloadError` naming ``field``."""
    try:
        return bson.encode(document)
    except (InvalidDocument, TypeError, OverflowError) as exc:
        raise PayloadError(
            f"{field}: cannot be stored as BSON ({type(value).__name__}): {exc}"
        ) from exc


def encoded_size(value: Any, field: str) -> int:
    return len(_encode({field: value}, field, value))


def _check_field_names(value: Any, path: str) -> None:
    # "$"-prefixed names are operators to MongoDB: such a field cannot be updated or queried.
    if isinstance(value, Mapping):
        for name, item in value.items():
            if isinstance(name, str) and name.startswith("$"):
                raise PayloadError(f"{path}: field name {name!r} starts with '$'")
            _check_field_names(item, f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_field_names(item, f"{path}[{index}]")


def growth_reserve(options: TaskOptions) -> int:
    """Bytes a task may still grow by after publish: results of its successes, errors of its
    failures (each bounded). Publish refuses a document that would not leave this room."""
    successes = options.concurrent_worker_cnt
    failures = options.max_unexpected_retries + 1
    return 2 * successes * c.MAX_RESULT_BYTES + (successes + failures) * c.MAX_ERROR_BYTES


def check_document_size(document: Mapping[str, Any], options: TaskOptions) -> None:
    # The payload is the only value in a new task that comes from the caller.
    size = len(_encode(document, "payload", document["payload"]))
    budget = c.MAX_DOCUMENT_BYTES - growth_reserve(options)
    if size > budget:
        raise PayloadError(
            f"payload: the task document would be {size} bytes; with room kept for results "
            f"and errors the limit is {budget} bytes (MongoDB's maximum is "
            f"{c.MAX_DOCUMENT_BYTES})"
        )


def check_result(result: Any) -> Any:
    """What a handler returned, as it will be stored; any way it cannot be is a `PayloadError`
    (the task's failure), never another exception that would reach the consumer: a model
    whose dump raises, a structure nested past the recursion limit, an object whose own
    methods raise while it is walked."""
    try:
        result = to_storable(result, "result")
        size = encoded_size(result, "result")
    except PayloadError:
        raise
    except Exception as exc:  # whatever the handler's object raises
        try:
            said = str(exc)[:200]
        except Exception:
            said = "(its message cannot be read)"
        raise PayloadError(
            f"result: cannot be stored ({type(result).__name__}): {type(exc).__name__}: {said}"
        ) from exc
    if size > c.MAX_RESULT_BYTES:
        raise PayloadError(f"result: {size} bytes encoded; the limit is {c.MAX_RESULT_BYTES} bytes")
    return result
