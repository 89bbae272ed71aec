"""What every command shares: its settings, one-line errors (exit 2), the session on the
database, and the line that says when that database is private to the process."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NoReturn, TypeVar

import anyio
import typer
from pydantic import ValidationError

from ..api import Scheduler
from ..backends.uri import is_private_memory
from ..errors import MSchedulerError, field_errors

log = logging.getLogger("mscheduler.cli")
T = TypeVar("T")

PRIVATE_MEMORY = (
    "memory:// is a database inside this process: what it holds is gone when the command "
    "exits, and no other process sees it; point --uri (or MSCHEDULER_URI) at a MongoDB "
    "server, e.g. mongodb://localhost:27017/?replicaSet=rs0"
)


@dataclasses.dataclass
class Settings:
    uri: str
    database: str | None  # None: the URI's database, else "mscheduler"
    collection: str


def one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return field_errors(exc)
    text = " ".join(str(exc).split())
    # pymongo's server selection error ends with ~600 characters of topology description:
    # the reason comes first; the whole is logged at debug level.
    short = re.split(r" \(configured timeouts|, Timeout: |, Topology Description: ", text)[0]
    if short != text:
        log.debug("%s", text)
        short += " (the full error with --log-level debug)"
    return short


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def run(
    ctx: typer.Context,
    work: Callable[[Scheduler], Awaitable[T]],
    *,
    private: Literal["note", "refuse", "fine"] = "note",
) -> T:
    """Run ``work`` on the database. On a private ``memory://`` one (issue 13 #1: a published
    task vanished with the process, a worker waited for ever on an empty database) a command
    says so in one line (``note``), or refuses (``refuse``: a worker, a watch, which only make
    sense on a database other processes write); the demo is ``fine`` with it. The note comes
    after the command's output, and not after an error, which stays the one line."""
    settings: Settings = ctx.obj
    private_memory = private != "fine" and is_private_memory(settings.uri)
    if private_memory and private == "refuse":
        fail(f"{ctx.info_name}: {PRIVATE_MEMORY}")

    async def session() -> T:
        async with await Scheduler.connect(
            settings.uri, database=settings.database, collection=settings.collection
        ) as sched:
            return await work(sched)

    try:
        done = anyio.run(session)
    except (MSchedulerError, ValidationError, ValueError, TimeoutError) as exc:
        fail(one_line(exc))  # one line, the note left out: the error is what matters
    if private_memory:
        typer.echo(f"note: {PRIVATE_MEMORY}", err=True)
    return done


def parse_duration(text: str, field: str) -> dt.timedelta:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|[smhdw])\s*", text)
    if match is None:
        fail(f"{field}: {text!r} is not a duration such as 500ms, 90s, 15m, 12h, 7d or 2w")
    unit = {
        "ms": "milliseconds",
        "s": "seconds",
        "m": "minutes",
        "h": "hours",
        "d": "days",
        "w": "weeks",
    }
    try:
        return dt.timedelta(**{unit[match[2]]: float(match[1])})
    except OverflowError:
        fail(f"{field}: {text!r} is too long a duration")


def parse_time(text: str, field: str) -> dt.datetime:
    """An ISO 8601 time with its timezone (``Z`` or ``+09:00``): a naive one is ambiguous."""
    try:
        moment = dt.datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text.strip()))
    except ValueError:
        fail(f"{field}: {text!r} is not an ISO 8601 time")
    if moment.tzinfo is None:
        fail(
            f"{field}: {text!r} has no timezone; add one (2030-01-01T09:00+09:00, or Z for "
            "UTC), or use --delay"
        )
    return moment


def parse_json(text: str, field: str) -> Any:
    """Strict JSON: NaN, Infinity and numbers too large for a double (1e999) are refused."""

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise ValueError(f"{literal} is out of range for a 64-bit float")
        return value

    try:
        return json.loads(text, parse_constant=constant, parse_float=number)
    except json.JSONDecodeError as exc:
        fail(f"{field}: not valid JSON ({exc.msg} at column {exc.colno})")
    except ValueError as exc:
        fail(f"{field}: not valid JSON ({exc})")
