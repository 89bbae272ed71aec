"""Handlers that `mscheduler worker` loads in the acceptance tests."""

from __future__ import annotations

import mscheduler as ms


async def echo(task: ms.Task) -> object:
    return task.payload


handlers = {"echo": echo}
