"""A request body is capped before it is read: a client cannot make the server hold 60 MB
in memory to learn that a task's document holds 16 MiB at most.

`CappedBodies` refuses a declared ``Content-Length`` over the cap at once (413, nothing read),
and counts what a body without one (chunked) delivers, refusing it as soon as the count
passes the cap: the route reading it gets `BodyTooLarge`, which the app answers in its error
format (``{"error": "too_large", ...}``).
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException

from .. import constants as c
from ..host_guard import ASGIApp, Message, Receive, Scope, Send

# A task's document is at most MAX_DOCUMENT_BYTES of BSON; its JSON is longer where bytes
# travel as base64 or text as escapes: twice that is room for any body that can be stored.
MAX_BODY_BYTES = 2 * c.MAX_DOCUMENT_BYTES


class BodyTooLarge(HTTPException):
    """A body whose bytes, as read, passed the cap."""

    def __init__(self) -> None:
        super().__init__(413, f"body: longer than the limit of {MAX_BODY_BYTES} bytes")


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class CappedBodies:
    """ASGI middleware: every HTTP request's body capped at MAX_BODY_BYTES (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > MAX_BODY_BYTES:
            await _refuse(send, f"body: {declared} bytes; the limit is {MAX_BODY_BYTES} bytes")
            return
        read = 0

        async def counted() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > MAX_BODY_BYTES:
                    raise BodyTooLarge()
            return message

        await self.app(scope, counted, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": "too_large", "message": message}, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the body sent is left unread
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
