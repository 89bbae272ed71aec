"""The ``mscheduler`` command. Every global option can also be set from ``MSCHEDULER_*``.

A user error (bad JSON, an unknown state, an unreachable server, a missing task, a bad
option value) prints one line on stderr and exits with status 2; no traceback.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .. import constants as c
from ..__about__ import __version__
from . import dashboard, limits, logs, observe, schedules, tasks
from .common import Settings, fail, one_line, run
from .inputs import parse_duration

if TYPE_CHECKING:
    from ..api import Scheduler

app = typer.Typer(
    name="mscheduler",
    help="A reliable multi-worker task scheduler on a MongoDB collection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(schedules.app, name="schedule")
limits.register(app)
dashboard.register(app)
tasks.register(app)
observe.register(app)


def entry() -> None:
    """The installed command: typer's usage errors (a bad ``--priority``, an unknown option)
    become one line and exit 2, like every other user error, instead of a boxed panel."""
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="mscheduler", standalone_mode=False)
    except Exception as exc:
        # Click's exceptions, whichever click typer uses (its own copy since 0.2x): they are
        # told apart by what they offer, not by class.
        message, context = getattr(exc, "format_message", None), getattr(exc, "ctx", None)
        if message is None:
            raise
        if type(exc).__name__ == "NoArgsIsHelpError" and context is not None:
            typer.echo(context.get_help())
            sys.exit(2)
        hint = f" (see: {context.command_path} --help)" if context is not None else ""
        typer.echo(f"error: {' '.join(str(message()).split())}{hint}", err=True)
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
            help=f"Default: the URI's database, else {c.DEFAULT_DATABASE!r}.",
            show_default=False,
        ),
    ] = None,
    collection: Annotated[str, typer.Option(envvar="MSCHEDULER_COLLECTION")] = c.DEFAULT_COLLECTION,
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
def demo(ctx: typer.Context, emails: int = 24) -> None:
    """Run the main job: publish a realistic mix of tasks and let three consumers run them."""
    from rich.console import Console

    from .demo import run_demo

    run(ctx, lambda sched: run_demo(sched, Console(), emails=emails), private="fine")


@app.command()
def worker(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="module:handlers")],
    worker_id: Annotated[str | None, typer.Option(envvar="MSCHEDULER_WORKER_ID")] = None,
    max_running: Annotated[int, typer.Option(envvar="MSCHEDULER_MAX_RUNNING")] = 16,
    names: Annotated[list[str] | None, typer.Option(help="Only these names; repeatable.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(envvar="MSCHEDULER_METRICS_PORT", help="Serve /metrics here.")
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_GRACE",
            help="How long a first SIGINT/SIGTERM lets running tasks finish before they are "
            "released (30s); a second releases them at once.",
            show_default=False,
        ),
    ] = None,
    claim_spread: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_CLAIM_SPREAD",
            help="Long tasks: share bursts with the other live workers; a busy worker lets "
            "a due task wait this long for an idle one first (above the poll interval).",
            show_default=False,
        ),
    ] = None,
    heartbeat: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_HEARTBEAT",
            help="How often to refresh this worker in `mscheduler workers` (30s).",
            show_default=False,
        ),
    ] = None,
    poll_interval: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_POLL_INTERVAL",
            help="How often to look for tasks on a server without change streams (5s).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a consumer until SIGINT/SIGTERM: the first lets running tasks finish within
    --grace, then releases the rest; a second cancels them and releases them at once.

    TARGET is module:attribute, imported from the current directory: a mapping of task name
    to handler (async or plain functions), an ms.Handlers registry, or an object with
    .handlers."""
    from pydantic import ValidationError

    from ..errors import MSchedulerError
    from ..worker_options import WorkerOptions
    from .worker import check_metrics_port, load_handlers, only, serve_worker

    try:
        check_metrics_port(metrics_port)
        chosen: dict[str, Any] = {"max_running": max_running}
        if worker_id:
            chosen["worker_id"] = worker_id
        if poll_interval:
            interval = parse_duration(
                poll_interval,
                "poll-interval",
                minimum=dt.timedelta(milliseconds=10),
                maximum=dt.timedelta(days=1),
            )
            chosen["poll_interval_ms"] = round(interval.total_seconds() * 1000)
        if grace:
            wait = parse_duration(
                grace, "grace", minimum=dt.timedelta(0), maximum=dt.timedelta(days=1)
            )
            chosen["shutdown_grace_ms"] = round(wait.total_seconds() * 1000)
        if claim_spread:
            spread = parse_duration(claim_spread, "claim-spread", maximum=dt.timedelta(days=1))
            chosen["claim_spread_ms"] = round(spread.total_seconds() * 1000)
        if heartbeat:
            beat = parse_duration(
                heartbeat,
                "heartbeat",
                minimum=dt.timedelta(milliseconds=10),
                maximum=dt.timedelta(days=1),
            )
            chosen["heartbeat_ms"] = round(beat.total_seconds() * 1000)
        options = WorkerOptions(**chosen)
        handlers = load_handlers(target)
        if names:
            handlers = only(handlers, names, target)
        if metrics_port is not None:
            from ..metrics import require_prometheus

            require_prometheus()  # fail now, with a clear line, if the extra is missing
    except (MSchedulerError, ValidationError) as exc:
        fail(one_line(exc).replace("max_running:", "max-running:"))

    async def work(sched: Scheduler) -> None:
        await serve_worker(sched, handlers, options, metrics_port)

    run(ctx, work, private="refuse")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)
