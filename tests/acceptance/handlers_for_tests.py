"""Handlers that `mscheduler worker` loads in the acceptance tests."""

from __future__ import annotations

import anyio

import mscheduler as ms


async def echo(task: ms.Task) -> object:
    return task.payload


def parse_config(text: str) -> dict[str, str]:
    key, _, value = text.partition("=")
    if not value:
        raise ValueError(f"no '=' in {text!r}")
    return {key: value}


async def boom(task: ms.Task) -> object:
    """Fails in a function of its own, so a traceback has the handler's frames to show."""
    return parse_config(task.payload)


async def nap(task: ms.Task) -> object:
    """A long task: sleeps ``payload`` seconds, and says who ran it."""
    await anyio.sleep(task.payload)
    return ms.current_lease().worker_id


async def slow(task: ms.Task) -> object:
    await anyio.sleep(3600)  # until the worker stops it
    return None


async def flaky(task: ms.Task) -> object:
    """Fails on the first attempt of a key's first run only: what a retry then fixes."""
    if task.runs == 1 and task.attempts == 1:
        raise RuntimeError("the first attempt fails")
    return "fine"


handlers = {"echo": echo, "boom": boom, "nap": nap, "slow": slow, "flaky": flaky}
