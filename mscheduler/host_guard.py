"""Which requests a web app of ours answers: those addressed to a host name it serves, and
for a write, those a page of its own origin sent.

A page on another site cannot read an app on 127.0.0.1, unless that site's name is made to
point there (DNS rebinding): then the browser takes the app for the other site's own, and
the request carries ``Host: attacker.example``. So the ``Host`` header is checked against the
names the app serves, and a write (any method but GET, HEAD and OPTIONS; any websocket) is
refused when the browser says it comes from elsewhere: ``Sec-Fetch-Site`` other than
``same-origin`` or ``none``, or an ``Origin`` whose host is not one of those names. A client
that is not a browser sends neither header and is judged by the host alone.

Which names an app answers is one rule for every app of ours (`served_hosts`): the names it
was given and the loopback names; given none, any name once a token is set (a page that
rebinds a name to the app cannot present the token, so the token guards the app, and an app
bound to every interface is reached by names it cannot know), else the loopback names only.

`HostGuard` is plain ASGI (no framework), so any app of the package can wrap itself in it.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .errors import ConfigurationError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# What a browser on this machine calls a server bound to the loopback interface.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
ANY_HOST = "*"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCHES = frozenset({"same-origin", "none"})


def host_name(host: str) -> str:
    """The name part of a ``Host`` header or a bind address, as compared: lower case, no port,
    no trailing dot, an IPv6 address in brackets (``::1`` and ``[::1]:8080`` are ``[::1]``)."""
    host = host.strip().lower()
    if host.count(":") > 1 and not host.startswith("["):
        host = f"[{host}]"  # a bare IPv6 address (a bind address), no port
    if host.startswith("["):
        name = host[: host.find("]") + 1] if "]" in host else host
    else:
        name = host.partition(":")[0]
    return name.rstrip(".")


def allowed_host_names(hosts: Iterable[str]) -> frozenset[str]:
    """``hosts`` as `HostGuard` compares them; ``"*"`` stays, meaning any name."""
    return frozenset(ANY_HOST if host.strip() == ANY_HOST else host_name(host) for host in hosts)


def served_hosts(given: Iterable[str] | None, *, token: str | None) -> frozenset[str]:
    """The names an app answers, as `HostGuard` compares them (the rule above): the loopback
    names and ``given`` (``"*"``: any); with none given, any once ``token`` is set, else the
    loopback names only. A ``given`` that is not a list of names is refused, naming
    ``allowed_hosts``."""
    names = [] if given is None else [given] if isinstance(given, str) else list(given)
    if isinstance(given, str) or not all(isinstance(h, str) and h.strip() for h in names):
        raise ConfigurationError(f"allowed_hosts: expected a list of host names, got {given!r}")
    if not names:
        return frozenset({ANY_HOST}) if token is not None else allowed_host_names(LOOPBACK_HOSTS)
    return allowed_host_names([*LOOPBACK_HOSTS, *names])


def refusal(scope: Scope, allowed: frozenset[str]) -> tuple[int, str] | None:
    """Why this request is refused, as an HTTP status and a reason, or None to answer it: 400
    for a host not served, 403 for a write from elsewhere (the rules of this module)."""
    headers = {name.decode("latin-1").lower(): value for name, value in scope.get("headers", [])}
    host = headers.get("host", b"").decode("latin-1")
    name = host_name(host)
    if ANY_HOST not in allowed and name not in allowed:
        return 400, f"host {host!r} is not one this app serves"
    is_write = scope["type"] == "websocket" or scope.get("method", "GET") not in SAFE_METHODS
    if not is_write:
        return None
    fetch_site = headers.get("sec-fetch-site", b"").decode("latin-1").lower()
    if fetch_site and fetch_site not in SAME_ORIGIN_FETCHES:
        return 403, f"a write from a page of another site (Sec-Fetch-Site: {fetch_site})"
    origin = headers.get("origin", b"").decode("latin-1")
    if origin:
        origin_host = host_name(urllib.parse.urlsplit(origin).netloc)  # "null" has none
        if not origin_host or (origin_host != name and origin_host not in allowed):
            return 403, f"a write from a page of another origin ({origin!r})"
    return None


class HostGuard:
    """ASGI middleware: a request `refusal` refuses gets 400 (a host not served) or 403 (a
    write from elsewhere) and never reaches ``app``; a websocket is closed before it opens.

    ``allowed_hosts``: the names clients use to reach the app (a port is ignored), or
    ``"*"`` for any, where something in front already checks the host."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = allowed_host_names(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = refusal(scope, self.allowed)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, reason = refused
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": reason})
            return
        body = f"refused: {reason}\n".encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"x-content-type-options", b"nosniff"),  # it repeats the Host sent
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
