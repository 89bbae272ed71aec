"""The Host and Origin rules of our web apps (`mscheduler.host_guard`), on bare ASGI scopes."""

from __future__ import annotations

from typing import Any

import pytest

from mscheduler.host_guard import LOOPBACK_HOSTS, allowed_host_names, host_name, refusal

LOOPBACK = allowed_host_names(LOOPBACK_HOSTS)


def scope(method: str = "GET", kind: str = "http", **headers: str) -> dict[str, Any]:
    raw = [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    return {"type": kind, "method": method, "headers": raw}


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LOCALHOST.", "localhost"),
        ("[::1]:8080", "[::1]"),
        ("::1", "[::1]"),
        ("ops.example.com", "ops.example.com"),
        ("", ""),
    ],
)
def test_a_host_is_compared_by_its_name_alone(given: str, name: str) -> None:
    assert host_name(given) == name


def test_reads_are_answered_for_the_names_served_only() -> None:
    assert refusal(scope(host="localhost:8080"), LOOPBACK) is None
    assert refusal(scope(host="[::1]:8080"), LOOPBACK) is None
    for host in ("attacker.example:8080", "127.0.0.1.attacker.example", ""):
        refused = refusal(scope(host=host), LOOPBACK)
        assert refused is not None and refused[0] == 400, host
    assert refusal(scope(host="anything.example"), allowed_host_names(["*"])) is None


def test_a_write_the_browser_says_came_from_elsewhere_is_refused() -> None:
    own = {"host": "127.0.0.1:8080"}
    assert refusal(scope("POST", **own), LOOPBACK) is None  # no browser: the host decides
    assert refusal(scope("POST", origin="http://127.0.0.1:8080", **own), LOOPBACK) is None
    assert refusal(scope("POST", sec_fetch_site="same-origin", **own), LOOPBACK) is None
    for headers in (
        {"origin": "http://attacker.example"},
        {"origin": "null"},
        {"sec_fetch_site": "cross-site"},
        {"sec_fetch_site": "same-site"},
    ):
        refused = refusal(scope("POST", **own, **headers), LOOPBACK)
        assert refused is not None and refused[0] == 403, headers
    # A websocket is a write whatever its method; under "*", the Origin must match the Host.
    anywhere = allowed_host_names(["*"])
    socket = scope(kind="websocket", host="ops.example.com", origin="https://evil.example")
    assert refusal(socket, anywhere) is not None
    same = scope(kind="websocket", host="ops.example.com", origin="https://ops.example.com")
    assert refusal(same, anywhere) is None
