"""``mscheduler serve``: the HTTP API (`mscheduler.http`), served with uvicorn on this
collection."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Annotated

import typer

from .common import fail, run
from .dashboard import check_token, is_loopback

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
    ) -> None:
        """The HTTP API: publish, own, extend and return tasks over JSON (/openapi.json)."""
        check_token(token, "MSCHEDULER_HTTP_TOKEN")
        if not is_loopback(host) and not token:
            fail(
                f"serve: binding {host} opens the API to the network; give --token (or "
                "MSCHEDULER_HTTP_TOKEN), or bind 127.0.0.1"
            )
        try:
            import uvicorn

            from ..http import create_app
        except ImportError as exc:
            fail(f"serve: {exc} (pip install 'mscheduler[http]')")

        async def work(sched: Scheduler) -> None:
            app = create_app(sched, token=token, hosts=[host])
            config = uvicorn.Config(app, log_config=None, timeout_graceful_shutdown=2)
            # Bound and listening before it is announced: a client that reads the address
            # (port 0: any free one) and connects at once is queued, never refused.
            family, kind, proto, _, address = socket.getaddrinfo(
                host.strip("[]"), port, type=socket.SOCK_STREAM
            )[0]
            listening = socket.socket(family, kind, proto)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listening.bind(address)
            listening.listen(2048)
            bound = listening.getsockname()[1]
            shown = f"[{host.strip('[]')}]" if ":" in host else host
            typer.echo(f"serve: http://{shown}:{bound}/ (Ctrl-C stops it)", err=True)
            await uvicorn.Server(config).serve(sockets=[listening])

        # memory:// is fine: the server is the one process on it, and clients come over HTTP.
        run(ctx, work, private="fine")
