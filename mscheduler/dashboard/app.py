"""The dashboard as an ASGI app: pages, live refresh, and actions as POSTs with a CSRF token.

``create_app(scheduler)`` is what a FastAPI or Starlette app mounts; ``mscheduler
dashboard`` serves the same app with uvicorn.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from ..api import Scheduler
from ..constants import MAX_PAGE
from ..encoding import task_json
from ..errors import ConfigurationError, MSchedulerError
from ..host_guard import HostGuard, served_hosts
from ..models import TaskState, WorkerState, WorkerStateKind
from .events import refresh_signals
from .listing import elapsed, listed
from .overview import STATES, overview
from .security import CSRF_FIELD, CSRF_HEADER, NoFraming, RequireToken, csrf_token, same_token

HERE = pathlib.Path(__file__).parent
PAGE_SIZE = 50
MAX_FORM_BYTES = 64 * 1024
MAX_LINKS = 100  # dependencies and dependents shown on a task's page
# Characters of a payload or result a task's page shows: past them, the page stays small and
# fast whatever the task holds (16 MB at most), and links to the whole document as JSON.
SHOWN_CHARS = 20_000


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def _clipped_json(value: Any, limit: int = SHOWN_CHARS) -> tuple[str, int]:
    """``value`` as `_json` shows it, cut at ``limit`` characters, and the whole's length."""
    text = _json(value)
    return (text if len(text) <= limit else text[:limit] + "\n…"), len(text)


def _at(moment: dt.datetime | None) -> str:
    """An absolute time, in UTC, to the second: ``2030-01-01 09:00:00 UTC``."""
    if moment is None:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _when(moment: dt.datetime | None, now: dt.datetime, *, shown: bool = False) -> Markup:
    """A relative time (``3m ago``) that gives its absolute time on hover, and with ``shown``
    beside it too: a relative time alone cannot be compared with a log line."""
    if moment is None:
        return Markup("-")
    absolute = _at(moment)
    html = Markup('<time datetime="{}" title="{}">{}</time>').format(
        moment.isoformat(), absolute, _age(moment, now)
    )
    if shown:
        html += Markup(' <span class="sub">{}</span>').format(absolute)
    return html


def _took(ws: WorkerState) -> str:
    """How long an attempt lasted, to the millisecond; ``-`` while it runs. For one whose
    lease expired, how long its worker was heard from (its last ping): it ended, as its end
    time says, when the lease then expired."""
    if ws.state is WorkerStateKind.TIMEOUT:
        heard = (ws.pinged_at or ws.started_at) - ws.started_at
        return f"{heard.total_seconds():.3f}s, then silent"
    if ws.finished_at is None:
        return "-"
    return f"{(ws.finished_at - ws.started_at).total_seconds():.3f}s"


def _age(moment: dt.datetime | None, now: dt.datetime) -> str:
    """A short relative time: ``3s ago``, ``in 5m``."""
    if moment is None:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    seconds = (moment - now).total_seconds()
    amount = abs(seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if amount >= size:
            text = f"{amount / size:.0f}{unit}"
            break
    else:
        text = f"{amount:.0f}s"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _duration(seconds: float) -> str:
    """``90`` as ``90s``, ``60`` as ``1m``, ``7200`` as ``2h``: the largest exact unit."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        enable_async=False,
    )
    environment.filters["quote"] = lambda value: urllib.parse.quote(str(value), safe="")
    environment.filters["json"] = _json
    environment.filters["clipped_json"] = _clipped_json
    environment.filters["at"] = _at
    environment.filters["elapsed"] = elapsed
    environment.filters["duration"] = _duration
    environment.globals["states"] = STATES
    return environment


class EventStream(Response):
    """``text/event-stream`` of ``refresh`` events until the client goes away (no length:
    the body never ends)."""

    def __init__(self, scheduler: Scheduler, poll_interval: float, min_interval: float) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # a proxy in front must not hold the events back
        ]
        self.scheduler = scheduler
        self.poll_interval = poll_interval
        self.min_interval = min_interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def refresh() -> None:
            await send(
                {"type": "http.response.body", "body": b"data: refresh\n\n", "more_body": True}
            )

        async with anyio.create_task_group() as group:

            async def until_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(until_disconnect)
            await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
            await refresh_signals(
                self.scheduler,
                refresh,
                poll_interval=self.poll_interval,
                min_interval=self.min_interval,
            )


def create_app(
    scheduler: Scheduler,
    *,
    read_only: bool = False,
    token: str | None = None,
    secret: str | None = None,
    poll_interval: float = 2.0,
    min_refresh_interval: float = 1.0,
    page_size: int = PAGE_SIZE,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of ``scheduler``'s collection, as an ASGI app to serve or mount.

    ``read_only``: pages only, no action. ``token``: every request must carry it (HTTP
    basic auth's password, or a bearer token); without it, serve on a trusted address only.
    ``allowed_hosts``: the host names browsers reach it by besides the loopback ones (``"*"``:
    any, where the app it is mounted in checks the host); others are refused, and so is an
    action a page of another origin sends. By default, with a token any name (the token
    guards it), without one the loopback names only (127.0.0.1, localhost, [::1]): the rule
    of `host_guard.served_hosts`, the HTTP API's too.
    ``secret``: derives the CSRF token, so several processes behind one address accept each
    other's pages (by default each process draws its own). ``poll_interval``: how often
    open pages refresh where the server has no change streams. ``page_size``: rows of the
    task list per page.
    """
    if not 1 <= page_size <= MAX_PAGE:
        raise ConfigurationError(f"page_size: expected 1 to {MAX_PAGE}, got {page_size}")
    if not poll_interval > 0 or not min_refresh_interval >= 0:
        raise ConfigurationError("poll_interval, min_refresh_interval: must be positive")
    hosts = served_hosts(allowed_hosts, token=token)
    environment = _environment()
    csrf = csrf_token(secret)

    def render(
        request: Request, template: str, status_code: int = 200, **values: Any
    ) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        html = environment.get_template(template).render(
            base=base,
            read_only=read_only,
            csrf=csrf,
            csrf_field=CSRF_FIELD,
            now=scheduler.clock.now(),
            age=_age,
            when=_when,
            took=_took,
            request=request,
            **values,
        )
        return HTMLResponse(html, status_code=status_code)

    async def home(request: Request) -> Response:
        return render(request, "overview.html", view=await overview(scheduler))

    async def overview_fragment(request: Request) -> Response:
        return render(request, "_overview.html", view=await overview(scheduler))

    async def events(request: Request) -> Response:
        return EventStream(scheduler, poll_interval, min_refresh_interval)

    async def tasks(request: Request) -> Response:
        params = request.query_params
        chosen = {
            field: params.get(field) or None for field in ("name", "state", "prefix", "after")
        }
        try:
            page = await scheduler.browse.task_page(limit=page_size, **chosen)
        except MSchedulerError as exc:
            return render(request, "error.html", 400, message=str(exc))
        names = await scheduler.browse.task_names()
        following = None
        if page.after is not None:
            kept = {k: v for k, v in chosen.items() if v and k != "after"}
            following = urllib.parse.urlencode({**kept, "after": page.after})
        now = scheduler.clock.now()
        return render(
            request,
            "tasks.html",
            page=page,
            rows=[listed(task, now) for task in page.tasks],
            names=names,
            chosen=chosen,
            following=following,
        )

    async def task(request: Request) -> Response:
        key = request.path_params["key"]
        found = await scheduler.get(key)
        if found is None:
            return render(request, "error.html", 404, message=f"no task has the key {key!r}")
        shown = found.depends_on[:MAX_LINKS]
        states = await scheduler.browse.states_of(shown)
        dependencies = {dependency: states.get(dependency) for dependency in shown}
        dependents = await scheduler.browse.dependents(key, limit=MAX_LINKS)
        retryable = found.state in (TaskState.FAIL, TaskState.CANCELLED)
        # What a retry with its dependents would revive (only asked of a task to retry).
        cancelled = await scheduler.browse.cancelled_dependents(key) if retryable else []
        revived = request.query_params.get("revived")
        return render(
            request,
            "task.html",
            task=found,
            dependencies=dependencies,
            more_dependencies=len(found.depends_on) - len(shown),
            dependents=dependents,
            terminal=found.state.is_terminal,
            retryable=retryable,
            cancelled_dependents=[task.key for task in cancelled],
            revived=None if revived is None else [k for k in revived.split(",") if k],
            attempts=[(a.run, a) for a in found.earlier_attempts]
            + [(found.runs, ws) for ws in found.worker_states],
        )

    async def document(request: Request) -> Response:
        """The whole task as JSON (`encoding.task_json`, BSON values as extended JSON): what
        the task's page links to where it cuts a payload or result."""
        key = request.path_params["key"]
        found = await scheduler.get(key)
        if found is None:
            return JSONResponse({"error": f"no task has the key {key!r}"}, status_code=404)
        return JSONResponse(task_json(found))

    def action(
        work: Callable[[Request, dict[str, str]], Awaitable[str]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """A POST that changes something: refused (403, nothing done) without the page's
        CSRF token; then to the page of what it changed (a path of this app, never one the
        form names: no open redirect)."""

        async def endpoint(request: Request) -> Response:
            body = await request.body()
            if len(body) > MAX_FORM_BYTES:
                raise HTTPException(413, "form too large")
            form = {
                k: v[-1] for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace")).items()
            }
            given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
            if not same_token(given, csrf):
                return render(
                    request,
                    "error.html",
                    403,
                    message="refused: missing or wrong CSRF token; reload the page",
                )
            try:
                back = await work(request, form)
            except MSchedulerError as exc:
                return render(request, "error.html", 400, message=str(exc))
            base = request.scope.get("root_path", "").rstrip("/")
            return RedirectResponse(base + back, status_code=303)

        return endpoint

    def task_path(key: str) -> str:
        return "/tasks/" + urllib.parse.quote(key, safe="")

    async def cancel(request: Request, form: dict[str, str]) -> str:
        key = request.path_params["key"]
        await scheduler.cancel(key, form.get("reason") or "cancelled from the dashboard")
        return task_path(key)

    async def retry(request: Request, form: dict[str, str]) -> str:
        """Run the task again; with ``with_dependents``, the dependents its failure cancelled
        too, and the page it returns to names them."""
        key = request.path_params["key"]
        if not form.get("with_dependents"):
            await scheduler.retry(key)
            return task_path(key)
        result = await scheduler.retry(key, with_dependents=True)
        return task_path(key) + "?" + urllib.parse.urlencode({"revived": ",".join(result.revived)})

    async def pause(request: Request, form: dict[str, str]) -> str:
        await scheduler.pause(request.path_params["name"], form.get("reason", ""))
        return "/"

    async def resume(request: Request, form: dict[str, str]) -> str:
        await scheduler.resume(request.path_params["name"])
        return "/"

    async def stop_worker(request: Request, form: dict[str, str]) -> str:
        """The worker stops (`Scheduler.stop_worker`): draining, or at once with ``now``."""
        await scheduler.stop_worker(request.path_params["worker_id"], drain=not form.get("now"))
        return "/"

    async def retry_failed(request: Request, form: dict[str, str]) -> str:
        await scheduler.retry_failed(name=request.path_params["name"])
        return "/"

    routes: list[BaseRoute] = [
        Route("/", home, name="home"),
        Route("/fragments/overview", overview_fragment),
        Route("/events", events),
        Route("/tasks", tasks),
        Route("/documents/{key:path}", document),
    ]
    if not read_only:
        routes += [
            Route("/tasks/{key:path}/cancel", action(cancel), methods=["POST"]),
            Route("/tasks/{key:path}/retry", action(retry), methods=["POST"]),
            Route("/names/{name}/pause", action(pause), methods=["POST"]),
            Route("/names/{name}/resume", action(resume), methods=["POST"]),
            Route("/names/{name}/retry-failed", action(retry_failed), methods=["POST"]),
            Route("/workers/{worker_id:path}/stop", action(stop_worker), methods=["POST"]),
        ]
    routes += [
        Route("/tasks/{key:path}", task, name="task"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(HostGuard, allowed_hosts=hosts), Middleware(NoFraming)]
    if token is not None:
        if not token.strip():
            raise ConfigurationError("token: must not be empty")
        middleware.append(Middleware(RequireToken, token=token))
    return Starlette(routes=routes, middleware=middleware)
