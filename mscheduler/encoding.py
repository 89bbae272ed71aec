"""Checks that payloads and results can be stored, before anything is written.

MongoDB refuses a document over 16 MiB or nested deeper than 100 levels, and BSON strings are
UTF-8. Each is checked here, on the caller's value, so that a refusal names the caller's field
(``payload.items[3]``) and nothing is written; a task also keeps room for all it can still grow
by (`growth_reserve`), so no later write of the scheduler's own can be refused.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
from collections.abc import Mapping
from typing import Any

import bson
from bson import json_util
from bson.decimal128 import create_decimal128_context
from bson.errors import BSONError, InvalidDocument
from pydantic import BaseModel

from . import constants as c
from .errors import PayloadError
from .models import Task, TaskOptions, new_run_id

# Levels of the task document above a value (the document itself is level 1): ``payload`` is
# a field of the task; a worker's result is worker_states -> one state -> result.
PAYLOAD_LEVELS_ABOVE = 1
RESULT_LEVELS_ABOVE = 3


def to_storable(value: Any, field: str, levels_above: int = PAYLOAD_LEVELS_ABOVE) -> Any:
    """A pydantic model becomes its JSON-mode dump; anything else must already be BSON. Field
    names, text, nesting and self-reference are checked here, naming the path of the first
    problem; encoding is checked once, where the size is measured."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    _walk(value, field, c.MAX_NESTING_DEPTH - levels_above, set())
    return value


def _walk(value: Any, path: str, levels_left: int, containing: set[int]) -> None:
    """Depth-first, never deeper than MongoDB allows: a structure nested 5,000 deep or one that
    contains itself is refused here, not by a `RecursionError` in the encoder."""
    if isinstance(value, str):
        _check_text(value, path)
        return
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = [(f"[{index}]", item) for index, item in enumerate(value)]
    else:
        return
    if not items:
        return  # MongoDB does not count an empty object or array as a level
    if id(value) in containing:
        raise PayloadError(f"{path}: contains itself; a document cannot")
    if levels_left <= 0:
        raise PayloadError(
            f"{_shortened(path)}: nested too deep; MongoDB stores at most "
            f"{c.MAX_NESTING_DEPTH} levels of objects and arrays in a document, the task's "
            "own levels included"
        )
    containing.add(id(value))
    for name, item in items:
        if isinstance(value, Mapping):
            if isinstance(name, str):
                _check_text(name, f"{path}: field name {name!r}")
                # "$"-prefixed names are operators to MongoDB: such a field cannot be updated
                # or queried.
                if name.startswith("$"):
                    raise PayloadError(f"{path}: field name {name!r} starts with '$'")
            item_path = f"{path}.{name}"
        else:
            item_path = f"{path}{name}"
        _walk(item, item_path, levels_left - 1, containing)
    containing.discard(id(value))


def _shortened(path: str) -> str:
    return path if len(path) <= 100 else f"{path[:60]}...{path[-30:]}"


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(
            f"{path}: not valid UTF-8 text (BSON's): a lone surrogate "
            f"{text[exc.start]!r} at position {exc.start}"
        ) from None


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


@functools.cache
def _worker_state_bytes() -> int:
    """The largest worker state without its error and result: the longest worker id, in
    four-byte characters."""
    now = dt.datetime(2000, 1, 1)
    state = {
        "worker_id": "\U0001f600" * c.MAX_WORKER_ID_LENGTH,
        "run_id": new_run_id(),
        "state": "released",
        "started_at": now,
        "ping_expire_at": now,
        "pinged_at": now,
        "finished_at": now,
        "error": None,
        "result": None,
        "run": 2**31 - 1,  # an earlier run's attempt carries its run's number
    }
    return len(bson.encode({"0": state}))


def result_limit(options: TaskOptions) -> int:
    """Bytes one success's result may take: each of ``concurrent_worker_cnt`` successes stores
    its own, and the task's ``result`` copies the latest, all within RESULTS_BYTES."""
    return min(c.MAX_RESULT_BYTES, c.RESULTS_BYTES // (options.concurrent_worker_cnt + 1))


def growth_reserve(options: TaskOptions) -> int:
    """Bytes a task may still grow by after publish, whatever happens to it: at most
    ``concurrent_worker_cnt`` running or succeeded states, the last KEPT_FINISHED_STATES
    others and the one that just ended (see `queries.stages.trim_history`), their errors,
    the task's own error and the results (`result_limit`), plus the fields writes add; and
    the earlier runs' last KEPT_EARLIER_ATTEMPTS attempts, with their errors and without
    results, that a retry or a ``replace_finished`` publish carries over (`queries.history`)."""
    states = options.concurrent_worker_cnt + c.KEPT_FINISHED_STATES + 1 + c.KEPT_EARLIER_ATTEMPTS
    errors = c.KEPT_FINISHED_STATES + 2 + c.KEPT_EARLIER_ATTEMPTS
    results = (options.concurrent_worker_cnt + 1) * result_limit(options)
    return states * _worker_state_bytes() + errors * c.MAX_ERROR_BYTES + results + 1024


def check_document_size(
    document: Mapping[str, Any], options: TaskOptions, field: str = "payload"
) -> None:
    """``field``: what the caller changed (the payload of a new task, a debounced payload, late
    dependency edges), named in the error. ``options``: the task's own, whose reserve it keeps."""
    size = len(_encode(document, field, document.get(field)))
    budget = c.MAX_DOCUMENT_BYTES - growth_reserve(options)
    if size > budget:
        raise PayloadError(
            f"{field}: the task document would be {size} bytes; with room kept for results "
            f"and errors the limit is {budget} bytes (MongoDB's maximum is "
            f"{c.MAX_DOCUMENT_BYTES})"
        )


def check_result(result: Any, options: TaskOptions) -> Any:
    """What a handler returned, as it will be stored; any way it cannot be is a `PayloadError`
    (the task's failure), never another exception that would reach the consumer: a model
    whose dump raises, an object whose own methods raise while it is walked."""
    try:
        result = to_storable(result, "result", RESULT_LEVELS_ABOVE)
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
    limit = result_limit(options)
    if size > limit:
        raise PayloadError(
            f"result: {size} bytes encoded; the limit is {limit} bytes"
            + (
                f" (results of {options.concurrent_worker_cnt} workers share "
                f"{c.RESULTS_BYTES} bytes)"
                if limit < c.MAX_RESULT_BYTES
                else ""
            )
        )
    return result


def extended(value: Any) -> Any:
    """``value`` as JSON-ready data: plain JSON as is, any other BSON value as relaxed
    extended JSON (``{"$binary": ...}``, ``{"$oid": ...}``, ``{"$date": ...}``)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.loads(json_util.dumps(value, json_options=json_util.RELAXED_JSON_OPTIONS))


# Extended JSON read as input: canonical and relaxed alike; a date is an aware UTC datetime.
_EXTENDED_INPUT = json_util.JSONOptions(tz_aware=True, tzinfo=dt.timezone.utc)
# What a Decimal128 holds (its digits and exponents), as the refusal of one says.
_DECIMAL128 = create_decimal128_context()


def from_extended(value: Any, field: str) -> Any:
    """The inverse of `extended`: JSON data in which MongoDB's extended JSON, canonical or
    relaxed (``{"$binary": ...}``, ``{"$date": ...}``, ``{"$oid": ...}``,
    ``{"$numberLong": ...}``), names BSON values, with those values; so what `task_json`
    prints can be published back. An object whose ``$`` field is no extended JSON type is
    left as it is, for `to_storable` to refuse naming its path; one that names a type but
    is malformed (``{"$oid": "zz"}``) is a `PayloadError` naming ``field``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    try:
        return json_util.loads(json.dumps(value), json_options=_EXTENDED_INPUT)
    except decimal.DecimalException as exc:  # not text Decimal128 holds exactly
        raise PayloadError(
            f"{field}: not valid extended JSON: a $numberDecimal must be a decimal number of "
            f"at most {_DECIMAL128.prec} significant digits, exponent {_DECIMAL128.Emin} to "
            f"{_DECIMAL128.Emax} (or NaN, Infinity, -Infinity)"
        ) from exc
    except (BSONError, ValueError, TypeError, KeyError, OverflowError) as exc:
        said = " ".join(str(exc).split())
        raise PayloadError(
            f"{field}: not valid extended JSON ({type(exc).__name__}: {said[:160]})"
        ) from exc


def task_json(task: Task) -> dict[str, Any]:
    """The task as `Task.model_dump` gives it in JSON mode (times as ISO 8601 strings), with
    its payload and results, which may hold any BSON value, as extended JSON: what the CLI's
    ``--json`` and the HTTP API return."""
    data = task.model_dump(mode="json", exclude={"payload", "result", "worker_states"})
    data["payload"] = extended(task.payload)
    data["result"] = extended(task.result)
    data["worker_states"] = [
        {**ws.model_dump(mode="json", exclude={"result"}), "result": extended(ws.result)}
        for ws in task.worker_states
    ]
    return {name: data[name] for name in type(task).model_fields if name in data}
