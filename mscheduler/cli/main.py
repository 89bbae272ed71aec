"""The ``mscheduler`` command. Every global option can also be set from ``MSCHEDULER_*``.

A user error (bad JSON, an unknown state, an unreachable server, a missing task, a bad
option value) prints one line on stderr and exits with status 2; no traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..__about__ import __version__
from ..layout import DEFAULT_COLLECTION, DEFAULT_DATABASE
from . import dashboard, limits, logs, observe, pauses, schedules, serve, tasks, worker
from .common import Commands, Settings, fail, run, usage_error

app = typer.Typer(
    name="mscheduler",
    help="A reliable multi-worker task scheduler on a MongoDB collection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Commands,
)
app.add_typer(schedules.app, name="schedule")
limits.register(app)
pauses.register(app)
dashboard.register(app)
serve.register(app)
tasks.register(app)
observe.register(app)


def entry() -> None:
    """The installed command: a usage error (a bad ``--priority``, an unknown option or
    command) becomes one line in our words and exits 2, like every other user error, instead
    of a boxed panel."""
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="mscheduler", standalone_mode=False)
    except Exception as exc:
        # Click's exceptions, whichever click typer uses (its own copy since 0.2x): they are
        # told apart by what they offer, not by class.
        context = getattr(exc, "ctx", None)
        if getattr(exc, "format_message", None) is None:
            raise
        if type(exc).__name__ == "NoArgsIsHelpError" and context is not None:
            typer.echo(context.get_help())
            sys.exit(2)
        hint = f" (see: {context.command_path} --help)" if context is not None else ""
        typer.echo(f"error: {usage_error(exc)}{hint}", err=True)
        sys.exit(int(getattr(exc, "exit_code", 2)))
    sys.exit(code if isinstance(code, int) else 0)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mscheduler {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    uri: Annotated[
        str, typer.Option(envvar="MSCHEDULER_URI", help="memory://[NAME] or mongodb://…")
    ] = "memory://",
    database: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_DATABASE",
            help=f"Default: the URI's database, else {DEFAULT_DATABASE!r}.",
            show_default=False,
        ),
    ] = None,
    collection: Annotated[str, typer.Option(envvar="MSCHEDULER_COLLECTION")] = DEFAULT_COLLECTION,
    log_level: Annotated[
        str, typer.Option(envvar="MSCHEDULER_LOG_LEVEL", help=", ".join(logs.LEVELS))
    ] = "warning",
    log_format: Annotated[
        str,
        typer.Option(envvar="MSCHEDULER_LOG_FORMAT", help="text, or json: one JSON object a line."),
    ] = "text",
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    if log_level.lower() not in logs.LEVELS:
        fail(f"log-level: {log_level!r} is not one of {', '.join(logs.LEVELS)}")
    if log_format.lower() not in logs.FORMATS:
        fail(f"log-format: {log_format!r} is not one of {', '.join(logs.FORMATS)}")
    logs.configure(log_level.lower(), log_format.lower())
    ctx.obj = Settings(uri, database, collection)


# ------------------------------------------------------------------------ commands


@app.command()
def demo(
    ctx: typer.Context,
    emails: Annotated[int, typer.Option(min=0, help="How many email tasks.")] = 24,
) -> None:
    """Run the main job: publish a realistic mix of tasks and let three consumers run them."""
    from rich.console import Console

    from .demo import run_demo

    run(ctx, lambda sched: run_demo(sched, Console(), emails=emails), private="fine")


worker.register(app)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)
