"""A web dashboard of the queue: ``mscheduler dashboard``, or `create_app` to mount.

Needs the optional dependencies: ``pip install 'mscheduler[dashboard]'``.

- ``app``: the ASGI app: pages, live refresh, actions as POSTs with a CSRF token;
- ``overview``: what the overview shows (each name's counts, pause, limits, schedules,
  workers; the tasks that ended over the last hour);
- ``events``: live refresh, a server-sent event when something happens to a task;
- ``security``: who may use it (token, Host, Origin) and the CSRF token of its pages;
- ``templates/``, ``static/``: the pages and their assets (no CDN).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"the dashboard needs {exc.name}: pip install 'mscheduler[dashboard]'"
    ) from exc

from .app import create_app

__all__ = ["create_app"]
