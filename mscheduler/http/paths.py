"""Keys and names with a ``/`` in a route's path (``GET /v1/tasks/a%2Fb``).

A client sends such a key percent-encoded, but the server hands the framework the decoded
path, ``/v1/tasks/a/b``, which names no route. `EncodedSlashes` routes on the path as sent
(``raw_path``): a ``/`` that was encoded inside a segment becomes a NUL, which no key, name
or worker id may hold (`models.check_key`), so the segment stays one; `restore_slashes`, a
dependency of every route, turns it back into a ``/`` before the route reads its parameters.
"""

from __future__ import annotations

import urllib.parse

from fastapi import Request

from ..host_guard import ASGIApp, Receive, Scope, Send

IN_SEGMENT_SLASH = "\x00"


def _routed_path(scope: Scope) -> str | None:
    """The decoded path with each encoded ``/`` a NUL, or None where nothing changes (no
    encoded slash, no ``raw_path``, or an encoded NUL already)."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return None
    sent = raw.split(b"?", 1)[0].decode("latin-1")
    lowered = sent.lower()
    if "%2f" not in lowered or "%00" in lowered:
        return None
    routed = "/".join(
        urllib.parse.unquote(segment).replace("/", IN_SEGMENT_SLASH) for segment in sent.split("/")
    )
    # The app's own path may be the end of what was sent (mounted where the parent strips
    # its prefix): the same end, character for character, NUL for "/".
    path: str = scope["path"]
    if not routed.replace(IN_SEGMENT_SLASH, "/").endswith(path):
        return None
    return routed[len(routed) - len(path) :]


class EncodedSlashes:
    """ASGI middleware: a request whose path holds an encoded ``/`` is routed on the path as
    sent (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            routed = _routed_path(scope)
            if routed is not None:
                scope = {**scope, "path": routed}
        await self.app(scope, receive, send)


async def restore_slashes(request: Request) -> None:
    """The route's path parameters with their ``/`` back: run before the route's own
    parameters are read (a dependency of its router)."""
    params = request.scope.get("path_params")
    if params:
        for name, value in params.items():
            if isinstance(value, str) and IN_SEGMENT_SLASH in value:
                params[name] = value.replace(IN_SEGMENT_SLASH, "/")
