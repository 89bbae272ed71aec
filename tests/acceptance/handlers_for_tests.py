"""Handlers that `mscheduler worker` loads in the acceptance tests."""

from __future__ import annotations

import anyio

import mscheduler as ms


async def echo(task: ms.Task) -> object:
    return task.payload


async def slow(task: ms.Task) -> object:
    await anyio.sleep(3600)  # until the worker stops it
    return None


handlers = {"echo": echo, "slow": slow}
