"""A FastAPI app: async endpoints publish and read tasks with `ms.Scheduler`.

FastAPI is async, so its endpoints use the async `Scheduler`, opened once in the app's
lifespan and closed with it (a plain ``def`` endpoint, which FastAPI runs in a thread, may
use `ms.SyncScheduler` instead). The workers usually run in processes of their own
(``mscheduler worker``); a small deployment can run them in the web process, in the same
lifespan, as here (``EMBEDDED_WORKERS``). Runs as is (with FastAPI and httpx installed),
driving the app with FastAPI's test client:

    python examples/fastapi_app.py [--uri mongodb://localhost:27017/app]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel

import mscheduler as ms

COLLECTION = "fastapi_example"
EMBEDDED_WORKERS = 2


class Thumbnail(BaseModel):
    width: int = 320


async def make_thumbnail(task: ms.Task) -> dict[str, Any]:
    return {"image": task.payload["image"], "width": task.payload["width"]}


def create_app(uri: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with await ms.Scheduler.connect(uri, collection=COLLECTION) as sched:
            app.state.scheduler = sched
            options = ms.WorkerOptions(worker_id="web", poll_interval_ms=20)
            handlers = {"thumbnail": make_thumbnail}
            async with sched.consumers(handlers, count=EMBEDDED_WORKERS, options=options):
                yield  # serving; on shutdown the workers finish what they run, then stop

    app = FastAPI(lifespan=lifespan)

    def scheduler(request: Request) -> ms.Scheduler:
        sched: ms.Scheduler = request.app.state.scheduler
        return sched

    @app.post("/images/{image}/thumbnail", status_code=202)
    async def request_thumbnail(image: str, body: Thumbnail, request: Request) -> dict[str, Any]:
        key = f"thumbnail:{image}:{body.width}"
        result = await scheduler(request).publish(
            key, {"image": image, "width": body.width}, name="thumbnail"
        )
        return {"key": key, "created": result.created}

    @app.get("/tasks/{key}")
    async def task_status(key: str, request: Request, wait: float = 0) -> dict[str, Any]:
        """``?wait=5``: answer once the task ended, or after five seconds."""
        sched = scheduler(request)
        task = await sched.get(key)
        if task is None:
            raise HTTPException(404, f"no task {key!r}")
        if wait > 0 and not task.state.is_terminal:
            with contextlib.suppress(TimeoutError):
                task = await sched.wait(key, timeout=min(wait, 30), poll_interval_ms=20)
        return {"state": task.state.value, "result": task.result}

    return app


def main(uri: str = "memory://") -> dict[str, Any]:
    with TestClient(create_app(uri)) as client:  # runs the lifespan: connect, workers
        first = client.post("/images/cat.png/thumbnail", json={"width": 128}).json()
        again = client.post("/images/cat.png/thumbnail", json={"width": 128}).json()
        done = client.get(f"/tasks/{first['key']}", params={"wait": 10}).json()
        missing = client.get("/tasks/thumbnail:nothing:1")

    assert (first["created"], again["created"]) == (True, False), "a retried POST made two tasks"
    assert done == {"state": "success", "result": {"image": "cat.png", "width": 128}}, done
    assert missing.status_code == 404
    summary = {"published": 1, "thumbnail": done["result"]}
    print(f"fastapi app: {summary}")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.ERROR)
    main(parser.parse_args().uri)
