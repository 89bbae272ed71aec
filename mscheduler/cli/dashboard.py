"""``mscheduler dashboard``: the web dashboard, served with uvicorn on this collection."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated

import typer

from .common import fail, run
from .inputs import parse_duration
from .web import (
    AllowedHostFlag,
    allowed_hosts,
    check_token,
    listen,
    refuse_open_without_token,
    url,
)

if TYPE_CHECKING:  # the library is imported when the command runs, not to print --help
    from ..api import Scheduler


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        ctx: typer.Context,
        host: Annotated[str, typer.Option(help="Address to bind; others need --token.")] = (
            "127.0.0.1"
        ),
        port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
        read_only: Annotated[
            bool, typer.Option("--read-only", help="Pages only: no cancel, retry or pause.")
        ] = False,
        token: Annotated[
            str | None,
            typer.Option(
                envvar="MSCHEDULER_DASHBOARD_TOKEN",
                help="Required on every request (as the basic-auth password, or a bearer token).",
                show_default=False,
            ),
        ] = None,
        allowed_host: AllowedHostFlag = None,
        poll_interval: Annotated[
            str,
            typer.Option(
                help="How often open pages look for changes where there are no change streams."
            ),
        ] = "2s",
    ) -> None:
        """A web dashboard of the queue: names, counts, tasks, workers, and actions."""
        check_token(token, "MSCHEDULER_DASHBOARD_TOKEN")
        every = parse_duration(
            poll_interval,
            "poll-interval",
            minimum=dt.timedelta(milliseconds=100),
            maximum=dt.timedelta(hours=1),
        )
        refuse_open_without_token("dashboard", host, token, "MSCHEDULER_DASHBOARD_TOKEN")
        try:
            import uvicorn

            from ..dashboard import create_app
        except ImportError as exc:
            fail(f"dashboard: {exc} (pip install 'mscheduler[dashboard]')")
        hosts = allowed_hosts(host, token=token, extra=allowed_host or [])
        listening = listen(host, port)

        async def serve(sched: Scheduler) -> None:
            app = create_app(
                sched,
                read_only=read_only,
                token=token,
                poll_interval=every.total_seconds(),
                allowed_hosts=hosts,
            )
            # Open pages hold an event stream each: a stop waits that long for them, no more.
            config = uvicorn.Config(
                app, log_config=None, lifespan="off", timeout_graceful_shutdown=2
            )
            typer.echo(f"dashboard: {url(host, listening)} (Ctrl-C stops it)", err=True)
            await uvicorn.Server(config).serve(sockets=[listening])

        run(ctx, serve, private="refuse")
