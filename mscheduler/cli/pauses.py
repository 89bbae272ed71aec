"""``mscheduler pause|resume NAME``: stop and restart the claims of a name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .common import run

if TYPE_CHECKING:
    from ..api import Scheduler


def register(app: typer.Typer) -> None:
    @app.command()
    def pause(
        ctx: typer.Context,
        name: str,
        reason: Annotated[str, typer.Option(help="Why, for whoever looks.")] = "",
    ) -> None:
        """Stop claiming tasks of NAME (running ones finish); `stats` shows it paused."""

        async def work(sched: Scheduler) -> None:
            done = await sched.pause(name, reason)
            typer.echo(f"paused: {name}" if done else f"already paused: {name}")

        run(ctx, work)

    @app.command()
    def resume(ctx: typer.Context, name: str) -> None:
        """Claim tasks of NAME again."""

        async def work(sched: Scheduler) -> None:
            done = await sched.resume(name)
            typer.echo(f"resumed: {name}" if done else f"was not paused: {name}")

        run(ctx, work)
