"""The HTTP API's new bodies (publish's parameters, retry's, a limit's), refused as a user
would get them wrong: each refusal is 422 naming the field, and nothing is written. Every
engine, through httpx's ASGI transport (no socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import mscheduler as ms
from mscheduler.http import create_app

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(scheduler: ms.Scheduler) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(scheduler))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8700") as http:
        yield http


@pytest.mark.parametrize("field", ["update_payload", "replace_finished", "allow_missing"])
@pytest.mark.parametrize("value", ["yes", "false", 1, 0])
async def test_a_publish_flag_that_is_no_boolean_is_refused(
    client: httpx.AsyncClient, scheduler: ms.Scheduler, field: str, value: Any
):
    """A flag is JSON true or false: "false" read as true would replace a finished task."""
    reply = await client.post("/v1/tasks", json={"key": "k", "name": "job", field: value})
    assert reply.status_code == 422
    assert reply.json()["message"].split(":")[0].endswith(field)  # the field, first
    assert await scheduler.get("k") is None


@pytest.mark.parametrize("value", ["yes", 1])
async def test_retry_with_dependents_that_is_no_boolean_is_refused(
    client: httpx.AsyncClient, value: Any
):
    await client.post("/v1/tasks", json={"key": "a", "name": "job"})
    await client.post("/v1/tasks/a/cancel")
    reply = await client.post("/v1/tasks/a/retry", json={"with_dependents": value})
    assert reply.status_code == 422
    assert reply.json()["message"].split(":")[0].endswith("with_dependents")
    assert (await client.get("/v1/tasks/a")).json()["state"] == "cancelled"
