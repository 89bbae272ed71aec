"""The routes of the HTTP API (see ``docs/operations/http-api.md``), over one `Scheduler`.

Every ``/v1`` route passes the `guard.Guard` first (token, Host, Origin); a body FastAPI
cannot validate is refused with 422 before anything is written; every error is JSON
``{"error": code, "message": one line}``. The OpenAPI document is FastAPI's, made from the
models of `bodies`, at ``/openapi.json``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from ..__about__ import __version__
from ..api import Scheduler
from ..encoding import from_extended, task_json
from ..errors import (
    BackendUnavailable,
    ConfigurationError,
    DependencyError,
    LeaseLost,
    MSchedulerError,
    PayloadError,
    TaskNotFound,
    TaskRunning,
    phrase,
)
from ..host_guard import served_hosts
from ..models import ErrorInfo, Lease, TaskState
from . import bodies as b
from .capped import CappedBodies
from .guard import Guard, Refused
from .leases import KnownLeases
from .paths import EncodedSlashes, restore_slashes

log = logging.getLogger(__name__)

_ERRORS: list[tuple[type[MSchedulerError], int, str]] = [  # first match wins
    (LeaseLost, 409, "lease_lost"),
    (TaskNotFound, 404, "not_found"),
    (TaskRunning, 409, "task_running"),
    (DependencyError, 422, "invalid"),
    (PayloadError, 422, "invalid"),
    (ConfigurationError, 422, "invalid"),
    (BackendUnavailable, 503, "unavailable"),
    (MSchedulerError, 500, "store_error"),
]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": b.Error, "description": text}
    for code, text in [
        (400, "Host not allowed"),
        (401, "token missing or wrong"),
        (403, "Origin not allowed"),
        (413, "body too large: refused before it is read"),
        (422, "invalid body or parameter: nothing was written"),
        (503, "MongoDB unreachable"),
    ]
}


# Named here so that FastAPI resolves it from the module (and lists it in the document).
_BEARER = HTTPBearer(auto_error=False, description="the server's token (mscheduler serve --token)")


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


# Where FastAPI found a value, the first part of an error's location: not a field's name.
_PLACES = ("body", "query", "path", "header", "cookie")


def _refusal(error: Any) -> str:
    """One of FastAPI's validation errors as ``field: what is wrong`` (``key: must be a
    string``, ``options.priority: ...``); a body that is no JSON says where it stops being
    JSON, as a position in the body."""
    where = [str(part) for part in error["loc"]]
    if error["type"] == "json_invalid":
        position = f" at position {where[1]}" if len(where) > 1 else ""
        reason = (error.get("ctx") or {}).get("error")
        return f"body: not valid JSON{position}" + (f" ({reason})" if reason else "")
    if len(where) > 1 and where[0] in _PLACES:
        where = where[1:]
    return f"{'.'.join(where) or 'body'}: {phrase(error)}"


def _lease_out(lease: Lease) -> b.LeaseOut:
    return b.LeaseOut(
        key=lease.key,
        worker_id=lease.worker_id,
        run_id=lease.run_id,
        expires_at=lease.ping_expire_at,
        task=task_json(lease.task),
    )


_ms = b.milliseconds


def create_app(
    scheduler: Scheduler,
    *,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> FastAPI:
    """The HTTP API over ``scheduler``. ``token``: required as ``Authorization: Bearer`` on
    every ``/v1`` route. ``allowed_hosts``: the names it answers to besides the loopback ones
    (its name behind a proxy; ``"*"``: any); by default any name with a token, the loopback
    names only without one (`host_guard.served_hosts`, the dashboard's rule too). A request
    for another Host is refused, and so is a write whose Origin is not one of them.

    While it runs as an application (its lifespan), it keeps the paused names and limits
    current through the process's control hub, so a claim reads none of them."""
    if token is not None and not token.strip():
        raise ConfigurationError("token: must not be empty")  # as the dashboard's
    guard = Guard(token, served_hosts(allowed_hosts, token=token))
    known = KnownLeases()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with scheduler.following_controls():
            yield

    app = FastAPI(
        title="mscheduler",
        version=__version__,
        description="Tasks in a MongoDB collection: publish, own, extend, return.",
        lifespan=lifespan,
    )

    async def guarded(
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
    ) -> None:
        guard.check(request.scope, request.headers.get("authorization"))

    v1 = APIRouter(
        prefix="/v1",
        dependencies=[Depends(guarded), Depends(restore_slashes)],
        responses=_RESPONSES,
    )

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        """The framework's own (no such route, method not allowed), in our error format."""
        code = {404: "no_route", 405: "method_not_allowed", 413: "too_large"}.get(
            exc.status_code, "http_error"
        )
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid", "; ".join(_refusal(error) for error in exc.errors()))

    @app.exception_handler(MSchedulerError)
    async def library_error(_: Request, exc: MSchedulerError) -> JSONResponse:
        status, code = next((s, c) for kind, s, c in _ERRORS if isinstance(exc, kind))
        if status >= 500:
            log.warning("http: %s", exc, extra={"action": "http_error"})
        return _error(status, code, str(exc).splitlines()[0] if str(exc) else code)

    async def lease_of(ref: b.LeaseRef) -> Lease:
        found = known.get(ref.key, ref.worker_id, ref.run_id)
        if found is not None:
            return found
        return await scheduler.find_lease(ref.key, worker_id=ref.worker_id, run_id=ref.run_id)

    # ------------------------------------------------------------ tasks

    @v1.post(
        "/tasks",
        status_code=201,
        responses={200: {"description": "the existing task of that key (nothing changed)"}},
    )
    async def publish(body: b.PublishBody, response: Response) -> b.Task:
        """Publish a task, idempotently by key: 201 with the task created (or, with
        ``replace_finished``, a finished one published anew), 200 with the one that had the
        key already."""
        payload = from_extended(body.payload, "payload")
        result = await scheduler.publish(body.key, payload, name=body.name, **body.params())
        if not (result.created or result.replaced):
            response.status_code = 200
        return task_json(result.task)

    @v1.get("/tasks/{key}", responses={404: {"model": b.Error, "description": "no such task"}})
    async def get_task(key: str) -> b.Task:
        task = await scheduler.get(key)
        if task is None:
            raise TaskNotFound(f"no task has the key {key!r}")
        return task_json(task)

    @v1.get("/tasks")
    async def list_tasks(
        name: str | None = None,
        state: TaskState | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> b.Tasks:
        """The newest tasks, of one name and one state if given."""
        tasks = await scheduler.list_tasks(
            name=name, state=None if state is None else state.value, limit=limit
        )
        return b.Tasks(tasks=[task_json(task) for task in tasks])

    @v1.post(
        "/tasks/{key}/cancel", responses={404: {"model": b.Error, "description": "no such task"}}
    )
    async def cancel(key: str) -> b.Done:
        """Cancel a task that has not ended; its workers lose their leases. ``changed`` is
        false for a task that had already ended."""
        return b.Done(changed=await scheduler.cancel(key))

    @v1.post(
        "/tasks/{key}/retry", responses={404: {"model": b.Error, "description": "no such task"}}
    )
    async def retry(key: str, body: b.RetryBody | None = None) -> b.Task:
        """Run a failed or cancelled task again; with ``with_dependents``, the dependents its
        end cancelled (and theirs) too."""
        with_dependents = body is not None and body.with_dependents
        return task_json((await scheduler.retry(key, with_dependents=with_dependents)).task)

    @v1.get(
        "/tasks/{key}/wait",
        responses={
            404: {"model": b.Error, "description": "no such task"},
            408: {"model": b.Error, "description": "not ended within timeout_ms"},
        },
    )
    async def wait(
        key: str, timeout_ms: Annotated[int, Query(ge=0, le=5 * 60 * 1000)] = 30_000
    ) -> Any:
        """The task once it has ended (success, fail or cancelled)."""
        try:
            task = await scheduler.wait(key, timeout=timeout_ms / 1000)
        except TimeoutError:
            return _error(408, "timeout", f"task {key!r} has not ended after {timeout_ms} ms")
        return task_json(task)

    # ------------------------------------------------------------ leases

    @v1.post("/own")
    async def own(body: b.OwnBody, request: Request) -> b.Leases:
        """Own up to max_tasks tasks of names for worker_id, best first, for lease_ms (the
        task's worker_timeout_ms by default); with wait_ms, wait that long for one."""
        leases = await scheduler.own(
            body.names,
            worker_id=body.worker_id,
            max_tasks=body.max_tasks,
            lease=_ms(body.lease_ms),
            wait=_ms(body.wait_ms),
        )
        if leases and await request.is_disconnected():
            # The worker left while this request waited (it stopped): nobody would run them.
            # Released, they are claimable at once and count no attempt; left, they would
            # expire and count one each.
            for lease in leases:
                with contextlib.suppress(LeaseLost):
                    await scheduler.release(lease)
            return b.Leases(leases=[])
        for lease in leases:
            known.keep(lease)
        return b.Leases(leases=[_lease_out(lease) for lease in leases])

    lost: dict[int | str, dict[str, Any]] = {
        409: {"model": b.Error, "description": "lease_lost: the lease is gone"}
    }

    @v1.post("/leases/extend", responses=lost)
    async def extend(body: b.ExtendBody) -> b.LeaseOut:
        lease = await scheduler.extend(await lease_of(body), _ms(body.lease_ms))
        known.keep(lease)
        return _lease_out(lease)

    @v1.post("/leases/succeed", responses=lost)
    async def succeed(body: b.SucceedBody) -> b.Task:
        lease = await lease_of(body)
        known.forget(lease.run_id)
        return task_json(await scheduler.succeed(lease, from_extended(body.result, "result")))

    @v1.post("/leases/fail", responses=lost)
    async def fail(body: b.FailBody) -> b.Task:
        """An attempt failed: retried by the task's rules."""
        lease = await lease_of(body)
        known.forget(lease.run_id)
        return task_json(await scheduler.fail(lease, ErrorInfo.from_message("Error", body.error)))

    @v1.post("/leases/release", responses=lost)
    async def release(body: b.LeaseRef) -> b.Task:
        """Hand the task back unrun: claimable at once, no attempt counted."""
        lease = await lease_of(body)
        known.forget(lease.run_id)
        return task_json(await scheduler.release(lease))

    # ------------------------------------------------------------ operations

    @v1.get("/stats")
    async def stats() -> b.Stats:
        return b.Stats(stats=await scheduler.stats())

    @v1.post("/names/{name}/pause")
    async def pause(name: str, body: b.PauseBody | None = None) -> b.Done:
        return b.Done(changed=await scheduler.pause(name, "" if body is None else body.reason))

    @v1.post("/names/{name}/resume")
    async def resume(name: str) -> b.Done:
        return b.Done(changed=await scheduler.resume(name))

    @v1.get("/limits")
    async def limits() -> b.Limits:
        """Every limited name: its limits, and what counts against them now."""
        now = scheduler.clock.now()
        found = sorted((await scheduler.limits()).items())
        return b.Limits(limits=[b.LimitOut(**limit.usage(now)) for _, limit in found])

    @v1.put("/limits/{name}")
    async def set_limit(name: str, body: b.LimitBody) -> b.LimitOut:
        """Limit ``name`` across every worker (set anew: a limit left out is removed)."""
        limit = await scheduler.set_limit(
            name,
            rate=body.rate,
            per=_ms(body.per_ms),
            max_running=body.max_running,
            partition_max_running=body.partition_max_running,
        )
        return b.LimitOut(**limit.usage(scheduler.clock.now()))

    @v1.delete("/limits/{name}")
    async def remove_limit(name: str) -> b.Done:
        return b.Done(changed=await scheduler.remove_limit(name))

    app.include_router(v1)
    app.add_middleware(EncodedSlashes)
    app.add_middleware(CappedBodies)
    return app
