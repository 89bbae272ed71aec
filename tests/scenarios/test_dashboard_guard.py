"""Who the dashboard answers and what it lets through, on both engines: every action needs
the page's CSRF token, a read-only dashboard offers none, a token-protected one answers nobody
without it, one without a token answers only the loopback names (or the hosts it is given),
no write another origin's page sent is accepted, and no page can be framed."""

from __future__ import annotations

import base64

import pytest

import mscheduler as ms
from mscheduler.cli.web import allowed_hosts, is_loopback
from mscheduler.dashboard import create_app
from mscheduler.errors import ConfigurationError
from mscheduler.host_guard import served_hosts
from mscheduler.testing import ManualClock
from tests.scenarios.test_dashboard import client, csrf_of, sched_fill

pytestmark = pytest.mark.anyio


@pytest.fixture
async def filled(scheduler: ms.Scheduler, clock: ManualClock) -> ms.Scheduler:
    await sched_fill(scheduler, clock)
    return scheduler


async def test_every_action_without_the_csrf_token_is_refused_and_changes_nothing(
    filled: ms.Scheduler,
):
    async with client(create_app(filled)) as http:
        for path in (
            "/tasks/email:0/cancel",
            "/tasks/email:broken/retry",
            "/names/email/pause",
            "/names/sms/resume",
            "/names/email/retry-failed",
        ):
            for form in ({}, {"csrf": "forged"}):
                refused = await http.post(path, data=form)
                assert refused.status_code == 403, (path, form)
    assert (await filled.get("email:0")).state is ms.TaskState.PENDING
    assert (await filled.get("email:broken")).state is ms.TaskState.FAIL
    assert set(await filled.paused()) == {"sms"}


async def test_a_read_only_dashboard_offers_no_action_and_accepts_none(filled: ms.Scheduler):
    async with client(create_app(filled, read_only=True)) as http:
        overview = (await http.get("/")).text
        task = (await http.get("/tasks/email:0")).text
        refused = await http.post("/tasks/email:0/cancel", data={"csrf": "anything"})
        pause = await http.post("/names/email/pause", data={})
    assert '<form method="post"' not in overview + task
    assert refused.status_code == 405 and pause.status_code in (404, 405)
    assert (await filled.get("email:0")).state is ms.TaskState.PENDING
    assert set(await filled.paused()) == {"sms"}


async def test_a_dashboard_with_a_token_answers_nobody_without_it(filled: ms.Scheduler):
    app = create_app(filled, token="s3cret")
    basic = base64.b64encode(b"ops:s3cret").decode()
    async with client(app) as anonymous:
        denied = await anonymous.get("/")
        denied_post = await anonymous.post("/tasks/email:0/cancel", data={})
    async with client(app, Authorization="Basic " + base64.b64encode(b"ops:nope").decode()) as bad:
        wrong = await bad.get("/tasks")
    async with client(app, Authorization=f"Basic {basic}") as browser:
        allowed = await browser.get("/")
    async with client(app, Authorization="Bearer s3cret") as script:
        assert (await script.get("/tasks/email:0")).status_code == 200
    assert denied.status_code == denied_post.status_code == wrong.status_code == 401
    assert denied.headers["www-authenticate"].startswith("Basic")
    assert "needs its token" in denied.text and "wrong" not in denied.text
    assert wrong.text.startswith("token: the token given is wrong")
    assert allowed.status_code == 200
    assert (await filled.get("email:0")).state is ms.TaskState.PENDING
    with pytest.raises(ConfigurationError, match="token"):
        create_app(filled, token=" ")


async def test_a_dashboard_without_a_token_answers_only_the_loopback_names(
    filled: ms.Scheduler,
):
    """DNS rebinding: a page of attacker.example whose name now points at 127.0.0.1 reaches
    the dashboard as ``Host: attacker.example``, and must read nothing and change nothing."""
    app = create_app(filled)
    for base in ("http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"):
        async with client(app, base) as http:
            assert (await http.get("/tasks/email:0")).status_code == 200, base
    async with client(app) as http:
        token = csrf_of((await http.get("/tasks/email:0")).text)
    async with client(app, "http://attacker.example:8080") as rebound:
        page = await rebound.get("/tasks/email:0")
        listing = await rebound.get("/tasks")
        cancel = await rebound.post("/tasks/email:0/cancel", data={"csrf": token})
    assert page.status_code == listing.status_code == cancel.status_code == 400
    assert "user0@example.com" not in page.text + listing.text
    assert token not in page.text + listing.text
    assert (await filled.get("email:0")).state is ms.TaskState.PENDING


async def test_a_write_a_page_of_another_origin_sent_is_refused(filled: ms.Scheduler):
    async with client(create_app(filled)) as http:
        token = csrf_of((await http.get("/")).text)
        refused = [
            await http.post("/tasks/email:0/cancel", data={"csrf": token}, headers=headers)
            for headers in (
                {"Origin": "http://attacker.example"},
                {"Origin": "null"},
                {"Sec-Fetch-Site": "cross-site"},
                {"Sec-Fetch-Site": "same-site", "Origin": "http://localhost:3000"},
            )
        ]
        assert [answer.status_code for answer in refused] == [403] * 4
        assert (await filled.get("email:0")).state is ms.TaskState.PENDING
        same_origin = {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}
        done = await http.post("/tasks/email:0/cancel", data={"csrf": token}, headers=same_origin)
    assert done.status_code == 303
    assert (await filled.get("email:0")).state is ms.TaskState.CANCELLED


async def test_no_page_of_the_dashboard_can_be_framed(filled: ms.Scheduler):
    async with client(create_app(filled)) as http:
        answers = [await http.get(path) for path in ("/", "/tasks", "/tasks/email:0", "/nothing")]
    for answer in answers:
        assert answer.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


async def test_a_mounted_dashboard_answers_the_hosts_it_is_given_or_any_behind_a_token(
    filled: ms.Scheduler,
):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    named = Starlette(
        routes=[Mount("/ops", app=create_app(filled, allowed_hosts=["ops.example.com"]))]
    )
    async with client(named, "https://ops.example.com") as http:
        assert (await http.get("/ops/")).status_code == 200
    async with client(named, "https://attacker.example") as http:
        assert (await http.get("/ops/")).status_code == 400
    tokened = create_app(filled, token="s3cret")
    async with client(tokened, "https://ops.example.com", Authorization="Bearer s3cret") as http:
        assert (await http.get("/")).status_code == 200  # the token is what guards it
    with pytest.raises(ConfigurationError, match="allowed_hosts"):
        create_app(filled, allowed_hosts="ops.example.com")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="allowed_hosts"):
        create_app(filled, allowed_hosts=[""])


def test_the_command_serves_the_loopback_names_and_the_host_it_binds():
    def served(host: str, token: str | None, extra: list[str]) -> frozenset[str]:
        given = allowed_hosts(host, token=token, extra=extra)
        return served_hosts(given, token=token)

    loopback = {"127.0.0.1", "localhost", "[::1]"}
    assert loopback <= served("127.0.0.1", None, [])
    assert "ops.internal" not in served("127.0.0.1", None, [])
    assert "127.0.0.2" in served("127.0.0.2", None, [])
    assert "[::1]" in served("::1", None, [])
    assert "ops.internal" in served("127.0.0.1", None, ["ops.internal"])
    assert allowed_hosts("0.0.0.0", token="t", extra=[]) is None  # any: the token guards
    assert served("0.0.0.0", "t", ["ops.internal"]) >= {"ops.internal", *loopback}


def test_only_loopback_addresses_go_without_a_token():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.7", "example.com", ""]))
