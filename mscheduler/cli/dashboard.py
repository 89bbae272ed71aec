"""``mscheduler dashboard``: the web dashboard, served with uvicorn on this collection."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import TYPE_CHECKING, Annotated

import typer

from .common import fail, run
from .inputs import parse_duration

if TYPE_CHECKING:  # the library is imported when the command runs, not to print --help
    from ..api import Scheduler

LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}
# A token is all that guards a served app, and plain HTTP lets anyone on the path try many:
# it must be long and varied enough not to be guessed (a random one of 16 characters drawn
# from 8 or more is at least 48 bits).
TOKEN_LENGTH, TOKEN_DISTINCT = 16, 8
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(24))'"


def check_token(token: str | None, envvar: str) -> None:
    """Refuse (one line naming --token, exit 2) a token short or plain enough to guess. The
    token itself is never printed: it may be nearly right."""
    if token is None:
        return
    if len(token) < TOKEN_LENGTH or len(set(token)) < TOKEN_DISTINCT:
        fail(
            f"token: the --token (or {envvar}) given is too easy to guess: use at least "
            f"{TOKEN_LENGTH} characters, {TOKEN_DISTINCT} or more of them different, e.g. "
            f"from {MAKE_TOKEN}; over a network, put TLS in front (docs: the dashboard page)"
        )


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host``: a loopback name or address."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, *, token: str | None, extra: list[str]) -> list[str] | None:
    """The host names the served dashboard answers: the loopback names, the one it binds,
    and the ``--allowed-host`` ones; with a token and none of those, any (None: the token
    guards it, and a wildcard address is reached by names it cannot know)."""
    if token and not extra:
        return None
    from ..host_guard import LOOPBACK_HOSTS, host_name

    return list(dict.fromkeys([*LOOPBACK_HOSTS, host_name(host), *extra]))


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
        allowed_host: Annotated[
            list[str] | None,
            typer.Option(
                "--allowed-host",
                help="A host name browsers reach it by, besides the loopback names and --host "
                "(repeatable; behind a proxy, the name the proxy is reached by).",
                show_default=False,
            ),
        ] = None,
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
        if not is_loopback(host) and not token:
            fail(
                f"dashboard: binding {host} opens it to the network; give --token (or "
                "MSCHEDULER_DASHBOARD_TOKEN), or bind 127.0.0.1"
            )
        try:
            import uvicorn

            from ..dashboard import create_app
        except ImportError as exc:
            fail(f"dashboard: {exc} (pip install 'mscheduler[dashboard]')")

        async def serve(sched: Scheduler) -> None:
            app = create_app(
                sched,
                read_only=read_only,
                token=token,
                poll_interval=every.total_seconds(),
                allowed_hosts=allowed_hosts(host, token=token, extra=allowed_host or []),
            )
            # Open pages hold an event stream each: a stop waits that long for them, no more.
            config = uvicorn.Config(
                app,
                host=host,
                port=port,
                log_config=None,
                lifespan="off",
                timeout_graceful_shutdown=2,
            )
            typer.echo(f"dashboard: http://{host}:{port}/ (Ctrl-C stops it)", err=True)
            await uvicorn.Server(config).serve()

        run(ctx, serve, private="refuse")
