"""Who may call the API: a Host this server answers to and, on a write, a page of its own
origin (the rules of `mscheduler.host_guard`, which the dashboard applies too), then a bearer
token when one is set.

The hosts are the loopback names (``127.0.0.1``, ``localhost``, ``[::1]``) and the ones the
server was given (``mscheduler serve --host``, or ``create_app(hosts=...)`` behind a name).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from ..host_guard import LOOPBACK_HOSTS, Scope, allowed_host_names, refusal


class Refused(Exception):
    """A request the guard turns away: its status, error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def allowed_hosts(hosts: Iterable[str]) -> frozenset[str]:
    """The loopback names and ``hosts``, as `host_guard` compares them."""
    return allowed_host_names([*LOOPBACK_HOSTS, *hosts])


class Guard:
    def __init__(self, token: str | None, hosts: frozenset[str]) -> None:
        self._token = token
        self._hosts = hosts

    def check(self, scope: Scope, auth: str | None) -> None:
        """Raises `Refused`, or returns: the request may proceed."""
        refused = refusal(scope, self._hosts)
        if refused is not None:
            status, reason = refused
            raise Refused(status, "bad_host" if status == 400 else "bad_origin", reason)
        if self._token is not None:
            scheme, _, given = (auth or "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self._token.encode()
            ):
                raise Refused(401, "unauthorized", "Authorization: Bearer <token> is required")
