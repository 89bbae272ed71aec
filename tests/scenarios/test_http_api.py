"""The HTTP API (`mscheduler.http.create_app`): the routes over a Scheduler, its errors as
JSON, the token, Host and Origin rules, and its OpenAPI document. Every engine, through
httpx's ASGI transport (no socket), the manual clock."""

from __future__ import annotations

import datetime as dt
import json
import re
import typing
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

import mscheduler as ms
from mscheduler.http import create_app
from mscheduler.models import WorkerStateKind
from mscheduler.testing import ManualClock
from tests.engines import until_idle

pytestmark = pytest.mark.anyio
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def client(scheduler: ms.Scheduler) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(scheduler, token=TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1:8700", headers=AUTH
    ) as http:
        yield http


async def _own(client: httpx.AsyncClient, **body: Any) -> list[dict[str, Any]]:
    reply = await client.post("/v1/own", json={"names": ["job"], "worker_id": "w", **body})
    assert reply.status_code == 200, reply.text
    leases: list[dict[str, Any]] = reply.json()["leases"]
    return leases


def _ref(lease: dict[str, Any]) -> dict[str, Any]:
    return {"key": lease["key"], "worker_id": lease["worker_id"], "run_id": lease["run_id"]}


async def test_publish_is_idempotent_by_key(client: httpx.AsyncClient):
    body = {"key": "email:1", "name": "email", "payload": {"to": "a@b.c"}}
    first = await client.post("/v1/tasks", json=body)
    assert first.status_code == 201
    task = first.json()
    assert (task["key"], task["name"], task["state"]) == ("email:1", "email", "pending")
    assert task["payload"] == {"to": "a@b.c"}
    again = await client.post("/v1/tasks", json={**body, "payload": {"to": "other"}})
    assert again.status_code == 200 and again.json()["payload"] == {"to": "a@b.c"}
    got = await client.get("/v1/tasks/email:1")
    assert got.status_code == 200 and got.json()["key"] == "email:1"
    listed = await client.get("/v1/tasks", params={"name": "email", "state": "pending"})
    assert [t["key"] for t in listed.json()["tasks"]] == ["email:1"]


async def test_bson_values_travel_as_relaxed_extended_json(
    client: httpx.AsyncClient, scheduler: ms.Scheduler
):
    body = {"key": "k", "name": "job", "payload": {"at": {"$date": "2030-01-02T03:04:05Z"}}}
    reply = await client.post("/v1/tasks", json=body)
    assert reply.json()["payload"] == {"at": {"$date": "2030-01-02T03:04:05Z"}}
    task = await scheduler.get("k")
    assert task is not None and task.payload["at"].year == 2030  # stored as a BSON date


async def test_canonical_extended_json_is_taken_and_a_malformed_value_is_422(
    client: httpx.AsyncClient, scheduler: ms.Scheduler
):
    canonical = {"n": {"$numberLong": "5"}, "at": {"$date": {"$numberLong": "1893456000000"}}}
    reply = await client.post("/v1/tasks", json={"key": "c", "name": "job", "payload": canonical})
    assert reply.status_code == 201, reply.text
    task = await scheduler.get("c")
    assert task is not None and task.payload["n"] == 5 and task.payload["at"].year == 2030
    decimals = [{"$numberDecimal": text} for text in ("abc", "1e9999999", "1" * 60)]
    for bad in ({"$oid": "zz"}, {"$date": "soon"}, {"$binary": 5}, *decimals):
        body = {"key": "bad", "name": "job", "payload": {"x": bad}}
        reply = await client.post("/v1/tasks", json=body)
        assert reply.status_code == 422, reply.text
        assert reply.json()["error"] == "invalid"
        assert reply.json()["message"].startswith("payload: not valid extended JSON")
    assert await scheduler.get("bad") is None
    [lease] = await _own(client)
    result = {**_ref(lease), "result": {"total": {"$numberDecimal": "abc"}}}
    reply = await client.post("/v1/leases/succeed", json=result)
    assert reply.status_code == 422 and reply.json()["message"].startswith("result: ")


async def test_a_missing_task_is_404_in_json(client: httpx.AsyncClient):
    for method, path in [
        ("GET", "/v1/tasks/nothing"),
        ("POST", "/v1/tasks/nothing/cancel"),
        ("POST", "/v1/tasks/nothing/retry"),
        ("GET", "/v1/tasks/nothing/wait"),
    ]:
        reply = await client.request(method, path)
        assert reply.status_code == 404, (method, path)
        assert reply.json()["error"] == "not_found" and "nothing" in reply.json()["message"]
    no_route = await client.get("/v1/nowhere")
    assert no_route.status_code == 404 and no_route.json()["error"] == "no_route"


@pytest.mark.parametrize("key", ["a/b", "reports/2030/01", "x/wait", "100%/done", "a b/ü"])
async def test_a_key_with_a_slash_is_read_waited_cancelled_and_retried_by_its_encoded_path(
    client: httpx.AsyncClient, key: str
):
    published = await client.post("/v1/tasks", json={"key": key, "name": "job"})
    assert published.status_code == 201
    path = "/v1/tasks/" + urllib.parse.quote(key, safe="")
    got = await client.get(path)
    assert got.status_code == 200 and got.json()["key"] == key
    cancelled = await client.post(path + "/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["changed"] is True
    waited = await client.get(path + "/wait", params={"timeout_ms": 1000})
    assert waited.status_code == 200 and waited.json()["state"] == "cancelled"
    retried = await client.post(path + "/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "pending"
    listed = await client.get("/v1/tasks")
    assert [task["key"] for task in listed.json()["tasks"]] == [key]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "job"}, "key"),
        ({"key": "k", "name": "job", "delay_ms": -1}, "delay_ms"),
        ({"key": "k", "name": "job", "options": {"priority": "high"}}, "priority"),
        ({"key": "k", "name": "job", "surprise": 1}, "surprise"),
        ({"key": "k", "name": "job", "depends_on": ["missing"]}, "missing"),
        ({"key": "k", "name": "job", "replace_finished": ["running"]}, "replace_finished"),
        ({"key": "k", "name": "job", "replace_finished": "fail"}, "replace_finished"),
    ],
)
async def test_a_bad_body_is_422_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient, scheduler: ms.Scheduler, body: dict[str, Any], field: str
):
    reply = await client.post("/v1/tasks", json=body)
    assert reply.status_code == 422
    assert reply.json()["error"] == "invalid" and field in reply.json()["message"]
    assert "\n" not in reply.json()["message"]
    assert await scheduler.list_tasks() == []


async def test_publish_replaces_a_finished_task_by_its_state(
    client: httpx.AsyncClient, scheduler: ms.Scheduler
):
    once = ms.TaskOptions(max_unexpected_retries=0)
    await scheduler.publish("k", {"run": 1}, name="job", options=once)
    lease = await scheduler.store.tasks.claim("w1", key="k")
    assert lease is not None
    await scheduler.store.tasks.fail(lease, RuntimeError("boom"))
    body = {"key": "k", "name": "job", "payload": {"run": 2}}
    kept = await client.post("/v1/tasks", json={**body, "replace_finished": ["cancelled"]})
    assert kept.status_code == 200 and kept.json()["state"] == "fail"
    anew = await client.post("/v1/tasks", json={**body, "replace_finished": ["fail", "cancelled"]})
    assert anew.status_code == 201
    assert (anew.json()["state"], anew.json()["payload"]) == ("pending", {"run": 2})


async def test_a_refusal_names_its_field_once_and_a_body_that_is_no_json_its_position(
    client: httpx.AsyncClient,
):
    """``key: ...``, not ``body.key: ...``; JSON that stops at character 12 is said so, not
    as a field named ``12``."""
    empty_key = await client.post("/v1/tasks", json={"key": "", "name": "job"})
    assert empty_key.status_code == 422 and empty_key.json()["message"].startswith("key: ")
    priority = {"key": "k", "name": "job", "options": {"priority": "high"}}
    nested = await client.post("/v1/tasks", json=priority)
    assert nested.json()["message"] == "options.priority: must be an integer"
    waited = await client.get("/v1/tasks/k/wait", params={"timeout_ms": -5})
    assert waited.json()["message"].startswith("timeout_ms: ")
    broken = b'{"key": "k",, "name": "job"}'
    headers = {"content-type": "application/json"}
    reply = await client.post("/v1/tasks", content=broken, headers=headers)
    assert reply.status_code == 422 and reply.json()["error"] == "invalid"
    assert reply.json()["message"].startswith("body: not valid JSON at position 12")


async def test_own_extend_and_succeed_over_http(client: httpx.AsyncClient):
    for n in range(3):
        await client.post("/v1/tasks", json={"key": f"t{n}", "name": "job", "payload": n})
    leases = await _own(client, max_tasks=2, lease_ms=10_000)
    assert [lease["key"] for lease in leases] == ["t0", "t1"]
    assert leases[0]["task"]["payload"] == 0 and leases[0]["expires_at"]
    extended = await client.post("/v1/leases/extend", json={**_ref(leases[0]), "lease_ms": 20_000})
    assert extended.status_code == 200 and extended.json()["run_id"] == leases[0]["run_id"]
    done = await client.post("/v1/leases/succeed", json={**_ref(leases[0]), "result": {"ok": 1}})
    assert done.status_code == 200
    assert done.json()["state"] == "success" and done.json()["result"] == {"ok": 1}
    again = await client.post("/v1/leases/succeed", json=_ref(leases[0]))
    assert again.status_code == 409 and again.json()["error"] == "lease_lost"


async def test_a_lease_fenced_after_its_expiry_is_409(
    client: httpx.AsyncClient, clock: ManualClock
):
    await client.post("/v1/tasks", json={"key": "t", "name": "job"})
    [lease] = await _own(client, lease_ms=5_000)
    clock.advance(6)
    for route, extra in (("extend", {}), ("succeed", {}), ("fail", {"error": "late"})):
        reply = await client.post(f"/v1/leases/{route}", json={**_ref(lease), **extra})
        assert reply.status_code == 409 and reply.json()["error"] == "lease_lost", route


async def test_a_lease_is_found_by_another_server(
    client: httpx.AsyncClient, scheduler: ms.Scheduler
):
    """Another server (or this one after a restart) knows nothing of the lease: it reads it."""
    await client.post("/v1/tasks", json={"key": "t", "name": "job"})
    [lease] = await _own(client)
    other = create_app(scheduler, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=other), base_url="http://localhost", headers=AUTH
    ) as second:
        released = await second.post("/v1/leases/release", json=_ref(lease))
        assert released.status_code == 200 and released.json()["state"] == "pending"
        forged = await second.post("/v1/leases/release", json={**_ref(lease), "run_id": "forged"})
        assert forged.status_code == 409


async def test_fail_retries_and_release_counts_no_attempt(client: httpx.AsyncClient):
    options = {"max_unexpected_retries": 1, "unexpected_retry_delay_ms": 0}
    await client.post("/v1/tasks", json={"key": "t", "name": "job", "options": options})
    [lease] = await _own(client)
    assert (await client.post("/v1/leases/release", json=_ref(lease))).json()["state"] == "pending"
    [lease] = await _own(client)
    failed = await client.post("/v1/leases/fail", json={**_ref(lease), "error": "boom"})
    assert failed.json()["state"] == "pending"  # one retry left
    [lease] = await _own(client)
    failed = await client.post("/v1/leases/fail", json={**_ref(lease), "error": "boom"})
    assert failed.json()["state"] == "fail"
    retried = await client.post("/v1/tasks/t/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "pending"
    cancelled = await client.post("/v1/tasks/t/cancel")
    assert cancelled.json() == {"changed": True}
    waited = await client.get("/v1/tasks/t/wait", params={"timeout_ms": 1000})
    assert waited.status_code == 200 and waited.json()["state"] == "cancelled"


async def test_wait_is_408_on_timeout(client: httpx.AsyncClient):
    await client.post("/v1/tasks", json={"key": "t", "name": "job"})
    reply = await client.get("/v1/tasks/t/wait", params={"timeout_ms": 0})
    assert reply.status_code == 408 and reply.json()["error"] == "timeout"
    missing = await client.get("/v1/tasks/none/wait", params={"timeout_ms": 1000})
    assert missing.status_code == 404


async def test_pause_resume_and_stats(client: httpx.AsyncClient):
    await client.post("/v1/tasks", json={"key": "t", "name": "job"})
    assert (await client.post("/v1/names/job/pause", json={"reason": "deploy"})).json() == {
        "changed": True
    }
    assert await _own(client) == []
    stats = (await client.get("/v1/stats")).json()["stats"]
    assert [(row["name"], row["state"], row["paused"]) for row in stats] == [
        ("job", "pending", True)
    ]
    assert (await client.post("/v1/names/job/resume")).json() == {"changed": True}
    assert len(await _own(client)) == 1


async def test_own_honours_max_running(client: httpx.AsyncClient, scheduler: ms.Scheduler):
    await scheduler.set_limit("job", max_running=1)
    for n in range(3):
        await client.post("/v1/tasks", json={"key": f"t{n}", "name": "job"})
    [lease] = await _own(client, max_tasks=3)
    assert await _own(client, max_tasks=3) == []
    await client.post("/v1/leases/succeed", json=_ref(lease))
    assert len(await _own(client, max_tasks=3)) == 1


async def test_every_v1_route_needs_the_token(client: httpx.AsyncClient):
    """Without a token, the client is told one is required; with a wrong one, that it is
    wrong."""
    app_routes = [("GET", "/v1/stats"), ("POST", "/v1/own"), ("GET", "/v1/tasks/x")]
    said = {
        "": "token: required",
        "Basic b3BzOnMzY3JldA==": "token: required",
        "Bearer wrong": "token: the bearer token given is wrong",
    }
    for method, path in app_routes:
        for given, message in said.items():
            reply = await client.request(method, path, headers={"Authorization": given}, json={})
            assert reply.status_code == 401, (method, path)
            assert reply.json()["error"] == "unauthorized"
            assert reply.json()["message"].startswith(message), (given, reply.text)


async def test_another_host_or_a_foreign_origin_is_refused(scheduler: ms.Scheduler):
    app = create_app(scheduler, token=TOKEN, allowed_hosts=["tasks.internal"])
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8700", headers=AUTH
    )
    rebound = await client.get("/v1/stats", headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and rebound.json()["error"] == "bad_host"
    for host in ("localhost:8700", "[::1]:8700", "127.0.0.1", "tasks.internal"):
        assert (await client.get("/v1/stats", headers={"Host": host})).status_code == 200
    body = {"key": "k", "name": "job"}
    foreign = await client.post("/v1/tasks", json=body, headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"] == "bad_origin"
    own = await client.post("/v1/tasks", json=body, headers={"Origin": "http://localhost:8700"})
    assert own.status_code == 201
    read = await client.get("/v1/stats", headers={"Origin": "https://evil.example"})
    assert read.status_code == 200  # a read: the browser's same-origin policy guards it
    await client.aclose()


def _dashboard(scheduler: ms.Scheduler, **given: Any) -> Any:
    from mscheduler.dashboard import create_app as dashboard_app

    return dashboard_app(scheduler, **given)


@pytest.mark.parametrize(("make", "path"), [(create_app, "/v1/stats"), (_dashboard, "/")])
async def test_the_api_and_the_dashboard_answer_hosts_by_one_rule(
    scheduler: ms.Scheduler, make: Any, path: str
):
    """With a token and no names given, any Host (the machine's address: ``serve --host
    0.0.0.0``); with names given, those and the loopback ones; without a token, the loopback
    names only."""

    async def status(host: str, **given: Any) -> int:
        transport = httpx.ASGITransport(app=make(scheduler, **given))
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as http:
            return (await http.get(path, headers=AUTH)).status_code

    assert await status("192.0.2.7:8700", token=TOKEN) == 200
    assert await status("tasks.example", token=TOKEN) == 200
    named = {"token": TOKEN, "allowed_hosts": ["tasks.example"]}
    assert await status("tasks.example", **named) == 200
    assert await status("localhost:8700", **named) == 200
    assert await status("192.0.2.7:8700", **named) == 400
    assert await status("127.0.0.1:8700") == 200
    assert await status("192.0.2.7:8700") == 400
    with pytest.raises(ms.MSchedulerError, match=r"^token: "):
        make(scheduler, token=" ")  # a token nobody can present opens nothing


async def test_a_host_given_to_the_app_is_answered(scheduler: ms.Scheduler):
    app = create_app(scheduler, allowed_hosts=["tasks.internal"])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://tasks.internal"
    ) as http:
        assert (await http.get("/v1/stats")).status_code == 200  # no token set: none needed


ROUTES = {  # the API's routes, as the protocol names them (docs/protocol.md)
    ("POST", "/v1/tasks"),
    ("GET", "/v1/tasks"),
    ("GET", "/v1/tasks/{key}"),
    ("POST", "/v1/tasks/{key}/cancel"),
    ("POST", "/v1/tasks/{key}/retry"),
    ("GET", "/v1/tasks/{key}/wait"),
    ("POST", "/v1/own"),
    ("POST", "/v1/leases/extend"),
    ("POST", "/v1/leases/succeed"),
    ("POST", "/v1/leases/fail"),
    ("POST", "/v1/leases/release"),
    ("GET", "/v1/stats"),
    ("POST", "/v1/names/{name}/pause"),
    ("POST", "/v1/names/{name}/resume"),
    ("GET", "/v1/limits"),
    ("PUT", "/v1/limits/{name}"),
    ("DELETE", "/v1/limits/{name}"),
}


async def test_the_openapi_document_validates_and_lists_every_route(client: httpx.AsyncClient):
    validator = pytest.importorskip("openapi_spec_validator")
    reply = await client.get("/openapi.json", headers={"Authorization": ""})
    assert reply.status_code == 200  # the document is public: it holds no data
    document = reply.json()
    validator.validate(document)
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert listed == ROUTES
    for method, path in ROUTES:  # each one is served (a 404 would be a route not mounted)
        concrete = path.replace("{key}", "k").replace("{name}", "n")
        served = await client.request(method, concrete, json={})
        assert served.json().get("error") not in ("no_route", "method_not_allowed"), path
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


async def test_leases_won_for_a_worker_that_left_are_released(scheduler: ms.Scheduler):
    """A worker that stops while its own request waits has closed the connection: what the
    request then wins is handed back (claimable at once, no attempt), not left to expire."""
    await scheduler.publish("t", None, name="job")
    app = create_app(scheduler)
    body = json.dumps({"names": ["job"], "worker_id": "w", "wait_ms": 1000}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/own",
        "raw_path": b"/v1/own",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8700),
    }
    await app(scope, receive, send)
    task = await scheduler.get("t")
    assert task is not None and task.state is ms.TaskState.PENDING
    assert [ws.state for ws in task.worker_states] == [WorkerStateKind.RELEASED]


async def test_the_publish_body_is_publishs_parameters(client: httpx.AsyncClient):
    """One declaration (`PublishParams`): each parameter of `Scheduler.publish` is a field of
    the body (a duration as ``<name>_ms``), and the body has no field of its own."""
    document = (await client.get("/openapi.json")).json()
    schema = document["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]
    ref = schema["application/json"]["schema"]["$ref"].rpartition("/")[2]
    fields = set(document["components"]["schemas"][ref]["properties"])
    params = typing.get_type_hints(ms.models.PublishParams)
    expected = {"key", "name", "payload"} | {
        f"{param}_ms" if dt.timedelta in typing.get_args(kind) else param
        for param, kind in params.items()
    }
    assert fields == expected


async def test_every_publish_parameter_works_over_http(
    client: httpx.AsyncClient, scheduler: ms.Scheduler, clock: ManualClock
):
    async def publish(key: str, **body: Any) -> httpx.Response:
        return await client.post("/v1/tasks", json={"key": key, "name": "job", **body})

    assert (await publish("later", delay_ms=60_000)).json()["options"]["not_before"]
    assert await _own(client) == []
    await publish("p", payload=1)
    updated = await publish("p", payload=2, update_payload=True)
    assert updated.status_code == 200 and updated.json()["payload"] == 2
    waits = await publish("w", depends_on=["nowhere"], allow_missing=True)
    assert waits.status_code == 201 and waits.json()["state"] == "pending"
    for payload in (1, 2):
        debounced = await publish("d", payload=payload, debounce_ms=10_000)
        assert debounced.json()["state"] == "pending"
    assert (await scheduler.get("d")).payload == 2  # type: ignore[union-attr]
    leases = await _own(client, max_tasks=5)
    assert {lease["key"] for lease in leases} == {"p", "w"}
    for lease in leases:
        await client.post("/v1/leases/succeed", json=_ref(lease))
    replaced = await publish("p", payload=3, replace_finished=True)
    assert (replaced.json()["state"], replaced.json()["payload"]) == ("pending", 3)
    clock.advance(61)
    assert {lease["key"] for lease in await _own(client, max_tasks=5)} == {"later", "d", "p"}


async def test_limits_are_set_read_and_removed_over_http(client: httpx.AsyncClient):
    reply = await client.put("/v1/limits/job", json={"max_running": 1})
    assert reply.status_code == 200
    assert reply.json() == {
        "name": "job",
        "rate": None,
        "per_ms": None,
        "max_running": 1,
        "partition_max_running": None,
        "starts_in_window": 0,
        "running": 0,
        "busiest_partition_running": 0,
    }
    for n in range(2):
        await client.post("/v1/tasks", json={"key": f"t{n}", "name": "job"})
    assert len(await _own(client, max_tasks=2)) == 1
    [limit] = (await client.get("/v1/limits")).json()["limits"]
    assert (limit["name"], limit["running"]) == ("job", 1)
    rate = await client.put("/v1/limits/job", json={"rate": 10, "per_ms": 60_000})
    assert (rate.json()["rate"], rate.json()["max_running"]) == (10, None)
    assert len(await _own(client, max_tasks=2)) == 1  # set anew: max_running is gone
    assert (await client.delete("/v1/limits/job")).json() == {"changed": True}
    assert (await client.get("/v1/limits")).json() == {"limits": []}
    assert (await client.delete("/v1/limits/job")).json() == {"changed": False}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rate": 5}, "per"),
        ({}, "max_running"),
        ({"max_running": 0}, "max_running"),
        ({"partition_max_running": 0}, "partition_max_running"),
    ],
)
async def test_a_bad_limit_is_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
):
    reply = await client.put("/v1/limits/job", json=body)
    assert reply.status_code == 422 and field in reply.json()["message"]
    assert (await client.get("/v1/limits")).json() == {"limits": []}


async def test_partitions_and_their_limit_over_http(client: httpx.AsyncClient):
    reply = await client.put("/v1/limits/job", json={"partition_max_running": 1})
    assert reply.status_code == 200 and reply.json()["partition_max_running"] == 1
    for partition in "AB":
        for n in range(2):
            body = {"key": f"{partition}{n}", "name": "job", "options": {"partition": partition}}
            published = await client.post("/v1/tasks", json=body)
            assert published.status_code in (200, 201), published.text
            assert published.json()["options"]["partition"] == partition
    assert sorted(lease["key"] for lease in await _own(client, max_tasks=4)) == ["A0", "B0"]
    [limit] = (await client.get("/v1/limits")).json()["limits"]
    assert (limit["running"], limit["busiest_partition_running"]) == (2, 1)
    bad = await client.post(
        "/v1/tasks", json={"key": "x", "name": "job", "options": {"partition": ""}}
    )
    assert bad.status_code == 422 and "partition" in bad.text


async def test_retry_with_dependents_over_http(client: httpx.AsyncClient):
    await client.post("/v1/tasks", json={"key": "a", "name": "job", "options": {"max_tries": 1}})
    await client.post("/v1/tasks", json={"key": "b", "name": "job", "depends_on": ["a"]})
    for body in (None, {"with_dependents": True}):
        [lease] = await _own(client)
        await client.post("/v1/leases/fail", json={**_ref(lease), "error": "broken"})
        assert (await client.get("/v1/tasks/b")).json()["state"] == "cancelled"
        retried = await client.post("/v1/tasks/a/retry", json=body)
        assert retried.status_code == 200 and retried.json()["state"] == "pending"
    assert (await client.get("/v1/tasks/b")).json()["state"] == "blocked"


_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _times(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if _TIME.match(value) else []
    if isinstance(value, dict):
        return [time for item in value.values() for time in _times(item)]
    if isinstance(value, list):
        return [time for item in value for time in _times(item)]
    return []


async def test_every_time_in_an_answer_is_utc_with_z(client: httpx.AsyncClient):
    await client.post("/v1/tasks", json={"key": "t", "name": "job", "delay_ms": 0})
    await client.post("/v1/tasks", json={"key": "u", "name": "job"})
    await client.put("/v1/limits/job", json={"rate": 5, "per_ms": 1000})
    [lease, other] = await _own(client, max_tasks=2)
    answers = [
        lease,
        (await client.post("/v1/leases/extend", json=_ref(lease))).json(),
        (await client.post("/v1/leases/succeed", json=_ref(lease))).json(),
        (await client.post("/v1/leases/fail", json={**_ref(other), "error": "x"})).json(),
        (await client.get("/v1/tasks")).json(),
        (await client.get("/v1/stats")).json(),
        (await client.get("/v1/limits")).json(),
    ]
    times = _times(answers)
    assert len(times) >= 10
    assert [time for time in times if not time.endswith("Z")] == []


async def test_a_waiting_own_is_answered_when_a_task_it_may_claim_is_due(
    client: httpx.AsyncClient, scheduler: ms.Scheduler, clock: ManualClock
):
    """The soonest task of the names asked for is of a paused name: the request is answered
    when a later task of another name is due, not at the end of its wait."""
    await scheduler.publish("held", None, name="paused")
    await scheduler.pause("paused")
    await scheduler.publish("later", None, name="job", delay=1)
    replies: list[httpx.Response] = []

    async def own() -> None:
        body = {"names": ["paused", "job"], "worker_id": "w", "wait_ms": 10_000}
        replies.append(await client.post("/v1/own", json=body))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(own)
        await until_idle()
        assert not replies
        clock.advance(1)
        with anyio.fail_after(10):
            while not replies:
                await until_idle()
    [reply] = replies
    assert reply.status_code == 200, reply.text
    assert [lease["key"] for lease in reply.json()["leases"]] == ["later"]
    waited = clock.now() - dt.datetime.fromisoformat(
        reply.json()["leases"][0]["task"]["created_at"]
    )
    assert waited < dt.timedelta(seconds=2)


@pytest.mark.parametrize("declared", [True, False])
async def test_a_body_over_the_limit_is_413_before_it_is_read(
    scheduler: ms.Scheduler, declared: bool
):
    """60 MB posted: refused by its Content-Length before a byte is read, or, sent without
    one (chunked), as soon as what was read passes the limit; nothing is written."""
    from mscheduler.http.capped import MAX_BODY_BYTES

    app = create_app(scheduler)
    chunk = b" " * (1 << 20)
    total = 60 << 20
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        more = reads * len(chunk) < total
        return {"type": "http.request", "body": chunk, "more_body": more}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    if declared:
        headers.append((b"content-length", str(total).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/tasks",
        "raw_path": b"/v1/tasks",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8700),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 413
    answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert answer["error"] == "too_large" and answer["message"].startswith("body: ")
    assert reads == (0 if declared else MAX_BODY_BYTES // len(chunk) + 1)
    assert await scheduler.list_tasks() == []
