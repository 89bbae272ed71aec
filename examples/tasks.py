"""A handlers module for `mscheduler worker`, as you would write one for your own app.

    cd examples
    mscheduler --uri "mongodb://localhost:27017/?directConnection=true" worker tasks:handlers
    # in another shell:
    mscheduler --uri "mongodb://localhost:27017/?directConnection=true" \\
        publish thumb:1 --name thumbnail --payload '{"width": 4000}'

The compose file's worker service runs exactly this (docker/compose.yml).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import mscheduler as ms

handlers = ms.Handlers()


@handlers.task("thumbnail")
def thumbnail(task: ms.Task) -> dict[str, int]:
    """A plain function: run in a worker thread, so blocking work does not stall the others."""
    width = int(task.payload["width"])
    time.sleep(0.01)  # the blocking work (an image library, say)
    return {"width": min(width, 320)}


class EndpointDown(ConnectionError):
    """The receiving end is away for now: worth another try later."""


@handlers.task("webhook", retry_on=(EndpointDown, TimeoutError))
async def webhook(task: ms.Task) -> dict[str, Any]:
    """Only a transient failure (listed in ``retry_on``) is retried; a bad payload (a
    KeyError here) fails the task at once instead of using up its retries."""
    url = task.payload["url"]
    if "down" in url:
        raise EndpointDown(f"{url} did not answer")
    body = json.dumps(task.payload["event"], sort_keys=True).encode()
    return {"url": url, "signature": hashlib.sha256(body).hexdigest()[:16]}
