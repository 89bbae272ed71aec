"""``mscheduler dashboard`` as operators use it: the installed command, on the wire engine (a
real server in another process, without change streams), driven by a real headless Chromium
from the system's packages through Playwright. The same test takes the README's screenshot.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import json
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import pytest

import mscheduler as ms
from mscheduler.models import WorkerInfo
from mscheduler.testing import ManualClock
from tests.engines import WireServer

ROOT = pathlib.Path(__file__).parents[2]
BIN = ROOT / ".venv" / "bin" / "mscheduler"
CHROMIUM = pathlib.Path(os.environ.get("MSCHEDULER_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOT = ROOT / "docs" / "dashboard.png"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T = TypeVar("T")

# The slow tier (`--slow`, what .ci/run runs): a browser per test, and a worker in real time.
pytestmark = pytest.mark.slow
needs_bin = pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")


@contextlib.contextmanager
def chromium_page(width: int = 1280, height: int = 720) -> Iterator[tuple[Any, Any]]:
    """A page of headless Chromium, and Playwright's ``expect``: skipped without them (a
    failure under CI, where .ci/run installs them)."""
    if not CHROMIUM.exists():
        browser_unavailable(f"no {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        browser_unavailable("no playwright (pip install -e '.[dev]')")
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(10_000)
            yield page, expect
        finally:
            browser.close()


def browser_unavailable(reason: str) -> None:
    """Skip, or fail under CI, where .ci/run installs the browser."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"browser test: {reason} (CI=true: it must run)", pytrace=False)
    pytest.skip(f"browser test: {reason}")


def on(uri: str, work: Callable[[ms.Scheduler], Awaitable[T]], **options: Any) -> T:
    """Run ``work`` on the database, from a thread of its own: Playwright's sync API keeps an
    event loop running in the test's thread."""

    async def session() -> T:
        async with await ms.Scheduler.connect(uri, **options) as sched:
            return await work(sched)

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(anyio.run, session).result(timeout=60)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def seed(sched: ms.Scheduler, clock: ManualClock) -> None:
    """An hour of work: tasks of four names ended over the last hour, some failed, some
    running now, one name paused, one limited, one on a schedule."""
    start = clock.now()
    for minute in range(0, 60, 3):
        clock.set(start + dt.timedelta(minutes=minute))
        for n in range(2 + minute % 7):
            key = f"email:{minute:02d}-{n}"
            options = ms.TaskOptions(max_unexpected_retries=0)
            await sched.publish(key, {"to": f"user{n}@example.com"}, name="email", options=options)
            lease = await sched.store.tasks.claim("mailer-1", key=key)
            assert lease is not None
            if (minute + n) % 9 == 0:
                await sched.store.tasks.fail(
                    lease, ConnectionError("smtp: 421 try again"), final=True
                )
            else:
                await sched.store.tasks.succeed(lease, {"sent": True})
    clock.set(dt.datetime.now(dt.timezone.utc))
    for n in range(4):
        await sched.publish(f"email:queued-{n}", {"to": f"late{n}@example.com"}, name="email")
    for n in range(2):
        await sched.publish(f"thumbnail:{n}", {"width": 320 * (n + 1)}, name="thumbnail")
        assert await sched.store.tasks.claim(f"imager-{n}", key=f"thumbnail:{n}") is not None
    await sched.publish("thumbnail:big", {"width": 4000}, name="thumbnail")
    for n in range(3):
        await sched.publish(f"sms:{n}", {"text": "your code is 4242"}, name="sms")
    await sched.pause("sms", reason="provider outage")
    await sched.set_limit("email", rate=100, per=dt.timedelta(minutes=1), max_running=5)
    await sched.schedule("nightly-report", name="report", cron="0 3 * * *")
    await sched.publish("report:extract", {"table": "orders"}, name="report")
    await sched.publish(
        "report:build", {"kind": "sales"}, name="report", depends_on=["report:extract"]
    )


@pytest.fixture
def dashboard(wire_server: WireServer) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """The command serving a fresh database of the wire engine: its URL, that database's URI,
    and the process."""
    if not BIN.exists():
        pytest.skip("the mscheduler command is not installed")
    uri = wire_server.uri.replace("/?", f"/dash-{uuid.uuid4().hex[:8]}?")
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=59)
    clock = ManualClock(start)
    on(uri, lambda sched: seed(sched, clock), clock=clock)
    port = free_port()
    process = subprocess.Popen(
        [str(BIN), "--uri", uri, "dashboard", "--port", str(port), "--poll-interval", "0.3"],
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/static/dashboard.css", timeout=2):
                    break
            except OSError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "the dashboard did not start in 30 s"
                time.sleep(0.1)
        yield url, uri, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def post(url: str, form: bytes) -> int:
    request = urllib.request.Request(url, data=form, method="POST")
    request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_an_operator_reads_the_overview_opens_a_task_and_cancels_it(
    dashboard: tuple[str, str, subprocess.Popen[str]],
):
    url, uri, process = dashboard
    with chromium_page(width=1280, height=600) as (page, expect):
        # The overview: every name with its counts by state.
        page.goto(url + "/")
        email = page.locator('tr[data-name="email"]')
        expect(email.locator('td[data-state="pending"]')).to_have_text("4")
        expect(page.locator('tr[data-name="thumbnail"] td[data-state="running"]')).to_have_text("2")
        expect(page.locator('tr[data-name="sms"]')).to_contain_text("paused: provider outage")
        expect(page.locator('tr[data-name="report"]')).to_contain_text("0 3 * * *")
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        # Live: a task of a new name appears without a reload (the wire has no change
        # streams: the dashboard polls).
        on(uri, lambda sched: sched.publish("hook:1", {"url": "https://x"}, name="webhook"))
        expect(page.locator('tr[data-name="webhook"] td[data-state="pending"]')).to_have_text("1")

        # From the counts to the list to the task page, which shows the payload.
        email.locator('td[data-state="pending"] a').click()
        page.get_by_role("link", name="email:queued-2").click()
        expect(page.locator("#payload")).to_contain_text('"to": "late2@example.com"')

        # Cancelling through the page's button (it asks first) changes the task.
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Cancel").click()
        expect(page.locator("#task-state")).to_have_text("cancelled")

    task = on(uri, lambda sched: sched.get("email:queued-2"))
    assert task is not None and task.state is ms.TaskState.CANCELLED
    # A POST without the page's token is refused, and changes nothing.
    assert post(url + "/tasks/email%3Aqueued-1/cancel", b"") == 403
    assert post(url + "/tasks/email%3Aqueued-1/cancel", b"csrf=guessed") == 403
    other = on(uri, lambda sched: sched.get("email:queued-1"))
    assert other is not None and other.state is ms.TaskState.PENDING

    # A page left open (its event stream) does not hold the command when it is stopped.
    with urllib.request.urlopen(url + "/events", timeout=10) as stream:
        assert stream.readline() == b": open\n"
        process.terminate()
        # Within uvicorn's grace period; uvicorn then re-raises the signal, as it does.
        assert process.wait(timeout=8) in (0, -signal.SIGTERM)


# Where the screenshot of a retried task's page goes, when asked (not part of the docs).
RETRIED_SHOT = os.environ.get("MSCHEDULER_RETRIED_SCREENSHOT")


async def failed_flow(sched: ms.Scheduler) -> None:
    """``doomed:0`` failed twice (two workers), which cancelled ``notify:0``, its dependent."""
    options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
    await sched.publish("doomed:0", {"rows": 120}, name="report", options=options)
    await sched.publish("notify:0", {"to": "ops"}, name="report", depends_on=["doomed:0"])
    for worker in ("reporter-1", "reporter-2"):
        lease = await sched.store.tasks.claim(worker, key="doomed:0")
        assert lease is not None
        try:
            raise ConnectionError("warehouse: connection reset")
        except ConnectionError as exc:
            await sched.store.tasks.fail(lease, exc)


def test_an_operator_retries_a_failed_task_with_its_dependents_and_sees_its_history(
    dashboard: tuple[str, str, subprocess.Popen[str]],
):
    url, uri, _ = dashboard
    on(uri, failed_flow)
    with chromium_page(width=1280, height=800) as (page, expect):
        page.goto(url + "/tasks/doomed%3A0")
        expect(page.locator("#task-state")).to_have_text("fail")
        questions: list[str] = []
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
        page.get_by_role("button", name="Retry with 1 cancelled dependent").click()
        expect(page.locator("#task-state")).to_have_text("pending")
        expect(page.locator("#revived")).to_have_text("Revived dependents: notify:0")
        assert questions and "notify:0" in questions[0], "the operator is asked, naming them"
        expect(page.locator("#runs")).to_contain_text("run 2 of this key")
        rows = page.locator("#attempts tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0)).to_contain_text("reporter-1")
        expect(rows.nth(1)).to_contain_text("reporter-2")
        expect(rows.nth(1)).to_contain_text("ConnectionError: warehouse: connection reset")
        expect(page.locator("h3", has_text="Error")).to_have_count(0)  # no outcome yet
        if RETRIED_SHOT:
            page.screenshot(path=RETRIED_SHOT, full_page=True)
        page.get_by_role("link", name="notify:0").first.click()
        expect(page.locator("#task-state")).to_have_text("blocked")


@needs_bin
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--uri", "memory://", "dashboard"], "error: dashboard: memory:// is a database inside"),
        (
            ["--uri", "mongodb://127.0.0.1:1/", "dashboard", "--host", "0.0.0.0"],
            "error: host: binding 0.0.0.0 opens the dashboard to the network; give --token",
        ),
    ],
)
def test_the_command_refuses_a_private_database_and_an_open_address_without_a_token(
    args: list[str], message: str
):
    done = subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "MSCHEDULER_DASHBOARD_TOKEN"},
    )
    assert done.returncode == 2
    assert done.stderr.startswith(message), done.stderr


SHOTS = pathlib.Path(os.environ.get("MSCHEDULER_SHOTS", tempfile.gettempdir()))


async def add_big_and_progressing(sched: ms.Scheduler) -> None:
    """A task whose payload is 5 MB, and a running one that reports progress."""
    await sched.publish("export:big", {"rows": "r" * 5_000_000}, name="export")
    await sched.publish("render:1", {"frames": 100}, name="render")
    lease = await sched.store.tasks.claim("renderer-7", key="render:1")
    assert lease is not None
    lease.progress(0.4, "frame 40 of 100")
    await sched.store.tasks.ping(lease)


def test_the_task_list_and_pages_tell_what_an_operator_needs(
    dashboard: tuple[str, str, subprocess.Popen[str]],
):
    """The list has the worker, progress, duration and error of each task and absolute times;
    a 5 MB payload is cut with a link to the whole document; the chart gives failures their
    own scale; Cancel and Retry ask first."""
    url, uri, _ = dashboard
    on(uri, add_big_and_progressing)
    with chromium_page(width=1400, height=900) as (page, expect):
        # The list: worker, progress, duration and error columns; absolute times.
        page.goto(url + "/tasks")
        headers = page.locator("table.tasks thead th").all_inner_texts()
        for column in ("WORKER", "PROGRESS", "DURATION", "ERROR"):
            assert column in [header.upper() for header in headers], headers
        render = page.locator('tr[data-key="render:1"]')
        expect(render.locator("td.worker")).to_have_text("renderer-7")
        expect(render.locator("td.progress")).to_contain_text("40%")
        expect(render.locator("td.duration")).not_to_be_empty()
        failed = page.locator("tr[data-state=fail]").first
        expect(failed.locator("td.error")).to_contain_text("ConnectionError: smtp: 421")
        year = str(dt.datetime.now(dt.timezone.utc).year)
        title = render.locator("td.created time").get_attribute("title") or ""
        assert title.startswith(year), title  # the absolute time, on hover
        expect(render.locator("td.created")).to_contain_text(year)  # and in the page
        page.screenshot(path=str(SHOTS / "i42-cli-tasks.png"), full_page=True)

        # A 5 MB payload: a part of it, and a link to the whole document.
        page.goto(url + "/tasks/export%3Abig")
        shown = page.locator("#payload").inner_text()
        assert 1_000 < len(shown) < 100_000, len(shown)
        raw = page.locator("#payload-whole")
        expect(raw).to_be_visible()
        page.screenshot(path=str(SHOTS / "i42-cli-big-payload.png"))
        href = raw.get_attribute("href")
        assert href is not None
        with urllib.request.urlopen(url + href, timeout=30) as reply:
            document = json.loads(reply.read())
        assert document["key"] == "export:big" and len(document["payload"]["rows"]) == 5_000_000

        # The chart: the busiest bucket of failures fills the failures' own scale.
        page.goto(url + "/")
        heights = [
            float(rect.get_attribute("height") or 0)
            for rect in page.locator("svg.chart rect.bad").all()
        ]
        scale = float(page.locator("svg.chart").get_attribute("data-fail-scale") or 0)
        assert heights and scale > 0 and max(heights) == scale

        # Cancel asks first: dismissed, nothing changes; accepted, the task is cancelled.
        page.goto(url + "/tasks/email%3Aqueued-3")
        questions: list[str] = []
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
        page.get_by_role("button", name="Cancel").click()
        expect(page.locator("#task-state")).to_have_text("pending")
        assert questions and "email:queued-3" in questions[0]
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Cancel").click()
        expect(page.locator("#task-state")).to_have_text("cancelled")
        # Retry asks too.
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
        page.get_by_role("button", name="Retry").click()
        expect(page.locator("#task-state")).to_have_text("cancelled")
        assert len(questions) == 2 and "email:queued-3" in questions[1]


@needs_bin
@pytest.mark.parametrize("command", ["dashboard", "serve"])
def test_a_weak_token_is_refused_naming_the_rule(command: str):
    done = subprocess.run(
        [str(BIN), "--uri", "mongodb://127.0.0.1:1/", command, "--host", "0.0.0.0", "--token", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: token: "), done.stderr
    assert "16 characters" in done.stderr and done.stderr.count("\n") == 1


def test_the_workers_view_follows_claims_at_once_and_shows_a_dead_worker(
    dashboard: tuple[str, str, subprocess.Popen[str]],
):
    """imager-0 and imager-1 each run a thumbnail (the seed's claims); their entries say
    nothing runs (as at a heartbeat before the claims). The view shows what the tasks say,
    follows a new claim without a reload, and lists imager-1, which stopped beating five
    minutes ago, as dead since then, as `mscheduler workers` does."""
    url, uri, _ = dashboard

    async def register(sched: ms.Scheduler) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        for worker_id, seen in (("imager-0", now), ("imager-1", now - dt.timedelta(minutes=5))):
            entry = WorkerInfo(
                worker_id=worker_id,
                host="render-1",
                pid=7,
                names=["thumbnail"],
                max_running=16,
                started_at=seen,
                last_seen_at=seen,
                heartbeat_ms=30_000,
            )
            await sched.store.workers.beat(entry)

    on(uri, register)
    with chromium_page() as (page, expect):
        page.goto(url + "/")
        alive, dead = (
            page.locator('tr[data-worker="imager-0"]'),
            page.locator('tr[data-worker="imager-1"]'),
        )
        expect(alive.locator("td.num")).to_have_text("1/16")
        expect(alive.locator("td.status")).to_have_text("alive")
        expect(dead.locator("td.status")).to_contain_text("dead since 4m ago")
        expect(dead.locator("td.status")).to_contain_text("it missed its heartbeats")
        expect(dead.get_by_role("button")).to_have_count(0)
        expect(page.locator('tr[data-name="thumbnail"]')).not_to_contain_text("imager-1")

        async def claim_big(sched: ms.Scheduler) -> None:
            assert await sched.store.tasks.claim("imager-0", key="thumbnail:big") is not None

        on(uri, claim_big)  # no heartbeat: the view follows the task, without a reload
        expect(alive.locator("td.num")).to_have_text("2/16")
