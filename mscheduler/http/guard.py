"""Who may call the API: a bearer token when one is set, a Host this server answers to (so a
page on another site cannot reach it through DNS rebinding), and on a write an Origin, when a
browser sends one, of those same hosts (so another site's page cannot post to it).

The hosts are the loopback names (``127.0.0.1``, ``localhost``, ``[::1]``) and the ones the
server was given (``mscheduler serve --host``, or ``create_app(hosts=...)`` behind a name).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Refused(Exception):
    """A request the guard turns away: its status, error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def host_name(value: str) -> str:
    """The host of a ``Host`` header or netloc, without its port, lower case (IPv6 kept in
    brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def allowed_hosts(hosts: Iterable[str]) -> frozenset[str]:
    named = set(LOOPBACK_HOSTS)
    for host in hosts:
        host = host.strip().lower()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address as a Host header writes it
        named.add(host)
    return frozenset(named)


class Guard:
    def __init__(self, token: str | None, hosts: frozenset[str]) -> None:
        self._token = token
        self._hosts = hosts

    def check(self, method: str, host: str | None, origin: str | None, auth: str | None) -> None:
        """Raises `Refused`, or returns: the request may proceed."""
        if host is None or host_name(host) not in self._hosts:
            raise Refused(400, "bad_host", f"Host {host!r} is not one this server answers to")
        if origin is not None and method.upper() not in SAFE_METHODS:
            netloc = urlsplit(origin).netloc
            if not netloc or host_name(netloc) not in self._hosts:
                raise Refused(403, "bad_origin", f"Origin {origin!r} may not write here")
        if self._token is not None:
            scheme, _, given = (auth or "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self._token.encode()
            ):
                raise Refused(401, "unauthorized", "Authorization: Bearer <token> is required")
