"""Who may call the API: a Host this server answers to and, on a write, a page of its own
origin (the rules of `mscheduler.host_guard`, which the dashboard applies too: the names given,
``mscheduler serve --allowed-host`` or ``create_app(allowed_hosts=...)``, and the loopback
ones; given none, any name behind a token, the loopback names without), then a bearer token
when one is set.
"""

from __future__ import annotations

import hmac

from ..host_guard import Scope, refusal


class Refused(Exception):
    """A request the guard turns away: its status, error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


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
            if scheme.lower() != "bearer" or not given.strip():
                raise Refused(
                    401, "unauthorized", "token: required, as Authorization: Bearer <token>"
                )
            if not hmac.compare_digest(given.strip().encode(), self._token.encode()):
                raise Refused(401, "unauthorized", "token: the bearer token given is wrong")
