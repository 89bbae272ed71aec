"""The protocol's scenarios (docs/protocol.md) through the HTTP API, against any endpoint
(`conftest.endpoint`). An endpoint's clock cannot be moved from here: the expiry scenario
waits, in real time, for a lease of a fraction of a second."""

from __future__ import annotations

import ast
import pathlib
import re
import time
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import Endpoint


def publish(api: httpx.Client, key: str, name: str, **fields: Any) -> httpx.Response:
    return api.post("/v1/tasks", json={"key": key, "name": name, **fields})


def own(api: httpx.Client, name: str, **fields: Any) -> list[dict[str, Any]]:
    body = {"names": [name], "worker_id": "conformance", **fields}
    reply = api.post("/v1/own", json=body)
    assert reply.status_code == 200, reply.text
    leases: list[dict[str, Any]] = reply.json()["leases"]
    return leases


def ref(lease: dict[str, Any]) -> dict[str, Any]:
    return {key: lease[key] for key in ("key", "worker_id", "run_id")}


def state(api: httpx.Client, key: str) -> str:
    return str(api.get(f"/v1/tasks/{key}").json()["state"])


def test_publish_is_idempotent_by_key(api: httpx.Client, name: str):
    key = f"{name}:1"
    first = publish(api, key, name, payload={"n": 1})
    assert first.status_code == 201 and first.json()["state"] == "pending"
    again = publish(api, key, name, payload={"n": 2})
    assert again.status_code == 200 and again.json()["payload"] == {"n": 1}


def test_a_bad_body_is_422_and_writes_nothing(api: httpx.Client, name: str):
    key = f"{name}:bad"
    reply = publish(api, key, name, options={"priority": "high"})
    assert reply.status_code == 422 and reply.json()["error"] == "invalid"
    assert api.get(f"/v1/tasks/{key}").status_code == 404


def test_the_token_is_required(endpoint: Endpoint):
    if endpoint.token is None:
        pytest.skip("the endpoint has no token")
    with endpoint.client(token=None) as anonymous:
        reply = anonymous.get("/v1/stats")
    assert reply.status_code == 401 and reply.json()["error"] == "unauthorized"


def test_own_takes_the_best_first_and_extend_then_succeed(api: httpx.Client, name: str):
    for n, priority in enumerate([0, 5, 0]):
        publish(api, f"{name}:{n}", name, options={"priority": priority})
    leases = own(api, name, max_tasks=2, lease_ms=30_000)
    assert [lease["key"] for lease in leases] == [f"{name}:1", f"{name}:0"]
    extended = api.post("/v1/leases/extend", json={**ref(leases[0]), "lease_ms": 60_000})
    assert extended.status_code == 200 and extended.json()["run_id"] == leases[0]["run_id"]
    done = api.post("/v1/leases/succeed", json={**ref(leases[0]), "result": {"ok": True}})
    assert done.status_code == 200 and done.json()["state"] == "success"
    assert done.json()["result"] == {"ok": True}
    twice = api.post("/v1/leases/succeed", json=ref(leases[0]))
    assert twice.status_code == 409 and twice.json()["error"] == "lease_lost"
    released = api.post("/v1/leases/release", json=ref(leases[1]))
    assert released.status_code == 200 and released.json()["state"] == "pending"


def test_a_lease_is_fenced_after_its_expiry(api: httpx.Client, name: str):
    publish(api, f"{name}:1", name)
    [lease] = own(api, name, lease_ms=200)
    time.sleep(0.5)
    late = api.post("/v1/leases/succeed", json=ref(lease))
    assert late.status_code == 409 and late.json()["error"] == "lease_lost"
    [taken] = own(api, name)
    assert taken["key"] == lease["key"] and taken["run_id"] != lease["run_id"]
    assert api.post("/v1/leases/succeed", json=ref(taken)).json()["state"] == "success"


def test_a_failed_attempt_is_retried_and_a_release_is_no_attempt(api: httpx.Client, name: str):
    key = f"{name}:1"
    options = {"max_unexpected_retries": 1, "unexpected_retry_delay_ms": 0}
    publish(api, key, name, options=options)
    [lease] = own(api, name)
    api.post("/v1/leases/release", json=ref(lease))
    for expected in ("pending", "fail"):
        [lease] = own(api, name)
        failed = api.post("/v1/leases/fail", json={**ref(lease), "error": "broken"})
        assert failed.status_code == 200 and failed.json()["state"] == expected
    assert own(api, name) == []
    assert api.post(f"/v1/tasks/{key}/retry").json()["state"] == "pending"


def test_a_dependent_waits_for_its_dependency(api: httpx.Client, name: str):
    first, then = f"{name}:first", f"{name}:then"
    publish(api, first, name)
    assert publish(api, then, name, depends_on=[first]).json()["state"] == "blocked"
    [lease] = own(api, name, max_tasks=5)
    assert lease["key"] == first
    api.post("/v1/leases/succeed", json=ref(lease))
    assert state(api, then) == "pending"
    assert [lease["key"] for lease in own(api, name)] == [then]


def test_a_paused_name_is_not_owned(api: httpx.Client, name: str):
    publish(api, f"{name}:1", name)
    assert api.post(f"/v1/names/{name}/pause", json={"reason": "conformance"}).status_code == 200
    try:
        assert own(api, name) == []
        paused = [row for row in api.get("/v1/stats").json()["stats"] if row["name"] == name]
        assert paused and all(row["paused"] for row in paused)
    finally:
        api.post(f"/v1/names/{name}/resume")
    assert len(own(api, name)) == 1


def test_max_running_holds_across_owners(api: httpx.Client, name: str):
    limit = api.put(f"/v1/limits/{name}", json={"max_running": 1})
    assert limit.status_code == 200, limit.text
    assert (limit.json()["name"], limit.json()["max_running"]) == (name, 1)
    try:
        for n in range(3):
            publish(api, f"{name}:{n}", name)
        [lease] = own(api, name, max_tasks=3)
        assert own(api, name, max_tasks=3) == []
        [row] = [row for row in api.get("/v1/limits").json()["limits"] if row["name"] == name]
        assert row["running"] == 1
        api.post("/v1/leases/succeed", json=ref(lease))
        assert len(own(api, name, max_tasks=3)) == 1
    finally:
        assert api.delete(f"/v1/limits/{name}").json() == {"changed": True}
    assert len(own(api, name, max_tasks=3)) == 1  # no limit now: the last one too
    assert all(row["name"] != name for row in api.get("/v1/limits").json()["limits"])


def test_a_rate_limit_holds_and_a_bad_limit_is_422(api: httpx.Client, name: str):
    bad = api.put(f"/v1/limits/{name}", json={"rate": 1})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid"
    assert api.put(f"/v1/limits/{name}", json={"rate": 1, "per_ms": 60_000}).status_code == 200
    try:
        publish(api, f"{name}:1", name)
        publish(api, f"{name}:2", name)
        assert len(own(api, name, max_tasks=2)) == 1
        assert own(api, name) == []
    finally:
        api.delete(f"/v1/limits/{name}")


def test_retry_with_dependents_revives_what_the_failure_cancelled(api: httpx.Client, name: str):
    first, then = f"{name}:first", f"{name}:then"
    publish(api, first, name, options={"max_tries": 1})
    publish(api, then, name, depends_on=[first])
    [lease] = own(api, name)
    api.post("/v1/leases/fail", json={**ref(lease), "error": "broken"})
    assert state(api, then) == "cancelled"
    retried = api.post(f"/v1/tasks/{first}/retry", json={"with_dependents": True})
    assert retried.status_code == 200 and retried.json()["state"] == "pending"
    assert state(api, then) == "blocked"


def test_publish_takes_publishs_parameters(api: httpx.Client, name: str):
    later, kept = f"{name}:later", f"{name}:kept"
    assert publish(api, later, name, delay_ms=60_000).json()["options"]["not_before"]
    publish(api, kept, name, payload=1)
    updated = publish(api, kept, name, payload=2, update_payload=True)
    assert updated.status_code == 200 and updated.json()["payload"] == 2
    free = publish(api, f"{name}:free", name, depends_on=[f"{name}:none"], allow_missing=True)
    assert free.json()["state"] == "pending"
    assert {lease["key"] for lease in own(api, name, max_tasks=5)} == {kept, f"{name}:free"}


def test_list_tasks_by_name_and_state(api: httpx.Client, name: str):
    keys = [f"{name}:{n}" for n in range(3)]
    for key in keys:
        publish(api, key, name)
    [lease] = own(api, name)
    pending = api.get("/v1/tasks", params={"name": name, "state": "pending"}).json()["tasks"]
    assert sorted(task["key"] for task in pending) == sorted(set(keys) - {lease["key"]})
    assert len(api.get("/v1/tasks", params={"name": name, "limit": 1}).json()["tasks"]) == 1


def test_every_time_is_utc_in_one_form(api: httpx.Client, name: str):
    publish(api, f"{name}:1", name, delay_ms=0)
    [lease] = own(api, name)
    times = [lease["expires_at"], lease["task"]["created_at"], lease["task"]["updated_at"]]
    times += [ws["ping_expire_at"] for ws in lease["task"]["worker_states"]]
    assert [time for time in times if not time.endswith("Z")] == []


def test_wait_returns_the_ended_task_or_408(api: httpx.Client, name: str):
    key = f"{name}:1"
    publish(api, key, name)
    assert api.get(f"/v1/tasks/{key}/wait", params={"timeout_ms": 100}).status_code == 408
    assert api.post(f"/v1/tasks/{key}/cancel").json() == {"changed": True}
    ended = api.get(f"/v1/tasks/{key}/wait", params={"timeout_ms": 5_000})
    assert ended.status_code == 200 and ended.json()["state"] == "cancelled"


def _routes_called() -> set[tuple[str, str]]:
    """(method, path) of every request this file makes, its placeholders as ``{}``."""
    called = set()
    for node in ast.walk(ast.parse(pathlib.Path(__file__).read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr.upper()
        if method not in {"GET", "POST", "PUT", "DELETE"} or not node.args:
            continue
        path = node.args[0]
        if isinstance(path, ast.Constant) and isinstance(path.value, str):
            called.add((method, path.value))
        elif isinstance(path, ast.JoinedStr):
            text = "".join(
                str(part.value) if isinstance(part, ast.Constant) else "{}" for part in path.values
            )
            called.add((method, text))
    return called


def test_every_route_has_a_scenario(api: httpx.Client):
    """The routes the endpoint's OpenAPI document lists are each called by a scenario here."""
    document = api.get("/openapi.json")
    if document.status_code != 200:
        pytest.skip("the endpoint serves no /openapi.json")
    routes = {
        (method.upper(), re.sub(r"{[^}]*}", "{}", path))
        for path, item in document.json()["paths"].items()
        for method in item
    }
    assert routes - _routes_called() == set()
