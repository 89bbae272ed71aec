"""The commands on tasks: ``publish`` (one, or many from JSON lines), ``show``, ``ls``,
``cancel``, ``retry``, ``purge``. The library is imported inside each command, so printing
``--help`` or a usage error does not wait for pymongo and pydantic to load."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import JsonFlag, check_database, fail, run
from .inputs import parse_duration, parse_json, parse_time, read_text
from .output import emit, rows, task_json, when

if TYPE_CHECKING:
    from ..api import Scheduler

_BULK_CHUNK = 500  # tasks per publish_many call: one read and one bulk write each
# The options `publish` sets from its flags, named as the flags in its refusals.
PUBLISH_FLAGS = {
    "max_unexpected_retries": "retries",
    "concurrent_worker_cnt": "concurrency",
    "timeout_ms": "timeout",
    "not_before": "not-before",
    "expires_at": "expires-in",
    "depends_on": "depends-on",
    "replace_finished": "replace-finished",
}


async def warn_if_unserved(sched: Scheduler, names: list[str]) -> None:
    """A task of a name no live worker serves waits until one starts: say so, once."""
    served = {n for w in await sched.workers(names=names) if w.alive for n in w.names}
    for name in sorted(set(names) - served):
        typer.echo(
            f"warning: no live worker serves {name!r}: its tasks wait until one starts "
            "(`mscheduler workers` lists them)",
            err=True,
        )


def register(app: typer.Typer) -> None:
    @app.command()
    def publish(
        ctx: typer.Context,
        key: str,
        name: Annotated[str, typer.Option(help="The kind of task (a handler's name).")],
        payload: Annotated[
            str, typer.Option(help="The payload as JSON; @FILE reads a file, - reads stdin.")
        ] = "null",
        priority: Annotated[int, typer.Option(help="Higher is claimed first.")] = 0,
        partition: Annotated[
            str | None,
            typer.Option(help="Its partition (a tenant): partitions of a name take turns."),
        ] = None,
        retries: Annotated[
            int | None, typer.Option(help="Retries after a failure (default 3).")
        ] = None,
        timeout: Annotated[
            str | None, typer.Option(help="Cancel an attempt after, e.g. 10m (a failure).")
        ] = None,
        concurrency: Annotated[
            int | None, typer.Option(help="Workers that must each run it (default 1).")
        ] = None,
        not_before: Annotated[
            str | None, typer.Option(help="ISO 8601 time with its timezone, e.g. …T09:00Z.")
        ] = None,
        delay: Annotated[
            str | None, typer.Option(help="Start after, e.g. 30s, 1h30m, PT15M.")
        ] = None,
        debounce: Annotated[
            str | None, typer.Option(help="Start after; a publish again before restarts the wait.")
        ] = None,
        expires_in: Annotated[
            str | None, typer.Option(help="Cancel it if not started within, e.g. 1h.")
        ] = None,
        depends_on: Annotated[
            list[str] | None, typer.Option(help="A key; repeat for more.")
        ] = None,
        allow_missing: Annotated[
            bool,
            typer.Option("--allow-missing", help="--depends-on may name keys not published yet."),
        ] = False,
        replace_finished: Annotated[
            str | None,
            typer.Option(
                help="Publish anew a task of the key that ended in one of these states, "
                "e.g. fail,cancelled (success, fail, cancelled)."
            ),
        ] = None,
        json_output: JsonFlag = False,
    ) -> None:
        """Publish a task (idempotent by key)."""
        replacing = _finished_states(replace_finished) if replace_finished is not None else ()
        body = parse_json(read_text(payload, "payload"), "payload")
        if not_before and delay:
            fail("delay: give either --delay or --not-before, not both")
        chosen: dict[str, Any] = {"priority": priority}
        if not_before:
            chosen["not_before"] = parse_time(not_before, "not-before")
        if partition is not None:
            chosen["partition"] = partition
        if retries is not None:
            chosen["max_unexpected_retries"] = retries
        if concurrency is not None:
            chosen["concurrent_worker_cnt"] = concurrency
        if timeout:
            limit = parse_duration(timeout, "timeout", maximum=dt.timedelta(days=7))
            chosen["timeout_ms"] = round(limit.total_seconds() * 1000)
        wait = parse_duration(delay, "delay", minimum=dt.timedelta(0)) if delay else None
        window = parse_duration(debounce, "debounce", minimum=dt.timedelta(0)) if debounce else None
        lifetime = parse_duration(expires_in, "expires-in") if expires_in else None

        async def work(sched: Scheduler) -> None:
            from ..errors import DependencyError
            from ..models import TaskOptions

            if lifetime is not None:
                chosen["expires_at"] = sched.clock.now() + lifetime
            try:
                result = await sched.publish(
                    key,
                    body,
                    name=name,
                    options=TaskOptions(**chosen),
                    depends_on=depends_on,
                    allow_missing=allow_missing,
                    delay=wait,
                    debounce=window,
                    replace_finished=replacing,
                )
            except DependencyError as exc:  # the library's advice, in the command's words
                fail(str(exc).replace("allow_missing=True", "--allow-missing"))
            if json_output:
                emit({**result.model_dump(mode="json"), "task": task_json(result.task)})
            else:
                said = "published" if result.created else "exists, unchanged"
                if result.replaced:
                    said = "published anew"
                if result.payload_updated:
                    said = "debounced"
                typer.echo(f"{said}: {key} ({result.task.state.value})")
            if not ctx.obj.private_memory:  # no worker can ever serve that one
                await warn_if_unserved(sched, [name])

        run(ctx, work, flags=PUBLISH_FLAGS)

    @app.command("publish-many")
    def publish_many(
        ctx: typer.Context,
        source: Annotated[str, typer.Argument(help="A JSON-lines file, or - for stdin.")],
        name: Annotated[str | None, typer.Option(help="The name of lines that give none.")] = None,
    ) -> None:
        """Publish tasks from JSON lines: {"key": ..., "name": ..., "payload": ...,
        "options": {...}, "depends_on": [...]} per line (idempotent by key)."""
        text = read_text(source if source == "-" else f"@{source}", "source")
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        specs = _specs(lines, name)

        async def work(sched: Scheduler) -> None:
            import sys

            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            created = 0
            columns = (TextColumn("publishing"), BarColumn(), MofNCompleteColumn())
            # On stderr, and only on a terminal: stdout keeps the one line a script reads.
            shown = Console(stderr=True)
            bar_off = not sys.stderr.isatty()
            with Progress(*columns, console=shown, transient=True, disable=bar_off) as progress:
                bar = progress.add_task("publish", total=len(specs))
                for start in range(0, len(specs), _BULK_CHUNK):
                    chunk = specs[start : start + _BULK_CHUNK]
                    done = await sched.publish_many(chunk, allow_missing=True)
                    created += sum(result.created for result in done)
                    progress.advance(bar, len(chunk))
            typer.echo(f"published {created} task(s), {len(specs) - created} existed")
            if not ctx.obj.private_memory:
                await warn_if_unserved(sched, sorted({spec.name for spec in specs}))

        run(ctx, work)

    @app.command()
    def show(ctx: typer.Context, key: str, json_output: JsonFlag = False) -> None:
        """Show one task: state, times, options, attempts, result and error."""

        async def work(sched: Scheduler) -> None:
            from .show import render

            task = await sched.get(key)
            if task is None:
                fail(f"no task has the key {key!r}")
            if json_output:
                emit(task_json(task))
            else:
                typer.echo(render(task, sched.clock.now()))

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
        if state is not None:  # said before connecting: the flag is wrong, not the database
            from ..models import TaskState

            known = [each.value for each in TaskState]
            if state not in known:
                fail(f"state: {state!r} is not one of {', '.join(known)}")

        async def work(sched: Scheduler) -> None:
            await check_database(sched, ctx.obj)
            tasks = await sched.list_tasks(name=name, state=state, limit=limit)
            if json_output:
                emit([task_json(task) for task in tasks])
                return
            table = []
            for task in tasks:
                done = task.progress
                error = f"{task.error.type}: {task.error.message}" if task.error else ""
                table.append(
                    [
                        task.key,
                        task.name,
                        task.state.value,
                        str(task.options.priority),
                        str(task.attempts_in_all),  # earlier runs' too
                        f"{done.fraction:.0%} {done.message}".rstrip() if done else "",
                        when(task.updated_at),
                        error,
                    ]
                )
            columns = ("key", "name", "state", "priority", "attempts", "progress", "updated")
            rows([*columns, "error"], table)

        run(ctx, work)

    @app.command()
    def cancel(
        ctx: typer.Context,
        key: Annotated[str | None, typer.Argument()] = None,
        reason: str = "cancelled from the command line",
        name: Annotated[
            str | None, typer.Option(help="Every task of this name (with --yes), not one KEY.")
        ] = None,
        state: Annotated[
            list[str] | None,
            typer.Option(
                help="With --name: the states to cancel (pending and blocked unless given; "
                "running too only when named); repeatable."
            ),
        ] = None,
        yes: Annotated[
            bool, typer.Option("--yes", help="With --name: cancel them (it asks for this).")
        ] = False,
    ) -> None:
        """Cancel a task that has not finished; its running handlers are stopped. One that
        has finished will not run again either: that is said, and the command succeeds.
        With --name, every task of that name in the --state states (pending and blocked by
        default), which needs --yes."""
        if name is not None:
            _cancel_many(ctx, key, name, state, yes, reason)
            return
        if key is None:
            fail("cancel: give the KEY of a task, or --name NAME (with --yes) for many")
        if state:
            fail("state: --state goes with --name")
        if yes:
            fail("yes: --yes goes with --name")

        async def work(sched: Scheduler) -> None:
            # A key that names nothing is a mistake, not a task to stop: `TaskNotFound`, one
            # line and exit 2, as from every other command.
            if await sched.cancel(key, reason):
                typer.echo(f"cancelled: {key}")
                return
            task = await sched.get(key)
            state = "deleted since" if task is None else task.state.value
            typer.echo(f"already finished: {key} ({state})")

        run(ctx, work)

    @app.command()
    def retry(
        ctx: typer.Context,
        key: Annotated[str | None, typer.Argument()] = None,
        failed: Annotated[bool, typer.Option("--failed", help="Every failed task.")] = False,
        name: Annotated[str | None, typer.Option(help="With --failed: of this name only.")] = None,
        with_dependents: Annotated[
            bool,
            typer.Option(
                "--with-dependents",
                help="With a KEY: run again too the dependents its failure cancelled.",
            ),
        ] = False,
    ) -> None:
        """Run a failed or cancelled task again, or (--failed) every failed task. The attempts
        of the earlier runs stay in its history (`show`)."""
        if key is None and not failed:
            fail("retry: give the KEY of a task to run again, or --failed for every failed one")
        if key is not None and failed:
            fail("retry: give a KEY or --failed, not both")
        if name is not None and not failed:
            fail("name: --name goes with --failed (a KEY names its task already)")
        if with_dependents and key is None:
            fail("with-dependents: --with-dependents goes with a KEY")

        async def work(sched: Scheduler) -> None:
            if key is None:
                results = await sched.retry_failed(name=name)
                typer.echo(f"retried {len(results)} task(s)")
                return
            result = await sched.retry(key, with_dependents=with_dependents)
            typer.echo("retried 1 task(s)")
            if with_dependents:
                revived = ", ".join(result.revived) or "none were cancelled by it"
                typer.echo(f"revived dependents: {revived}")

        run(ctx, work)

    @app.command()
    def purge(
        ctx: typer.Context,
        state: Annotated[list[str] | None, typer.Option(help="Finished state; repeatable.")] = None,
        older_than: Annotated[str, typer.Option(help="e.g. 90s, 15m, 12h, 7d, 2w")] = "7d",
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Count what would go; delete nothing.")
        ] = False,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    ) -> None:
        """Delete finished tasks that ended more than --older-than ago (asks first, unless
        --yes; without a terminal to ask on, --yes is required)."""
        age = parse_duration(older_than, "older-than", minimum=dt.timedelta(0))
        states = state or ["success"]

        async def work(sched: Scheduler) -> None:
            import sys

            count = await sched.purge(states=states, older_than=age, dry_run=True)
            said = f"{count} {'/'.join(states)} task(s) that ended more than {older_than} ago"
            if dry_run or count == 0:
                typer.echo(f"would delete {said}" if dry_run else "deleted 0 task(s)")
                return
            if not yes:
                if not sys.stdin.isatty():
                    fail(f"purge: would delete {said}; add --yes to delete them (or --dry-run)")
                if not typer.confirm(f"delete {said}?", err=True):
                    fail("purge: nothing deleted")
            deleted = await sched.purge(states=states, older_than=age)
            typer.echo(f"deleted {deleted} task(s)")

        run(ctx, work)


def _cancel_many(
    ctx: typer.Context,
    key: str | None,
    name: str,
    states: list[str] | None,
    yes: bool,
    reason: str,
) -> None:
    """``cancel --name``: checked before connecting, and refused without ``--yes`` (it may
    stop thousands of tasks, running ones too)."""
    from ..models import TaskState

    if key is not None:
        fail("cancel: give a KEY or --name, not both")
    chosen = states or ["pending", "blocked"]
    known = [each.value for each in TaskState]
    for each in chosen:
        if each not in known:
            fail(f"state: {each!r} is not one of {', '.join(known)}")
    if not yes:
        fail(f"yes: this cancels every {'/'.join(chosen)} task of {name!r}; add --yes to do it")

    async def work(sched: Scheduler) -> int:
        return await sched.cancel_many(name=name, states=chosen, reason=reason)

    cancelled = run(ctx, work, flags={"states": "state"})
    typer.echo(f"cancelled {cancelled} task(s) of {name}")


def _finished_states(text: str) -> tuple[str, ...]:
    """``--replace-finished``'s comma-separated states, checked before connecting."""
    from ..models import finished_states_to_replace

    states = tuple(part.strip() for part in text.split(",") if part.strip())
    try:
        finished_states_to_replace(states)
    except ValueError as exc:
        fail(str(exc).replace("replace_finished", "replace-finished", 1))
    if not states:
        fail("replace-finished: name at least one finished state (success, fail, cancelled)")
    return states


def _specs(lines: list[tuple[int, str]], name: str | None) -> list[Any]:
    """Every line checked before anything is written: a bad one names its line."""
    from pydantic import ValidationError

    from ..errors import field_errors
    from ..specs import TaskSpec

    specs = []
    for number, line in lines:
        data = parse_json(line, f"line {number}")
        if not isinstance(data, dict):
            fail(f"line {number}: expected a JSON object with key and name")
        if name is not None:
            data.setdefault("name", name)
        try:
            specs.append(TaskSpec.model_validate(data))
        except ValidationError as exc:
            fail(f"line {number}: {field_errors(exc)}")
    return specs
