"""Commands that look at the whole queue: ``stats``, ``workers`` (and ``workers stop``),
``watch``, ``events``, ``indexes``."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Annotated

import typer

from .common import Commands, JsonFlag, check_database, run
from .inputs import parse_duration
from .output import ago, emit, extended, rows, when

if TYPE_CHECKING:
    from rich.table import Table

    from ..api import Scheduler
    from ..models import StatsRow, TaskEvent

_SECOND = dt.timedelta(seconds=1)


def stats_values(found: list[StatsRow]) -> list[list[str]]:
    """Rows of `stats`: a name no live worker serves is flagged where it has pending tasks;
    a paused one says why."""
    table = []
    for row in found:
        notes = []
        if row.paused:
            notes.append(f"paused: {row.pause_reason}" if row.pause_reason else "paused")
        if row.state.value == "pending" and row.count and not row.live_workers:
            notes.append("no live worker serves it")
        age = "" if row.oldest_age_s is None else ago(row.oldest_age_s)
        table.append(
            [
                row.name,
                row.state.value,
                str(row.count),
                str(row.running_workers),
                str(row.live_workers),
                age,
                "; ".join(notes),
            ]
        )
    return table


STATS_COLUMNS = ("name", "state", "count", "running", "live workers", "oldest pending", "note")


def stats_table(rows: list[StatsRow], title: str = "statistics") -> Table:
    """The table `mscheduler stats` prints on a terminal (rich loads only here)."""
    from rich.table import Table

    table = Table(title=title)
    for column in STATS_COLUMNS:
        table.add_column(column, justify="left" if column in ("name", "state", "note") else "right")
    for values in stats_values(rows):
        table.add_row(*values)
    return table


workers_app = typer.Typer(
    help="The consumers that registered (bare: list them); stop one.",
    invoke_without_command=True,
    cls=Commands,
)


@workers_app.callback()
def workers(
    ctx: typer.Context,
    name: Annotated[list[str] | None, typer.Option(help="Serving this name; repeatable.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """The consumers that registered: what each serves and runs now (read from the tasks),
    when last seen, and those found dead since when (they missed two heartbeats, or their
    leases expired unpinged). `workers stop ID` stops one."""
    if ctx.invoked_subcommand is not None:
        return

    async def work(sched: Scheduler) -> None:
        found = await sched.workers(names=name)
        if json_output:
            emit(found)
            return
        now = sched.clock.now()
        table = [
            [
                w.worker_id,
                "alive" if w.alive else "dead",
                w.host,
                str(w.pid),
                ",".join(w.names),
                f"{w.running}/{w.max_running}",
                when(w.started_at),
                when(w.last_seen_at, now),
                ",".join(w.running_keys) + (" …" if w.running > len(w.running_keys) else ""),
                f"{when(w.dead_since, now)}: {w.dead_because}" if w.dead_since else "",
            ]
            for w in found
        ]
        columns = ("worker", "status", "host", "pid", "names", "running", "started")
        rows([*columns, "last seen", "running keys", "dead since"], table)

    run(ctx, work)


@workers_app.command("stop")
def stop_worker(
    ctx: typer.Context,
    worker_id: Annotated[
        str, typer.Argument(metavar="ID", help="As `mscheduler workers` lists it.")
    ],
    now: Annotated[
        bool,
        typer.Option(
            "--now",
            help="Release its running tasks for other workers at once, instead of letting "
            "them finish within its grace period.",
        ),
    ] = False,
) -> None:
    """Ask the live worker ID to stop.

    It claims nothing more, lets its running tasks finish within its grace period (with --now
    releases them at once), then exits. A worker that is not live has stopped already: that
    is said, nothing is changed, and the command succeeds."""

    async def work(sched: Scheduler) -> None:
        from ..errors import WorkerNotLive

        try:
            told = await sched.stop_worker(worker_id, drain=not now)
        except WorkerNotLive:
            typer.echo(f"not running: {worker_id} (no live worker has this id)")
            return
        how = (
            "its running tasks are released at once"
            if now
            else "its running tasks finish first, within its grace period"
        )
        typer.echo(f"stopping: {told.worker_id} ({told.host}:{told.pid}): {how}")

    run(ctx, work)


def event_json(event: TaskEvent) -> dict[str, object]:
    """One line of `mscheduler events --json`: the event, its result as extended JSON."""
    data = event.model_dump(mode="json", exclude={"result"})
    data["result"] = extended(event.result)
    return data


def event_line(event: TaskEvent) -> str:
    """One line of `mscheduler events`: when, what, which task, which attempt, and then the
    retry and error of a failure, the fraction and message of a progress, the result."""
    at = event.at.isoformat(timespec="milliseconds")
    line = f"{at} {event.kind:<9} {event.name} {event.key}"
    if event.worker_id is not None:
        line += f" on {event.worker_id} ({event.run_id})"
    if event.kind == "failed":
        line += ": will retry" if event.will_retry else ": final"
    if event.error is not None:
        line += f": {event.error.type}: {event.error.message}"
    if event.progress is not None:
        line += f": {event.progress.fraction:.0%} {event.progress.message}".rstrip()
    if event.kind == "succeeded" and event.result is not None:
        line += f": {json.dumps(extended(event.result), ensure_ascii=False)}"
    return line


# The options `watch` and `events` share.
NamesFilter = Annotated[list[str] | None, typer.Option(help="Only these names; repeatable.")]
EventLimit = Annotated[int, typer.Option(min=0, help="Stop after this many events (0: never).")]


def register(app: typer.Typer) -> None:
    app.add_typer(workers_app, name="workers")

    @app.command()
    def stats(ctx: typer.Context, json_output: JsonFlag = False) -> None:
        """Count tasks by name and state, with the live workers serving each name."""

        async def work(sched: Scheduler) -> None:
            await check_database(sched, ctx.obj)
            found = await sched.stats()
            if json_output:
                emit(found)
            else:
                rows(STATS_COLUMNS, stats_values(found))

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
        ttl = (
            parse_duration(finished_ttl, "finished-ttl", minimum=_SECOND) if finished_ttl else None
        )

        async def work(sched: Scheduler) -> None:
            await sched.ensure_indexes(finished_ttl=ttl)
            info = await sched.index_information()
            listing = {name: [list(k) for k in spec["key"]] for name, spec in info.items()}
            if json_output:
                emit(listing)
            else:
                table = [[n, ", ".join(f"{f} {d}" for f, d in keys)] for n, keys in listing.items()]
                rows(("index", "keys"), table)

        run(ctx, work)

    @app.command()
    def watch(
        ctx: typer.Context,
        name: NamesFilter = None,
        limit: EventLimit = 0,
        json_output: JsonFlag = False,
    ) -> None:
        """Print task changes as they happen (from the change stream; on a server without
        change streams, polled every second)."""

        async def work(sched: Scheduler) -> None:
            seen = 0
            async for task in sched.watch(names=name):
                done = task.progress
                if json_output:
                    shown = {
                        "key": task.key,
                        "name": task.name,
                        "state": task.state.value,
                        "version": task.version,
                        "progress": done.model_dump(mode="json") if done else None,
                    }
                    typer.echo(json.dumps(shown))
                else:
                    at = task.updated_at.isoformat(timespec="milliseconds")
                    shown_progress = f" {done.fraction:.0%} {done.message}".rstrip() if done else ""
                    typer.echo(f"{at} {task.state.value:<9} {task.name} {task.key}{shown_progress}")
                seen += 1
                if limit and seen >= limit:
                    return

        run(ctx, work, private="refuse")

    @app.command()
    def events(
        ctx: typer.Context,
        name: NamesFilter = None,
        limit: EventLimit = 0,
        json_output: JsonFlag = False,
    ) -> None:
        """Print what happens to tasks, by any worker, as it happens: one line per event
        (published, started, progress, succeeded, failed, cancelled). From the change
        stream; on a server without change streams, polled every second (changes between
        two polls are told from the newest: see docs/guides/events.md)."""

        async def work(sched: Scheduler) -> None:
            seen = 0
            async with sched.events(names=name) as events:  # the stream held open meanwhile
                async for event in events:
                    if json_output:
                        typer.echo(json.dumps(event_json(event), default=str, ensure_ascii=False))
                    else:
                        typer.echo(event_line(event))
                    seen += 1
                    if limit and seen >= limit:
                        return

        run(ctx, work, private="refuse")
