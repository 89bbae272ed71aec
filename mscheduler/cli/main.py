"""The ``mscheduler`` command. Every global option can also be set from ``MSCHEDULER_*``.

A user error (bad JSON, an unknown state, an unreachable server, a missing task, a bad
option value) prints one line on stderr and exits with status 2; no traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from .. import constants as c
from ..__about__ import __version__
from ..api import Scheduler
from ..errors import MSchedulerError
from ..models import Task, TaskOptions
from ..worker_options import WorkerOptions
from . import controls, dashboard, logs, schedules
from .common import Settings, fail, one_line, parse_duration, parse_json, parse_time, run
from .demo import run_demo, stats_table
from .worker import check_metrics_port, load_handlers, only, serve_worker

app = typer.Typer(
    name="mscheduler",
    help="A reliable multi-worker task scheduler on a MongoDB collection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(schedules.app, name="schedule")
controls.register(app)
dashboard.register(app)
console = Console()
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


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


def emit(value: BaseModel | list[Any] | dict[str, Any]) -> None:
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    typer.echo(json.dumps(data, default=str, indent=2))


def _tasks_table(tasks: list[Task]) -> Table:
    table = Table()
    for column in ("key", "name", "state", "priority", "attempts", "updated"):
        table.add_column(column)
    for task in tasks:
        table.add_row(
            task.key,
            task.name,
            task.state.value,
            str(task.options.priority),
            str(task.attempts),
            task.updated_at.isoformat(timespec="seconds"),
        )
    return table


# ------------------------------------------------------------------------ commands


@app.command()
def demo(ctx: typer.Context, emails: int = 24) -> None:
    """Run the main job: publish a realistic mix of tasks and let three consumers run them."""
    run(ctx, lambda sched: run_demo(sched, console, emails=emails), private="fine")


@app.command()
def publish(
    ctx: typer.Context,
    key: str,
    name: Annotated[str, typer.Option(help="The kind of task (a handler's name).")],
    payload: Annotated[str, typer.Option(help="The payload, as JSON.")] = "null",
    priority: int = 0,
    not_before: Annotated[
        str | None, typer.Option(help="ISO 8601 time with its timezone, e.g. …T09:00Z.")
    ] = None,
    delay: Annotated[str | None, typer.Option(help="Start after, e.g. 30s, 15m, 2h.")] = None,
    debounce: Annotated[
        str | None, typer.Option(help="Start after; a publish again before restarts the wait.")
    ] = None,
    expires_in: Annotated[
        str | None, typer.Option(help="Cancel it if not started within, e.g. 1h.")
    ] = None,
    depends_on: Annotated[list[str] | None, typer.Option(help="A key; repeat for more.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Publish a task (idempotent by key)."""
    body = parse_json(payload, "payload")
    if not_before and delay:
        fail("delay: give either --delay or --not-before, not both")
    when = parse_time(not_before, "not-before") if not_before else None
    wait = parse_duration(delay, "delay") if delay else None
    window = parse_duration(debounce, "debounce") if debounce else None
    lifetime = parse_duration(expires_in, "expires-in") if expires_in else None

    async def work(sched: Scheduler) -> None:
        expires = None if lifetime is None else sched.clock.now() + lifetime
        options = TaskOptions(priority=priority, not_before=when, expires_at=expires)
        result = await sched.publish(
            key,
            body,
            name=name,
            options=options,
            depends_on=depends_on,
            delay=wait,
            debounce=window,
        )
        if json_output:
            emit(result)
        else:
            said = "published" if result.created else "exists, unchanged"
            if result.payload_updated:
                said = "debounced"
            typer.echo(f"{said}: {key} ({result.task.state.value})")

    run(ctx, work)


@app.command()
def show(ctx: typer.Context, key: str, json_output: JsonFlag = False) -> None:
    """Show one task: its state, options, worker states, result and error."""

    async def work(sched: Scheduler) -> None:
        task = await sched.get(key)
        if task is None:
            fail(f"no task has the key {key!r}")
        if json_output:
            emit(task)
        else:
            console.print_json(task.model_dump_json())

    run(ctx, work)


@app.command("ls")
def list_tasks(
    ctx: typer.Context,
    name: str | None = None,
    state: str | None = None,
    limit: int = 50,
    json_output: JsonFlag = False,
) -> None:
    """List the newest tasks, optionally of one name and state."""

    async def work(sched: Scheduler) -> None:
        tasks = await sched.list_tasks(name=name, state=state, limit=limit)
        if json_output:
            emit([task.model_dump(mode="json") for task in tasks])
        else:
            console.print(_tasks_table(tasks))

    run(ctx, work)


@app.command()
def stats(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Count tasks by name and state."""

    async def work(sched: Scheduler) -> None:
        rows = await sched.stats()
        if json_output:
            emit([row.model_dump(mode="json") for row in rows])
        else:
            console.print(stats_table(rows))

    run(ctx, work)


@app.command()
def cancel(ctx: typer.Context, key: str, reason: str = "cancelled from the command line") -> None:
    """Cancel a task that has not finished; its running handlers are stopped."""

    async def work(sched: Scheduler) -> None:
        if await sched.get(key) is None:
            fail(f"no task has the key {key!r}")
        if not await sched.cancel(key, reason):
            fail(f"task {key!r} has already finished")
        typer.echo(f"cancelled: {key}")

    run(ctx, work)


@app.command()
def retry(
    ctx: typer.Context,
    key: Annotated[str | None, typer.Argument()] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Every failed task.")] = False,
    name: Annotated[str | None, typer.Option(help="With --failed: of this name only.")] = None,
) -> None:
    """Run a failed or cancelled task again, or (--failed) every failed task."""
    if (key is None) == (not failed):
        fail("give a KEY or --failed, not both")

    async def work(sched: Scheduler) -> None:
        results = [await sched.retry(key)] if key else await sched.retry_failed(name=name)
        typer.echo(f"retried {len(results)} task(s)")

    run(ctx, work)


@app.command()
def purge(
    ctx: typer.Context,
    state: Annotated[list[str] | None, typer.Option(help="Finished state; repeatable.")] = None,
    older_than: Annotated[str, typer.Option(help="e.g. 90s, 15m, 12h, 7d, 2w")] = "7d",
) -> None:
    """Delete finished tasks that ended more than --older-than ago."""
    age = parse_duration(older_than, "older-than")

    async def work(sched: Scheduler) -> None:
        deleted = await sched.purge(states=state or ["success"], older_than=age)
        typer.echo(f"deleted {deleted} task(s)")

    run(ctx, work)


@app.command()
def indexes(
    ctx: typer.Context,
    finished_ttl: Annotated[
        str | None, typer.Option(help="Expire finished tasks, e.g. 30d.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Create the indexes (idempotent) and list them."""
    ttl = parse_duration(finished_ttl, "finished-ttl") if finished_ttl else None

    async def work(sched: Scheduler) -> None:
        await sched.ensure_indexes(finished_ttl=ttl)
        info = await sched.store.index_information()
        listing = {name: [list(k) for k in spec["key"]] for name, spec in info.items()}
        if json_output:
            emit(listing)
        else:
            for name, keys in listing.items():
                typer.echo(f"{name}: {', '.join(f'{f} {d}' for f, d in keys)}")

    run(ctx, work)


@app.command()
def watch(
    ctx: typer.Context,
    name: Annotated[list[str] | None, typer.Option(help="Only these names; repeatable.")] = None,
    limit: Annotated[int, typer.Option(help="Stop after this many events (0: never).")] = 0,
    json_output: JsonFlag = False,
) -> None:
    """Print task changes as they happen (from the change stream; on a server without change
    streams, polled every second)."""

    async def work(sched: Scheduler) -> None:
        seen = 0
        async for task in sched.watch(names=name):
            if json_output:
                typer.echo(
                    json.dumps(
                        {
                            "key": task.key,
                            "name": task.name,
                            "state": task.state.value,
                            "version": task.version,
                            "progress": task.progress.model_dump(mode="json")
                            if task.progress
                            else None,
                        }
                    )
                )
            else:
                at = task.updated_at.isoformat(timespec="milliseconds")
                done = task.progress
                shown = f" {done.fraction:.0%} {done.message}".rstrip() if done else ""
                typer.echo(f"{at} {task.state.value:<9} {task.name} {task.key}{shown}")
            seen += 1
            if limit and seen >= limit:
                return

    run(ctx, work, private="refuse")


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
    poll_interval: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_POLL_INTERVAL",
            help="How often to look for tasks on a server without change streams (5s).",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            envvar="MSCHEDULER_GRACE",
            help="How long a first SIGINT/SIGTERM lets running tasks finish (30s).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a consumer until SIGINT/SIGTERM: the first lets running tasks finish within
    --grace, then releases the rest; a second cancels them and releases them at once.

    TARGET is module:attribute, imported from the current directory: a mapping of task name
    to handler (async or plain functions), an ms.Handlers registry, or an object with
    .handlers."""
    try:
        check_metrics_port(metrics_port)
        handlers = load_handlers(target)
        if names:
            handlers = only(handlers, names, target)
        if metrics_port is not None:
            from ..metrics import require_prometheus

            require_prometheus()  # fail now, with a clear line, if the extra is missing
        chosen: dict[str, Any] = {"max_running": max_running}
        if worker_id:
            chosen["worker_id"] = worker_id
        if poll_interval:
            interval = parse_duration(poll_interval, "poll-interval")
            chosen["poll_interval_ms"] = round(interval.total_seconds() * 1000)
        if grace:
            chosen["shutdown_grace_ms"] = round(
                parse_duration(grace, "grace").total_seconds() * 1000
            )
        options = WorkerOptions(**chosen)
    except (MSchedulerError, ValidationError) as exc:
        fail(one_line(exc))

    async def work(sched: Scheduler) -> None:
        await serve_worker(sched, handlers, options, metrics_port)

    run(ctx, work, private="refuse")


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)
