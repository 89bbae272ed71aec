"""``mscheduler serve``: the HTTP API (`mscheduler.http`), served with uvicorn on this
collection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .common import fail, run
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
    def serve(
        ctx: typer.Context,
        host: Annotated[str, typer.Option(help="Address to bind; others need --token.")] = (
            "127.0.0.1"
        ),
        port: Annotated[int, typer.Option(min=0, max=65535, help="0: any free port.")] = 8700,
        token: Annotated[
            str | None,
            typer.Option(
                envvar="MSCHEDULER_HTTP_TOKEN",
                help="Required on every /v1 request as Authorization: Bearer <token>.",
                show_default=False,
            ),
        ] = None,
        allowed_host: AllowedHostFlag = None,
    ) -> None:
        """The HTTP API: publish, own, extend and return tasks over JSON (/openapi.json)."""
        check_token(token, "MSCHEDULER_HTTP_TOKEN")
        refuse_open_without_token("API", host, token, "MSCHEDULER_HTTP_TOKEN")
        try:
            import uvicorn

            from ..http import create_app
        except ImportError as exc:
            fail(f"serve: {exc} (pip install 'mscheduler[http]')")
        hosts = allowed_hosts(host, token=token, extra=allowed_host or [])
        listening = listen(host, port)

        async def work(sched: Scheduler) -> None:
            app = create_app(sched, token=token, allowed_hosts=hosts)
            config = uvicorn.Config(app, log_config=None, timeout_graceful_shutdown=2)
            typer.echo(f"serve: {url(host, listening)} (Ctrl-C stops it)", err=True)
            await uvicorn.Server(config).serve(sockets=[listening])

        # memory:// is fine: the server is the one process on it, and clients come over HTTP.
        run(ctx, work, private="fine")
