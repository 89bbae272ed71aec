"""``mscheduler events``: a listener in another process than the work it tells of, against the
wire engine (a server in another process, without change streams: the listener polls)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
from typer.testing import CliRunner

import mscheduler as ms
from mscheduler.backends.memory import forget_memory_server
from mscheduler.cli.main import app
from mscheduler.models import ErrorInfo, Progress, TaskEvent
from mscheduler.testing import ManualClock
from tests.acceptance.test_cli import BIN, ROOT, needs_bin, read_until, wire_db
from tests.engines import FAST, POLL_MS, WireServer, until_idle, worker


async def _fail_once_then_succeed(uri: str) -> None:
    """Publish a task and consume it here: its first attempt fails, its retry succeeds."""
    clock = ManualClock()
    tries: list[int] = []

    async def flaky(task: ms.Task) -> dict[str, int]:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("first try fails")
        return {"tries": len(tries)}

    options = ms.TaskOptions(max_unexpected_retries=2, unexpected_retry_delay_ms=1_000, **FAST)
    async with await ms.Scheduler.connect(uri, clock=clock) as sched:
        async with sched.consumer({"job": flaky}, options=worker()):
            await sched.publish("k", {"n": 1}, name="job", options=options)
            for _ in range(100):
                await until_idle()
                clock.advance(POLL_MS / 1000 * 10)
                task = await sched.get("k")
                if task is not None and task.state.is_terminal:
                    break
        assert task is not None and task.state is ms.TaskState.SUCCESS


@needs_bin
def test_events_tells_another_process_s_retry_in_order_as_json_lines(
    wire_server: WireServer,
) -> None:
    uri = wire_db(wire_server)
    process = subprocess.Popen(
        [str(BIN), "--uri", uri, "events", "--json", "--limit", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's mscheduler
    )
    try:
        read_until(process, "polling for tasks every")  # listening: no change streams here
        anyio.run(_fail_once_then_succeed, uri)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    told = [json.loads(line) for line in out.splitlines()]
    assert [(event["kind"], event["key"], event["will_retry"]) for event in told] == [
        ("published", "k", None),
        ("started", "k", None),
        ("failed", "k", True),
        ("started", "k", None),
        ("succeeded", "k", None),
    ]
    assert told[2]["error"]["type"] == "RuntimeError"
    assert told[4]["result"] == {"tries": 2} and told[4]["worker_id"] == "w1"


def test_events_prints_one_line_per_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own part, on a listener replaced by three made-up events."""
    at = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    made_up = [
        TaskEvent(kind="published", key="k", name="job", at=at, version=1),
        TaskEvent(
            kind="failed",
            key="k",
            name="job",
            at=at,
            version=3,
            worker_id="w1",
            run_id="r1",
            will_retry=True,
            error=ErrorInfo.from_message("RuntimeError", "first try fails"),
        ),
        TaskEvent(
            kind="progress",
            key="k",
            name="job",
            at=at,
            version=5,
            worker_id="w1",
            run_id="r2",
            progress=Progress(fraction=0.5, message="half"),
        ),
    ]

    class MadeUp:
        async def __aenter__(self) -> MadeUp:
            return self

        async def __aexit__(self, *exc_info: object) -> None:
            return None

        async def __aiter__(self) -> AsyncIterator[TaskEvent]:
            for event in made_up:
                yield event

    def events(self: ms.Scheduler, names: list[str] | None = None) -> MadeUp:
        return MadeUp()

    async def opened() -> None:  # a database others in this process use, as a test's
        await (await ms.Scheduler.connect(uri)).close()

    uri = f"memory://cli-{uuid.uuid4().hex[:8]}"
    anyio.run(opened)
    monkeypatch.setattr(ms.Scheduler, "events", events)
    try:
        result = CliRunner().invoke(app, ["--uri", uri, "events"])
    finally:
        forget_memory_server(uri.removeprefix("memory://"))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].split()[1:] == ["published", "job", "k"]
    assert "failed" in lines[1] and "w1 (r1)" in lines[1] and "will retry" in lines[1]
    assert "RuntimeError: first try fails" in lines[1]
    assert lines[2].endswith("50% half")
