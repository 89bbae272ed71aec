"""The HTTP API: JSON over HTTP for workers in any language and for operations tools.

`create_app` returns an ASGI application (FastAPI) that mounts in an application or runs with
``mscheduler serve``.

- ``app``: the routes, over one `Scheduler`;
- ``bodies``: the request and response models, from which the OpenAPI document is made (the
  protocol, with ``docs/operations/http-api.md``);
- ``guard``: who may call it (token, Host, Origin);
- ``leases``: the leases this server handed out, so a worker's finish needs no read first;
- ``paths``: a key with a ``/`` in a route's path, sent percent-encoded;
- ``capped``: a request body capped before it is read.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
