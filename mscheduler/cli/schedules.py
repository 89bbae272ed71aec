"""``mscheduler schedule add|ls|rm``: periodic tasks from the command line."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Annotated

import typer

from .common import Commands, fail, run
from .inputs import parse_duration, parse_json, read_text, show_duration
from .output import rows

if TYPE_CHECKING:
    from ..api import Scheduler
    from ..periodic import Schedule

app = typer.Typer(
    help="Periodic tasks: add, list, remove schedules.", no_args_is_help=True, cls=Commands
)


def _values(schedules: list[Schedule]) -> list[list[str]]:
    table = []
    for s in schedules:
        every = dt.timedelta(milliseconds=s.every_ms or 0)
        when = s.cron if s.cron is not None else f"every {show_duration(every)}"
        flags = [f"catch_up={s.catch_up}"]
        if s.skip_if_running:
            flags.append("skip_if_running")
        if s.jitter_ms:
            flags.append(f"jitter={show_duration(dt.timedelta(milliseconds=s.jitter_ms))}")
        next_at = s.next_at.isoformat(timespec="seconds")
        table.append([s.id, s.name, when, s.timezone, next_at, " ".join(flags)])
    return table


@app.command("add")
def add(
    ctx: typer.Context,
    schedule_id: Annotated[str, typer.Argument(metavar="ID")],
    name: Annotated[str, typer.Option(help="The task name (a handler's name).")],
    cron: Annotated[str | None, typer.Option(help="A cron expression, e.g. '0 3 * * *'.")] = None,
    every: Annotated[str | None, typer.Option(help="An interval, e.g. 30s, 15m, 2h.")] = None,
    timezone: Annotated[str, typer.Option(help="IANA timezone of the cron times.")] = "UTC",
    payload: Annotated[
        str, typer.Option(help="The tasks' payload as JSON; @FILE reads a file, - stdin.")
    ] = "null",
    skip_if_running: Annotated[
        bool, typer.Option("--skip-if-running", help="No new run while the last one runs.")
    ] = False,
    catch_up: Annotated[str, typer.Option(help="After downtime: latest, all or none.")] = "latest",
    jitter: Annotated[str | None, typer.Option(help="Delay each start by up to, e.g. 30s.")] = None,
) -> None:
    """Add a schedule, or change the one with this ID (its state is kept:
    docs/guides/schedules.md)."""
    body = parse_json(read_text(payload, "payload"), "payload")
    interval = parse_duration(every, "every") if every else None
    spread = parse_duration(jitter, "jitter", minimum=dt.timedelta(0)) if jitter else None
    if catch_up not in ("latest", "all", "none"):
        fail(f"catch-up: {catch_up!r} is not one of latest, all, none")

    async def work(sched: Scheduler) -> None:
        added = await sched.schedule(
            schedule_id,
            name=name,
            cron=cron,
            every=interval,
            timezone=timezone,
            payload=body,
            skip_if_running=skip_if_running,
            catch_up=catch_up,  # type: ignore[arg-type]
            jitter=spread,
        )
        typer.echo(f"scheduled: {added.id} (next {added.next_at.isoformat()})")

    run(ctx, work)


@app.command("ls")
def list_schedules(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the schedules and their next occurrence."""

    async def work(sched: Scheduler) -> None:
        found = await sched.schedules()
        if json_output:
            typer.echo(json.dumps([s.model_dump(mode="json", by_alias=True) for s in found]))
        else:
            columns = ("id", "name", "when", "timezone", "next", "options")
            rows(columns, _values(found))

    run(ctx, work)


@app.command("rm")
def remove(ctx: typer.Context, schedule_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Remove a schedule; the tasks it already published stay. One that does not exist is
    already gone (exit 0, said)."""

    async def work(sched: Scheduler) -> None:
        if await sched.unschedule(schedule_id):
            typer.echo(f"removed: {schedule_id}")
        else:
            typer.echo(f"no schedule to remove: {schedule_id}")

    run(ctx, work)
