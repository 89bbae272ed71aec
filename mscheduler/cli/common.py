"""What every command shares: its settings, one-line errors (exit 2), the session on the
database, and the line that says when that database is private to the process."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:  # the library is imported when a command runs, not to print --help
    from ..api import Scheduler

log = logging.getLogger("mscheduler.cli")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
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
    private_memory: bool = False  # set by `run`, before it connects


def one_line(exc: BaseException) -> str:
    from pydantic import ValidationError

    from ..errors import field_errors

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


# A library parameter a command sets from a flag -> that flag's name, as refusals say it.
Flags = Mapping[str, str]


def flag_words(exc: BaseException, flags: Flags) -> str:
    """`one_line`, naming the flag the user typed where the library names the parameter the
    flag set (``--retries -1``: "retries: must be at least 0", not the option's field
    ``max_unexpected_retries``). The library's refusals of a parameter start with its name
    (`errors.field_errors`, a ``ConfigurationError``'s ``name: ...``): that name is replaced."""
    from pydantic import ValidationError

    from ..errors import phrase

    if isinstance(exc, ValidationError):
        said = []
        for error in exc.errors():
            where = [str(part) for part in error["loc"]]
            if where and where[0] in flags:
                where[0] = flags[where[0]]
            said.append(f"{'.'.join(where) or 'value'}: {phrase(error)}")
        return "; ".join(said)
    text = one_line(exc)
    name, colon, rest = text.partition(": ")
    return f"{flags[name]}: {rest}" if colon and name in flags else text


def whole_sentences(text: str | None) -> str | None:
    """A docstring as help: each paragraph one line, for the help to wrap at the terminal's
    width (rich help keeps a paragraph's own line breaks after the first); a paragraph that
    starts with ``\b`` keeps them, as click's convention says."""
    if not text:
        return text
    import inspect

    paragraphs = inspect.cleandoc(text).partition("\f")[0].split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _plain_help(command: Any, ctx: typer.Context) -> None:
    """``command``'s help as it is printed: its text in whole sentences, and no type beside a
    flag (``--json <bool>``): a flag takes no value (typer's plain help shows none either)."""
    command.help = whole_sentences(command.help)
    for param in [*command.params, command.get_help_option(ctx)]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


class Commands(TyperGroup):
    """A group of commands that names an unknown command in our words, prints its help and
    its commands' in whole sentences without a type beside a flag, and ends with success
    when the reader of its output went away (``mscheduler ls | head -1``)."""

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:  # type: ignore[override]
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _plain_help(command, ctx)
        return command

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:  # type: ignore[override]
        _plain_help(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        """A write to a pipe whose reader closed it is refused (``BrokenPipeError``): the
        reader has all it asked for, so the command succeeds (exit 0), like any that printed
        all it had. Its stdout then goes to /dev/null, so that the flush at exit, and any
        write still pending, cannot fail in its turn."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            import os
            import sys

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            raise typer.Exit(0) from None

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:  # type: ignore[override]
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            ctx.fail(f"{name!r} is not a command of {ctx.command_path}")
        return super().resolve_command(ctx, args)


# What a flag's value must be, by the name of its type.
_EXPECTED = {"integer": "an integer", "float": "a number", "boolean": "true or false"}


def usage_error(exc: Exception) -> str:
    """A usage error of the command line on one line, naming the flag the user typed as
    every refusal of a value does (``priority: must be an integer``, `flag_words`) and
    saying in our words what it takes; an error we have no words for keeps click's."""
    kind = type(exc).__name__
    param = getattr(exc, "param", None)
    opts = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")]
    flag = max(opts, key=len)[2:] if opts else getattr(param, "human_readable_name", None)
    if kind == "NoSuchOption":
        close = sorted(getattr(exc, "possibilities", None) or ())
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return f"{getattr(exc, 'option_name', '?')}: no such option{hint}"
    if kind == "MissingParameter" and flag:
        return f"{flag}: is required"
    if kind == "BadParameter" and flag:
        from pydantic import ValidationError

        from ..errors import phrase

        cause = exc.__cause__  # typer converts values with pydantic, older typer with click
        if isinstance(cause, ValidationError):
            return f"{flag}: " + "; ".join(phrase(error) for error in cause.errors())
        kind_of_value = getattr(param, "type", None)
        choices = getattr(kind_of_value, "choices", None)
        expected = (
            "one of " + ", ".join(str(choice) for choice in choices)
            if choices
            else _EXPECTED.get(getattr(kind_of_value, "name", ""))
        )
        if expected:
            return f"{flag}: must be {expected}"
    return " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def run(
    ctx: typer.Context,
    work: Callable[[Scheduler], Awaitable[T]],
    *,
    private: Literal["note", "refuse", "fine"] = "note",
    flags: Flags | None = None,
) -> T:
    """Run ``work`` on the database. On a private ``memory://`` one (what is published there
    vanishes with the process, and a worker there waits for ever on an empty database) a
    command says so in one line (``note``), or refuses (``refuse``: a worker, a watch, which
    only make sense on a database other processes write); the demo is ``fine`` with it. The
    note comes after the command's output, and not after an error, which stays the one line.
    ``flags``: the library parameters ``work`` sets from flags, so that a refusal of one names
    the flag (`flag_words`)."""
    import anyio
    from pydantic import ValidationError
    from pymongo.errors import PyMongoError

    from ..api import Scheduler
    from ..backends.uri import is_private_memory
    from ..errors import MSchedulerError

    settings: Settings = ctx.obj
    settings.private_memory = is_private_memory(settings.uri)
    private_memory = private != "fine" and settings.private_memory
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
        fail(flag_words(exc, flags or {}))  # one line, no note: the error is what matters
    except PyMongoError as exc:  # the server refused what the library did not foresee
        log.debug("the server's error", exc_info=exc)
        fail(f"MongoDB: {one_line(exc)} (the traceback with --log-level debug)")
    if private_memory:
        typer.echo(f"note: {PRIVATE_MEMORY}", err=True)
    return done


async def check_database(sched: Scheduler, settings: Settings) -> None:
    """A read of an empty collection nobody uses is most likely a typo in --database or
    --collection: say so in a note on stderr. The result stays what it is, an empty list
    and exit 0, so that a script reading stdout and the status gets the truth."""
    if settings.private_memory or await sched.in_use():
        return
    namespace = getattr(sched.collection, "full_name", None) or sched.collection.name
    typer.echo(
        f"note: database: {namespace} holds no task, schedule, limit, pause or worker; check "
        "--database and --collection (or MSCHEDULER_DATABASE, MSCHEDULER_COLLECTION)",
        err=True,
    )
