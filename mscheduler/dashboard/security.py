"""Who may use the dashboard, and proof that an action came from its own page.

Access: with a token, every request carries it, as a bearer token or as the password of HTTP
basic auth (any user name; a browser asks for it once). Without one, only the host names
the dashboard is served on are answered (`host_guard.HostGuard`: a page of another site
whose name was pointed at this address reads nothing). CSRF: every action is a POST that
carries the page's token, which another site's page cannot read, and that the browser says
came from the dashboard's own origin, so a form on another site, or a link, changes nothing
even in a browser that sends the access token by itself. No page can be framed by another
(`NoFraming`), so none can be clicked through an invisible frame.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


def csrf_token(secret: str | None) -> str:
    """The token the pages embed: derived from ``secret`` (the same in every process that
    serves the dashboard behind one address), or random for this process."""
    if secret is None:
        return secrets.token_urlsafe(32)
    digest = hmac.new(secret.encode(), b"mscheduler-dashboard-csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def same_token(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def presented_token(headers: Headers) -> str | None:
    """The token a request presents: ``Authorization: Bearer T`` or basic auth's password."""
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


class RequireToken:
    """ASGI middleware: a request without the token gets 401 and a basic-auth challenge."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = presented_token(Headers(scope=scope)) if scope["type"] == "http" else None
        if scope["type"] == "http" and not same_token(given, self.token):
            response = PlainTextResponse(
                "token: the token given is wrong"
                if given
                else "token: the dashboard needs its token (as the basic-auth password, or a "
                "bearer token)",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="mscheduler dashboard"'},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class NoFraming:
    """ASGI middleware: every response forbids framing (``X-Frame-Options: DENY``, and
    ``frame-ancestors 'none'`` for browsers that read only the CSP)."""

    HEADERS = (
        (b"x-frame-options", b"DENY"),
        (b"content-security-policy", b"frame-ancestors 'none'"),
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def framed_nowhere(message: Message) -> None:
            if message["type"] == "http.response.start":
                named = {name.lower() for name, _ in message.get("headers", [])}
                extra = [header for header in self.HEADERS if header[0] not in named]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, framed_nowhere)
