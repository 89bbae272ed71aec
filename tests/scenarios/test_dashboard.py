"""The dashboard's pages as an ASGI app, on both engines: what an operator sees on each page,
that the task list pages through an index (the memory engine refuses any query no index
serves), what the actions do, and that open pages refresh when tasks change. Who may read and
act is `test_dashboard_guard.py`; the installed command in a browser is
`tests/acceptance/test_dashboard_in_a_browser.py`."""

from __future__ import annotations

import datetime as dt
import html
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

import mscheduler as ms
from mscheduler.dashboard import create_app
from mscheduler.dashboard.events import refresh_signals
from mscheduler.models import WorkerInfo
from mscheduler.testing import ManualClock
from tests.engines import worker

pytestmark = pytest.mark.anyio


def client(app: Any, base_url: str = "http://127.0.0.1:8080", **headers: str) -> httpx.AsyncClient:
    """A browser on this machine (the address the dashboard binds by default)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=base_url, headers=headers
    )


def text_of(page: str) -> str:
    """The page as a reader sees it: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def row_of(page: str, name: str) -> str:
    found = re.search(rf'<tr data-name="{re.escape(name)}">(.*?)</tr>', page, re.S)
    assert found, f"no row for {name}"
    return found[1]


def count_in(row: str, state: str) -> int:
    cell = re.search(rf'data-state="{state}">(.*?)</td>', row, re.S)
    assert cell
    return int(text_of(cell[1]))


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no action form"
    return found[1]


async def finish(sched: ms.Scheduler, key: str, outcome: str) -> None:
    lease = await sched.store.tasks.claim("w1", key=key)
    assert lease is not None
    if outcome == "success":
        await sched.store.tasks.succeed(lease, {"sent": True})
    else:
        try:
            raise RuntimeError("smtp refused")
        except RuntimeError as exc:  # raised, so the stored error has its traceback
            await sched.store.tasks.fail(lease, exc, final=True)


@pytest.fixture
async def filled(scheduler: ms.Scheduler, clock: ManualClock) -> ms.Scheduler:
    await sched_fill(scheduler, clock)
    return scheduler


async def sched_fill(sched: ms.Scheduler, clock: ManualClock) -> None:
    for n in range(3):
        await sched.publish(f"email:{n}", {"to": f"user{n}@example.com"}, name="email")
    await sched.publish("email:sent", {"to": "done@example.com"}, name="email")
    await finish(sched, "email:sent", "success")
    clock.advance(600)  # the next one ends ten minutes later: another bar of the chart
    await sched.publish("email:broken", {"to": "x"}, name="email")
    await finish(sched, "email:broken", "fail")
    await sched.publish("sms:1", {"text": "hi"}, name="sms")
    await sched.pause("sms", reason="provider outage")
    await sched.set_limit("email", rate=100, per=dt.timedelta(minutes=1), max_running=5)
    await sched.schedule("nightly", name="report", cron="0 3 * * *")


# ------------------------------------------------------------------------ pages


async def test_the_overview_shows_each_name_with_its_counts_pause_limits_and_schedules(
    filled: ms.Scheduler,
):
    async with client(create_app(filled)) as http:
        page = (await http.get("/")).text
    email, sms, report = row_of(page, "email"), row_of(page, "sms"), row_of(page, "report")
    assert [count_in(email, s) for s in ("pending", "success", "fail")] == [3, 1, 1]
    assert count_in(sms, "pending") == 1
    assert "paused: provider outage" in text_of(sms)
    assert "paused" not in text_of(email)
    assert "0/100 per 1m" in text_of(email) and "0/5 running" in text_of(email)
    assert "0 3 * * *" in text_of(report)  # a schedule before any of its tasks exists
    assert "1 succeeded" in text_of(page) and "1 failed" in text_of(page)
    # Two bars in the chart of the last hour: the success, and the failure ten minutes later.
    assert len(re.findall(r'class="ok"/>', page)) == 1
    assert len(re.findall(r'class="bad"/>', page)) == 1


async def test_the_overview_fragment_is_the_live_part_of_the_page(filled: ms.Scheduler):
    async with client(create_app(filled)) as http:
        before = await http.get("/fragments/overview")
        await filled.publish("email:new", None, name="email")
        after = await http.get("/fragments/overview")
    assert "<html" not in before.text
    assert count_in(row_of(before.text, "email"), "pending") == 3
    assert count_in(row_of(after.text, "email"), "pending") == 4


async def test_the_task_page_shows_payload_result_error_history_and_links(
    scheduler: ms.Scheduler,
):
    sched = scheduler
    await sched.publish("extract", {"table": "orders"}, name="etl")
    await sched.publish("load", {"into": "warehouse"}, name="etl", depends_on=["extract"])
    await sched.publish("report", None, name="etl", depends_on=["load"])
    await finish(sched, "extract", "success")
    lease = await sched.store.tasks.claim("w7", key="load")
    assert lease is not None
    await lease.progress(0.25, "copied 1/4")
    await sched.store.tasks.ping(lease)
    await sched.publish("bad", None, name="etl", options=ms.TaskOptions(max_unexpected_retries=0))
    await finish(sched, "bad", "fail")
    async with client(create_app(sched)) as http:
        load = (await http.get("/tasks/load")).text
        extract = (await http.get("/tasks/extract")).text
        bad = (await http.get("/tasks/bad")).text
        missing = await http.get("/tasks/nothing")
    assert '"into": "warehouse"' in html.unescape(load)
    assert "25% copied 1/4" in text_of(load)
    assert "w7" in text_of(load)  # the running attempt in the worker-state history
    assert 'href="/tasks/extract"' in load and 'href="/tasks/report"' in load
    assert "extract success" in text_of(load) and "report blocked" in text_of(load)
    assert '"sent": true' in html.unescape(extract)
    assert "RuntimeError: smtp refused" in text_of(bad)
    traceback = re.search(r'<pre class="traceback">(.*?)</pre>', bad, re.S)
    assert traceback and "in finish" in traceback[1]
    assert missing.status_code == 404 and "no task has the key 'nothing'" in text_of(missing.text)


async def test_a_retried_task_s_page_shows_every_run_and_revives_its_dependents(
    scheduler: ms.Scheduler,
):
    sched = scheduler
    once = ms.TaskOptions(max_unexpected_retries=0)
    await sched.publish("export", None, name="etl", options=once)
    await sched.publish("mail", None, name="etl", depends_on=["export"])
    await finish(sched, "export", "fail")
    async with client(create_app(sched)) as http:
        failed = (await http.get("/tasks/export")).text
        assert "Retry with 1 cancelled dependent" in text_of(failed)
        retried = await http.post(
            "/tasks/export/retry", data={"csrf": csrf_of(failed), "with_dependents": "1"}
        )
        assert retried.status_code == 303
        assert retried.headers["location"] == "/tasks/export?revived=mail"
        page = (await http.get(retried.headers["location"])).text
    shown = text_of(page)
    assert "Revived dependents: mail" in shown and "run 2 of this key" in shown
    assert "Attempts: not started" not in shown
    rows = re.findall(r'<tr data-run="(\d+)">(.*?)</tr>', page, re.S)
    assert [run for run, _ in rows] == ["1"]
    assert "w1" in text_of(rows[0][1]) and "RuntimeError: smtp refused" in text_of(rows[0][1])
    assert "<section><h3>Error</h3>" not in page  # pending: no outcome, no error box
    assert (await sched.get("mail")).state is ms.TaskState.BLOCKED  # type: ignore[union-attr]


async def test_a_key_with_slashes_and_spaces_has_a_page_and_actions(scheduler: ms.Scheduler):
    await scheduler.publish("export/2026 01/main", {"n": 1}, name="export")
    async with client(create_app(scheduler)) as http:
        listing = (await http.get("/tasks?name=export")).text
        link = re.search(r'href="(/tasks/export[^"]*)"', listing)
        assert link
        page = await http.get(link[1])
        assert page.status_code == 200 and "export/2026 01/main" in page.text
        done = await http.post(link[1] + "/cancel", data={"csrf": csrf_of(page.text)})
    assert done.status_code == 303
    assert (await scheduler.get("export/2026 01/main")).state is ms.TaskState.CANCELLED


async def test_mounted_under_a_path_its_links_forms_and_redirects_keep_the_path(
    filled: ms.Scheduler,
):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops/queue", app=create_app(filled))])
    async with client(host) as http:
        overview = (await http.get("/ops/queue/")).text
        task = (await http.get("/ops/queue/tasks/email:0")).text
        asset = await http.get("/ops/queue/static/htmx.min.js")
        done = await http.post("/ops/queue/tasks/email:0/cancel", data={"csrf": csrf_of(task)})
    assert 'href="/ops/queue/tasks?name=email"' in overview
    assert 'src="/ops/queue/static/htmx.min.js"' in overview
    assert 'action="/ops/queue/tasks/email%3A0/cancel"' in task
    assert asset.status_code == 200
    assert done.status_code == 303 and done.headers["location"] == "/ops/queue/tasks/email%3A0"


# ------------------------------------------------------------------------ the task list


def flat(pages: list[list[str]]) -> list[str]:
    return [key for page in pages for key in page]


async def every_page(sched: ms.Scheduler, **filters: str) -> list[list[str]]:
    pages, after = [], None
    while True:
        page = await sched.browse.task_page(limit=3, after=after, **filters)
        pages.append([task.key for task in page.tasks])
        if page.after is None:
            return pages
        after = page.after


async def test_the_task_list_pages_through_every_filter_on_an_index(
    scheduler: ms.Scheduler, clock: ManualClock
):
    """The memory engine refuses a query no declared index serves (notablescan): every
    order, every filter and every later page here is served by one."""
    sched = scheduler
    for n in range(7):
        clock.advance(1)
        priority = 5 if n == 4 else 0
        options = ms.TaskOptions(priority=priority)
        await sched.publish(f"mail:{n}", None, name="email", options=options)
        await sched.publish(f"text:{n}", None, name="sms")
    await sched.cancel("mail:1")
    await sched.cancel("text:2")

    by_key = await every_page(sched, prefix="mail:")
    assert by_key == [["mail:0", "mail:1", "mail:2"], ["mail:3", "mail:4", "mail:5"], ["mail:6"]]
    # Claim order: the high priority first, then oldest first.
    by_claim = await every_page(sched, name="email")
    assert flat(by_claim) == [
        "mail:4",
        "mail:0",
        "mail:1",
        "mail:2",
        "mail:3",
        "mail:5",
        "mail:6",
    ]
    assert [len(page) for page in by_claim] == [3, 3, 1]
    pending_email = flat(await every_page(sched, name="email", state="pending"))
    assert pending_email == ["mail:4", "mail:0", "mail:2", "mail:3", "mail:5", "mail:6"]
    cancelled = flat(await every_page(sched, state="cancelled"))
    assert sorted(cancelled) == ["mail:1", "text:2"]
    newest = flat(await every_page(sched))
    assert newest[:2] == ["text:6", "mail:6"] and len(newest) == 14
    prefix_and_state = flat(await every_page(sched, prefix="text:", state="cancelled"))
    assert prefix_and_state == ["text:2"]


async def test_the_task_list_pages_in_the_browser_and_refuses_a_forged_position(
    scheduler: ms.Scheduler,
):
    for n in range(5):
        await scheduler.publish(f"job:{n}", None, name="job")
    async with client(create_app(scheduler, page_size=2)) as http:
        first = (await http.get("/tasks?name=job")).text
        following = re.search(r'href="(/tasks\?[^"]+)" rel="next"', first)
        assert following
        second = (await http.get(html.unescape(following[1]))).text
        forged = await http.get("/tasks?name=job&after=k:job:1")  # a key position, claim order
    assert re.findall(r">(job:\d)</a>", first) == ["job:0", "job:1"]
    assert re.findall(r">(job:\d)</a>", second) == ["job:2", "job:3"]
    assert forged.status_code == 400 and "not a position in this list" in forged.text


async def test_a_position_out_of_range_is_refused_naming_the_parameter(
    scheduler: ms.Scheduler,
):
    """A forged claim-order position whose numbers no task can have (a priority past int32,
    past int64, a time past any date) is refused, not sent to the server to fail there."""
    task_id = "0" * 24
    forged = [
        f"c:{2**63}:0:{task_id}",
        f"c:{-(2**63) - 1}:0:{task_id}",
        f"c:{2**31}:0:{task_id}",
        f"c:0:{10**20}:{task_id}",
    ]
    await scheduler.publish("job:0", None, name="job")
    async with client(create_app(scheduler)) as http:
        answers = [await http.get("/tasks", params={"name": "job", "after": a}) for a in forged]
    assert [answer.status_code for answer in answers] == [400] * len(forged)
    assert all("after" in text_of(answer.text) for answer in answers)


# ------------------------------------------------------------------------ actions


async def test_actions_with_the_page_token_cancel_retry_pause_and_resume(filled: ms.Scheduler):
    async with client(create_app(filled)) as http:
        token = csrf_of((await http.get("/")).text)
        cancelled = await http.post("/tasks/email:0/cancel", data={"csrf": token})
        paused = await http.post("/names/email/pause", data={"csrf": token, "reason": "deploy"})
        resumed = await http.post("/names/sms/resume", headers={"X-CSRF-Token": token})
        retried = await http.post("/names/email/retry-failed", data={"csrf": token})
        bad_retry = await http.post("/tasks/email:1/retry", data={"csrf": token})
        offsite = await http.post(
            "/tasks/email:2/cancel", data={"csrf": token, "next": "/\\evil.example/"}
        )
        overview = (await http.get("/")).text
    assert cancelled.status_code == 303 and cancelled.headers["location"] == "/tasks/email%3A0"
    assert (await filled.get("email:0")).state is ms.TaskState.CANCELLED
    assert paused.status_code == resumed.status_code == retried.status_code == 303
    assert set(await filled.paused()) == {"email"}
    assert "paused: deploy" in text_of(row_of(overview, "email"))
    assert (await filled.get("email:broken")).state is ms.TaskState.PENDING
    assert bad_retry.status_code == 400 and "only failed or cancelled" in text_of(bad_retry.text)
    assert offsite.headers["location"] == "/tasks/email%3A2"  # never a redirect elsewhere


async def test_the_stop_button_of_a_live_worker_stops_it_behind_the_token_and_a_confirmation(
    filled: ms.Scheduler, discover: Any
):
    """Each live worker has Stop (draining) and Stop now, each asking for a confirmation in
    the page; without the page's token nothing is stopped; a worker that is not live is a
    400 that says so."""

    async def job(task: ms.Task) -> None:
        pass

    app = create_app(filled)
    consumer = filled.consumer({"other": job}, options=worker("mailer-1"))
    async with anyio.create_task_group() as tg:
        await tg.start(consumer.run)
        async with client(app) as http:
            page = (await http.get("/")).text
            row = re.search(r'<tr data-worker="mailer-1"[^>]*>(.*?)</tr>', page, re.S)
            assert row, "no row for the live worker"
            forms = re.findall(r'<form method="post" action="([^"]+)"[^>]*data-confirm="', row[1])
            assert forms == ["/workers/mailer-1/stop", "/workers/mailer-1/stop"]
            assert 'name="now" value="1"' in row[1]
            refused = await http.post("/workers/mailer-1/stop", data={"csrf": "forged"})
            await discover()
            assert refused.status_code == 403 and not consumer.stop_requested
            token = csrf_of(page)
            unknown = await http.post("/workers/nobody/stop", data={"csrf": token})
            assert unknown.status_code == 400 and "no live worker" in text_of(unknown.text)
            stopped = await http.post("/workers/mailer-1/stop", data={"csrf": token, "now": "1"})
            assert stopped.status_code == 303 and stopped.headers["location"] == "/"
            await discover()
    assert consumer.stop_requested and consumer.stopped_remotely
    assert await filled.workers() == []


async def test_every_asset_is_served_by_the_app(scheduler: ms.Scheduler):
    async with client(create_app(scheduler)) as http:
        page = (await http.get("/")).text
        sources = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
        assets = [await http.get(source) for source in sources]
    assert {"/static/htmx.min.js", "/static/dashboard.js", "/static/dashboard.css"} <= set(sources)
    assert all(asset.status_code == 200 and asset.content for asset in assets)
    assert not re.search(r'(?:src|href)="(?:https?:)?//', page)  # no CDN


# ------------------------------------------------------------------------ live refresh


async def test_open_pages_are_told_when_tasks_change(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Callable[[], Any], engine: str
):
    """A publish is told: from the change stream (memory), or from the process's poll (wire,
    every ``poll_interval``), as the task events tell it."""
    told: list[int] = []

    async def send() -> None:
        told.append(1)

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: refresh_signals(scheduler, send, poll_interval=5, min_interval=1))
        await discover()
        assert told == []
        await scheduler.publish("new", None, name="job")
        await discover()
        if engine == "wire":
            clock.advance(5)
            await discover()
        assert len(told) == 1
        group.cancel_scope.cancel()


async def test_a_lease_ping_alone_refreshes_no_page(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Callable[[], Any]
):
    """Pages refresh on task events: a ping (a write of the task that changes nothing shown)
    is none, a claim is."""
    told: list[int] = []

    async def send() -> None:
        told.append(1)

    await scheduler.publish("k", None, name="job")
    clock.advance(1)  # published before the page opened: not told
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: refresh_signals(scheduler, send, poll_interval=5, min_interval=1))
        await discover()
        lease = await scheduler.store.tasks.claim("w1", key="k")
        assert lease is not None
        for _ in range(2):
            clock.advance(5)
            await discover()
        assert len(told) == 1  # the claim: started
        await scheduler.store.tasks.ping(lease)
        for _ in range(2):
            clock.advance(5)
            await discover()
        assert len(told) == 1
        group.cancel_scope.cancel()


async def test_the_event_stream_sends_a_refresh_after_a_change_until_the_client_leaves(
    scheduler: ms.Scheduler, clock: ManualClock, discover: Callable[[], Any], engine: str
):
    app = create_app(scheduler, poll_interval=5, min_refresh_interval=1)
    sent: list[dict[str, Any]] = []
    requested, left = anyio.Event(), anyio.Event()

    async def receive() -> dict[str, Any]:
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/events",
        "raw_path": b"/events",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8080")],
        "server": ("127.0.0.1", 8080),
        "client": ("operator", 1234),
    }

    def bodies() -> bytes:
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(app, scope, receive, send)
            await discover()
            headers = dict(sent[0]["headers"])
            assert headers[b"content-type"].startswith(b"text/event-stream")
            assert b"content-length" not in headers  # the body never ends
            assert b"data: refresh" not in bodies()
            await scheduler.publish("new", None, name="job")
            await discover()
            if engine == "wire":
                clock.advance(5)
                await discover()
            assert bodies().count(b"data: refresh") == 1
            left.set()  # the response ends with the client, no cancel needed


def worker_row(page: str, worker_id: str) -> str:
    found = re.search(rf'<tr data-worker="{re.escape(worker_id)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no row for worker {worker_id}"
    return text_of(found[1])


async def test_the_workers_view_shows_what_runs_now_and_dead_workers_since_when(
    filled: ms.Scheduler, clock: ManualClock
):
    """Each live worker shows under the names it serves, with what it runs now read from the
    tasks (its entry says 0 until its next heartbeat); one that died without stopping (two
    heartbeats missed) serves no name, and is listed among the workers as dead since then,
    as `mscheduler workers` lists it."""

    def entry(worker_id: str, names: list[str]) -> WorkerInfo:
        now = clock.now()
        return WorkerInfo(
            worker_id=worker_id,
            host="web-1",
            pid=4242,
            names=names,
            max_running=16,
            started_at=now,
            last_seen_at=now,
            heartbeat_ms=10_000,
        )

    await filled.store.workers.beat(entry("gone-1", ["email"]))
    clock.advance(30)  # gone-1 missed two heartbeats (and one more): dead 10 s ago
    await filled.store.workers.beat(entry("mailer-1", ["email", "sms"]))
    for n in range(3):  # claimed after its heartbeat: only the tasks know it runs them
        assert await filled.store.tasks.claim("mailer-1", key=f"email:{n}") is not None
    async with client(create_app(filled)) as http:
        page = (await http.get("/")).text
    assert "mailer-1 3/16" in text_of(row_of(page, "email"))
    assert "mailer-1" in text_of(row_of(page, "sms"))
    assert "mailer-1" not in text_of(row_of(page, "report"))
    assert "gone-1" not in text_of(row_of(page, "email"))
    assert "email:0, email:1, email:2" in worker_row(page, "mailer-1")
    assert "alive" in worker_row(page, "mailer-1") and "web-1:4242" in text_of(page)
    gone = worker_row(page, "gone-1")
    assert "dead since 10s ago it missed its heartbeats" in gone and "Stop" not in gone


def test_the_core_install_does_not_import_the_dashboard():
    code = (
        "import sys, mscheduler, mscheduler.cli.main; "
        "print(sorted(m for m in ('starlette', 'jinja2', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
