"""``mscheduler limit set|ls|rm``: limits per task name across all workers."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated

import typer

from .common import Commands, run
from .inputs import parse_duration, show_duration
from .output import emit, rows

if TYPE_CHECKING:
    from ..api import Scheduler

limits = typer.Typer(
    help="Limits per task name across all workers.", no_args_is_help=True, cls=Commands
)


@limits.command("set")
def set_limit(
    ctx: typer.Context,
    name: str,
    rate: Annotated[int | None, typer.Option(help="Starts allowed per --per window.")] = None,
    per: Annotated[str | None, typer.Option(help="The window, e.g. 1m.")] = None,
    max_running: Annotated[int | None, typer.Option(help="Running at once.")] = None,
    partition_max_running: Annotated[
        int | None, typer.Option(help="Running at once in each partition of NAME.")
    ] = None,
) -> None:
    """Limit NAME: --rate 100 --per 1m, --max-running 5, --partition-max-running 1, or
    several."""
    year = dt.timedelta(days=366)
    window = parse_duration(per, "per", maximum=year) if per else None

    async def work(sched: Scheduler) -> None:
        limit = await sched.set_limit(
            name,
            rate=rate,
            per=window,
            max_running=max_running,
            partition_max_running=partition_max_running,
        )
        typer.echo(f"limited: {limit.name}")

    flags = {"max_running": "max-running", "partition_max_running": "partition-max-running"}
    run(ctx, work, flags=flags)


@limits.command("ls")
def list_limits(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The limits, and what counts against them now."""

    async def work(sched: Scheduler) -> None:
        now = sched.clock.now()
        listed, table = [], []
        for _, limit in sorted((await sched.limits()).items()):
            usage = limit.usage(now)
            starts, slots, name = usage["starts_in_window"], usage["running"], usage["name"]
            per = show_duration(dt.timedelta(milliseconds=limit.per_ms or 0))
            listed.append(usage)
            rate = f"{starts}/{limit.rate} per {per}" if limit.rate else "-"
            running = f"{slots}/{limit.max_running}" if limit.max_running else "-"
            busiest, most = usage["busiest_partition_running"], limit.partition_max_running
            per_partition = f"{busiest}/{most} (busiest)" if most else "-"
            table.append([name, rate, running, per_partition])
        if json_output:
            emit(listed)
        else:
            rows(("name", "starts", "running", "per partition"), table)

    run(ctx, work)


@limits.command("rm")
def remove_limit(ctx: typer.Context, name: str) -> None:
    """Remove the limits of NAME; one it does not have is already gone (exit 0, said)."""

    async def work(sched: Scheduler) -> None:
        removed = await sched.remove_limit(name)
        typer.echo(f"unlimited: {name}" if removed else f"was not limited: {name}")

    run(ctx, work)


def register(app: typer.Typer) -> None:
    app.add_typer(limits, name="limit")
