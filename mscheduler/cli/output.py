"""What read commands print: JSON that any BSON value survives (a payload of bytes, an ObjectId,
a Decimal128 or a date is shown as MongoDB's extended JSON), and rows that fit the shell: a
table on a terminal, whole tab-separated values in a pipe, so ``ls | grep`` finds a key."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..models import Task


def extended(value: Any) -> Any:
    """`encoding.extended`, imported when used (``--help`` starts without bson)."""
    from ..encoding import extended as to_extended

    return to_extended(value)


def task_json(task: Task) -> dict[str, Any]:
    """`encoding.task_json`, imported when used."""
    from ..encoding import task_json as to_json

    return to_json(task)


def emit(value: BaseModel | Sequence[Any] | dict[str, Any]) -> None:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        data: Any = value.model_dump(mode="json")
    elif isinstance(value, dict):
        data = value
    else:
        data = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    typer.echo(json.dumps(data, default=str, indent=2, ensure_ascii=False))


def to_terminal() -> bool:
    return sys.stdout.isatty()


def rows(columns: Sequence[str], values: Sequence[Sequence[str]], title: str | None = None) -> None:
    """A table on a terminal (values wrap, never cut); in a pipe, a header line and one line
    of tab-separated whole values per row (tabs and newlines inside a value become spaces)."""
    if not to_terminal():
        typer.echo("\t".join(columns))
        for row in values:
            typer.echo("\t".join(" ".join(cell.split()) for cell in row))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in values:
        table.add_row(*row)
    Console().print(table)


def when(moment: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """A time to the second, in UTC, with how long ago (or until) when ``now`` is given."""
    if moment is None:
        return ""
    text = moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    if now is None:
        return text
    seconds = (now - moment).total_seconds()
    return f"{text} ({ago(abs(seconds))} {'ago' if seconds >= 0 else 'from now'})"


def ago(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
