"""What the commands that serve a web app (``serve``, ``dashboard``) share: the token check,
which addresses need one, the host names the app answers (`host_guard.served_hosts`, from the
flags), and the listening socket, bound before the app is announced."""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Annotated

import typer

from .common import fail

LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}
# A token is all that guards a served app, and plain HTTP lets anyone on the path try many:
# it must be long and varied enough not to be guessed (a random one of 16 characters drawn
# from 8 or more is at least 48 bits).
TOKEN_LENGTH, TOKEN_DISTINCT = 16, 8
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(24))'"

AllowedHostFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host",
        help="A host name clients reach it by (repeatable; behind a proxy, the proxy's name). "
        "With none, any name is answered once --token is set, and the loopback names only "
        "without it.",
        show_default=False,
    ),
]


def check_token(token: str | None, envvar: str) -> None:
    """Refuse (one line naming --token, exit 2) a token short or plain enough to guess. The
    token itself is never printed: it may be nearly right."""
    if token is None:
        return
    if len(token) < TOKEN_LENGTH or len(set(token)) < TOKEN_DISTINCT:
        fail(
            f"token: the --token (or {envvar}) given is too easy to guess: use at least "
            f"{TOKEN_LENGTH} characters, {TOKEN_DISTINCT} or more of them different, e.g. "
            f"from {MAKE_TOKEN}; over a network, put TLS in front (docs/operations/dashboard.md)"
        )


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host``: a loopback name or address."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    """``0.0.0.0`` or ``::``: every interface, a name no client uses."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def allowed_hosts(host: str, *, token: str | None, extra: list[str]) -> list[str] | None:
    """The names to give the app (`host_guard.served_hosts` adds the loopback ones): the
    ``--allowed-host`` ones and the address it binds (unless a wildcard); with a token and no
    ``--allowed-host``, None: any name, the token guards it."""
    if token and not extra:
        return None
    from ..host_guard import host_name

    bound = [] if _is_wildcard(host) else [host_name(host)]
    return list(dict.fromkeys([*bound, *extra]))


def refuse_open_without_token(command: str, host: str, token: str | None, envvar: str) -> None:
    """An address other machines reach needs a token (one line, exit 2)."""
    if not is_loopback(host) and not token:
        fail(
            f"host: binding {host} opens the {command} to the network; give --token (or "
            f"{envvar}), or bind 127.0.0.1"
        )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, or one line naming --port or --host and
    exit 2 (a port in use, an address not of this machine): before anything is announced, so
    a client that reads the address and connects at once is queued, never refused."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
    except socket.gaierror as exc:
        fail(f"host: cannot resolve {host!r}: {exc.strerror or exc}")
    listening = socket.socket(family, kind, proto)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(2048)
    except OSError as exc:
        listening.close()
        if exc.errno == errno.EADDRINUSE:
            fail(f"port: {port} on {host} is in use by another program; choose another --port")
        fail(f"host: cannot listen on {host}:{port}: {exc.strerror or exc}")
    return listening


def url(host: str, listening: socket.socket) -> str:
    """The address to announce: ``host`` as given, the port bound (``--port 0``: any)."""
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{listening.getsockname()[1]}/"
