"""A web dashboard of the queue: ``mscheduler dashboard``, or `create_app` to mount.

Needs the optional dependencies: ``pip install 'mscheduler[dashboard]'``.
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
