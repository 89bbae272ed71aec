"""The operator's first week, through the installed ``mscheduler`` command in subprocesses against
the wire engine (a server in another process, without change streams): live workers, a log
line per task, a readable ``show``, output and input that fit the shell, errors in the user's
words, and the foot-guns."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter

import anyio
import pytest
from bson import Decimal128, Int64, ObjectId

import mscheduler as ms
from mscheduler.models import WorkerStateKind
from tests.acceptance.test_cli import (
    BIN,
    ROOT,
    needs_bin,
    program,
    publish,
    read_until,
    start_worker,
    wait_for_tasks,
    wire_db,
)
from tests.engines import WireServer

pytestmark = needs_bin
HANDLERS = "tests.acceptance.handlers_for_tests:handlers"


@pytest.fixture
def uri(wire_server: WireServer) -> str:
    return wire_db(wire_server)


def cli(uri: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command, its stdout a pipe (not a terminal), as in ``mscheduler ls | grep``."""
    return subprocess.run(
        [str(BIN), "--uri", uri, *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        cwd=ROOT,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def one_line_error(done: subprocess.CompletedProcess[str], start: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(start), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert process.stderr is not None
    return process.stderr.read()


# ------------------------------------------------------------------ 1. live workers


def test_workers_are_listed_and_stats_say_who_serves_what(uri: str):
    first = start_worker(
        uri, "worker", HANDLERS, "--worker-id", "w-a", "--max-running", "4", cwd=ROOT
    )
    second = start_worker(uri, "worker", HANDLERS, "--worker-id", "w-b", "--names", "nap", cwd=ROOT)
    try:
        read_until(first, " running ")
        read_until(second, " running ")
        listed = {w["worker_id"]: w for w in json.loads(ok(cli(uri, "workers", "--json")))}
        assert set(listed) == {"w-a", "w-b"}
        assert listed["w-a"]["names"] == ["boom", "echo", "flaky", "nap", "slow"]
        assert listed["w-a"]["max_running"] == 4 and listed["w-b"]["names"] == ["nap"]
        assert all(w["alive"] and w["pid"] > 0 and w["host"] for w in listed.values())
        table = ok(cli(uri, "workers")).splitlines()
        assert table[0].split("\t")[:3] == ["worker", "status", "host"]
        assert {line.split("\t")[0] for line in table[1:]} == {"w-a", "w-b"}
        assert ok(cli(uri, "workers", "--name", "echo")).count("alive") == 1

        # A name nobody serves: publish warns, stats flags it.
        done = cli(uri, "publish", "x:1", "--name", "no_such_handler")
        assert done.returncode == 0 and "published: x:1" in done.stdout
        assert "warning: no live worker serves 'no_such_handler'" in done.stderr
        assert "warning" not in cli(uri, "publish", "e:1", "--name", "nap", "--payload", "0").stderr
        rows = {(r["name"], r["state"]): r for r in json.loads(ok(cli(uri, "stats", "--json")))}
        assert rows["no_such_handler", "pending"]["live_workers"] == 0
        stats = ok(cli(uri, "stats"))
        unserved = next(line for line in stats.splitlines() if line.startswith("no_such_handler"))
        assert unserved.endswith("no live worker serves it")
        wait_for_tasks(uri, ["e:1"])
        rows = {(r["name"], r["state"]): r for r in json.loads(ok(cli(uri, "stats", "--json")))}
        assert rows["nap", "success"]["live_workers"] == 2
        stop(second)  # a graceful stop removes its entry
        assert [w["worker_id"] for w in json.loads(ok(cli(uri, "workers", "--json")))] == ["w-a"]
    finally:
        first.kill()
        second.kill()


def test_a_killed_idle_worker_shows_dead(uri: str):
    process = start_worker(
        uri, "worker", HANDLERS, "--worker-id", "doomed", "--heartbeat", "200ms", cwd=ROOT
    )
    try:
        read_until(process, " running ")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    deadline = dt.datetime.now() + dt.timedelta(seconds=20)
    while True:  # dead once two heartbeats (400 ms) were missed
        [info] = json.loads(ok(cli(uri, "workers", "--json")))
        if not info["alive"] or dt.datetime.now() > deadline:
            break
    assert info["worker_id"] == "doomed" and not info["alive"] and info["dead_since"]
    [line] = ok(cli(uri, "workers")).splitlines()[1:]
    assert "\tdead\t" in line and line.endswith("ago): it missed its heartbeats")


def test_workers_show_what_runs_at_once_and_a_killed_worker_dead_when_its_leases_expire(
    uri: str,
):
    """At the default heartbeat (30 s): the running count is right as soon as the tasks
    start, and a worker killed while it runs them is dead when their leases expire (1 s
    here), not after two missed heartbeats (60 s)."""
    process = start_worker(uri, "worker", HANDLERS, "--worker-id", "w-held", cwd=ROOT)
    try:
        read_until(process, " running ")

        async def work() -> None:
            async with await ms.Scheduler.connect(uri) as sched:
                lease = ms.TaskOptions(ping_interval_ms=300, worker_timeout_ms=1_000)
                for key in ("held:1", "held:2"):
                    await sched.publish(key, None, name="slow", options=lease)

        anyio.run(work)
        wait_running(uri, "held:1")
        wait_running(uri, "held:2")
        [info] = json.loads(ok(cli(uri, "workers", "--json")))
        assert (info["running"], info["running_keys"]) == (2, ["held:1", "held:2"])
        assert info["alive"] and info["dead_since"] is None
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    killed = time.monotonic()
    while True:
        [info] = json.loads(ok(cli(uri, "workers", "--json")))
        if not info["alive"]:
            break
        assert time.monotonic() - killed < 20, "still alive long after its leases expired"
    assert info["running"] == 0 and info["dead_since"] == info["lease_lost_at"]
    [line] = ok(cli(uri, "workers")).splitlines()[1:]
    assert "\tdead\t" in line and line.endswith("ago): its leases expired")


def worker_states(uri: str, key: str) -> ms.Task:
    async def work() -> ms.Task:
        async with await ms.Scheduler.connect(uri) as sched:
            found = await sched.get(key)
            assert found is not None
            return found

    return anyio.run(work)


def wait_running(uri: str, key: str) -> None:
    deadline = time.monotonic() + 30
    while worker_states(uri, key).state is not ms.TaskState.RUNNING:
        assert time.monotonic() < deadline, f"the worker never ran {key}"
        time.sleep(0.05)


def test_workers_stop_lets_the_running_task_finish_then_the_worker_exits_0(uri: str):
    publish(uri, ("nap:1", "nap", 3))
    process = start_worker(uri, "worker", HANDLERS, "--worker-id", "w-stop", cwd=ROOT)
    try:
        read_until(process, " running ")
        wait_running(uri, "nap:1")
        said = ok(cli(uri, "workers", "stop", "w-stop"))
        assert said.startswith("stopping: w-stop (") and "finish first" in said
        assert "1 running task(s)" in read_until(process, "stop requested")[-1]
        publish(uri, ("e:after", "echo", 1))  # a worker asked to stop claims nothing more
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
    assert worker_states(uri, "nap:1").state is ms.TaskState.SUCCESS
    assert worker_states(uri, "e:after").state is ms.TaskState.PENDING
    assert json.loads(ok(cli(uri, "workers", "--json"))) == []


def test_a_burst_worker_drains_what_is_due_and_exits_0(uri: str):
    publish(uri, ("e:1", "echo", 1), ("e:2", "echo", 2), ("bad:1", "boom", "novalue"))
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    ok(cli(uri, "publish", "e:later", "--name", "echo", "--not-before", later.isoformat()))
    done = subprocess.run(
        [str(BIN), "--uri", uri, "worker", HANDLERS, "--burst", "--worker-id", "w-burst"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "MSCHEDULER_POLL_INTERVAL": "50ms"},
    )
    assert done.returncode == 0, done.stderr
    assert "worker w-burst done (burst): 3 task(s) run" in done.stderr
    states = {key: worker_states(uri, key).state for key in ("e:1", "e:2", "bad:1", "e:later")}
    assert states == {
        "e:1": ms.TaskState.SUCCESS,
        "e:2": ms.TaskState.SUCCESS,
        "bad:1": ms.TaskState.FAIL,
        "e:later": ms.TaskState.PENDING,  # due in an hour: not waited for
    }


def test_max_tasks_exits_0_after_that_many_runs(uri: str):
    publish(uri, *((f"e:{n}", "echo", n) for n in range(4)))
    done = subprocess.run(
        [str(BIN), "--uri", uri, "worker", HANDLERS, "--max-tasks", "2", "--max-running", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "MSCHEDULER_POLL_INTERVAL": "50ms"},
    )
    assert done.returncode == 0, done.stderr
    assert "done (max_tasks): 2 task(s) run" in done.stderr
    finished = Counter(worker_states(uri, f"e:{n}").state for n in range(4))
    assert finished == {ms.TaskState.SUCCESS: 2, ms.TaskState.PENDING: 2}
    refused = cli(uri, "worker", HANDLERS, "--max-tasks", "0")
    one_line_error(refused, "error: max-tasks: must be at least 1")


def test_workers_stop_now_releases_the_running_task_and_the_worker_exits_0(uri: str):
    publish(uri, ("slow:1", "slow", None))
    process = start_worker(
        uri, "worker", HANDLERS, "--worker-id", "w-now", "--grace", "10m", cwd=ROOT
    )
    try:
        read_until(process, " running ")
        wait_running(uri, "slow:1")
        stopped_at = time.monotonic()
        assert "released at once" in ok(cli(uri, "workers", "stop", "w-now", "--now"))
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - stopped_at < 10  # not the ten minutes of grace
    finally:
        process.kill()
    task = worker_states(uri, "slow:1")
    assert task.state is ms.TaskState.PENDING and task.unexpected_failures == 0
    assert [ws.state for ws in task.worker_states] == [WorkerStateKind.RELEASED]


def test_workers_stop_of_a_worker_that_is_not_live_is_success_with_a_note(uri: str):
    done = cli(uri, "workers", "stop", "nobody")
    assert ok(done) == "not running: nobody (no live worker has this id)\n"


# ------------------------------------------------------------------ 2. a log line per task


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_each_finished_task_is_one_log_line(uri: str, log_format: str):
    ok(cli(uri, "publish", "fine:1", "--name", "echo", "--payload", '{"n": 1}'))
    ok(cli(uri, "publish", "bad:1", "--name", "boom", "--payload", '"novalue"', "--retries", "0"))
    process = start_worker(
        uri,
        "--log-level",
        "info",
        "--log-format",
        log_format,
        "worker",
        HANDLERS,
        "--worker-id",
        "w-log",
        cwd=ROOT,
    )
    try:
        read_until(process, " running ")
        wait_for_tasks(uri, ["fine:1", "bad:1"])
    finally:
        said = stop(process)
        process.kill()
    if log_format == "json":
        records = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
        done = [r for r in records if r.get("key") == "fine:1"]
        assert len(done) == 1 and done[0]["level"] == "INFO"
        assert done[0]["action"] == "task_succeeded" and done[0]["outcome"] == "success"
        assert done[0]["task_name"] == "echo" and done[0]["worker_id"] == "w-log"
        assert done[0]["attempt"] == 1 and done[0]["duration_s"] >= 0
        failed = [r for r in records if r.get("key") == "bad:1"]
        assert len(failed) == 1 and failed[0]["outcome"] == "fail"
        assert failed[0]["worker_id"] == "w-log" and failed[0]["duration_s"] >= 0
    else:
        [line] = [line for line in said.splitlines() if "key=fine:1" in line]
        assert " INFO " in line and "'fine:1' (echo) attempt 1 succeeded in " in line
        assert "worker_id=w-log" in line and "outcome=success" in line


# ------------------------------------------------------------------ 3. a readable show


def test_show_reads_as_a_report_and_json_stays_whole(uri: str):
    ok(cli(uri, "publish", "cfg:1", "--name", "boom", "--payload", '"novalue"', "--retries", "0"))
    process = start_worker(uri, "worker", HANDLERS, "--worker-id", "w-show", cwd=ROOT)
    try:
        read_until(process, " running ")
        wait_for_tasks(uri, ["cfg:1"])
    finally:
        stop(process)
        process.kill()
    shown = ok(cli(uri, "show", "cfg:1"))
    assert shown.startswith("key:         cfg:1\nname:        boom\nstate:       fail")
    assert "options:     max_unexpected_retries=0" in shown
    assert "retry at" not in shown  # a failed task has no retry to come
    attempts = shown[shown.index("attempts:") :].splitlines()
    assert attempts[1].split() == ["worker", "state", "started", "ended", "took", "error"]
    assert attempts[2].split()[:2] == ["w-show", "fail"]
    error = shown[shown.index("error:       ") :]
    assert error.startswith("error:       ValueError: no '=' in 'novalue'")
    # The handler's frames come first; the ones inside mscheduler are only counted.
    frames = [line for line in error.splitlines() if line.startswith('  File "')]
    assert frames and all("handlers_for_tests.py" in frame for frame in frames)
    assert "frames inside mscheduler not shown" in error
    [failed] = ok(cli(uri, "ls", "--state", "fail")).splitlines()[1:]
    assert failed.startswith("cfg:1\t") and failed.endswith("\tValueError: no '=' in 'novalue'")
    whole = json.loads(ok(cli(uri, "show", "cfg:1", "--json")))
    assert "mscheduler" in whole["error"]["traceback"]  # --json keeps every frame
    assert whole["worker_states"][0]["worker_id"] == "w-show"


def _run_worker_until(uri: str, keys: list[str], worker_id: str) -> None:
    process = start_worker(uri, "worker", HANDLERS, "--worker-id", worker_id, cwd=ROOT)
    try:
        read_until(process, " running ")
        wait_for_tasks(uri, keys)
    finally:
        stop(process)
        process.kill()


def test_a_retry_keeps_the_history_and_revives_the_cancelled_dependents(uri: str):
    async def publish_flow() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            once = ms.TaskOptions(max_unexpected_retries=0)
            twice = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
            await sched.publish("doomed:0", None, name="flaky", options=once)
            await sched.publish("after:0", None, name="echo", depends_on=["doomed:0"])
            await sched.publish("export:0", None, name="flaky", options=twice)

    anyio.run(publish_flow)
    _run_worker_until(uri, ["doomed:0", "after:0", "export:0"], "w-first")
    # A success after a failed attempt shows no error: the failed attempt keeps its own.
    shown = ok(cli(uri, "show", "export:0"))
    assert "state:       success" in shown and "\nerror:" not in shown
    assert "RuntimeError: the first attempt fails" in shown[shown.index("attempts:") :]
    [listed] = ok(cli(uri, "ls", "--name", "flaky", "--state", "success")).splitlines()[1:]
    assert "RuntimeError" not in listed
    said = ok(cli(uri, "retry", "doomed:0", "--with-dependents"))
    assert "revived dependents: after:0" in said
    shown = ok(cli(uri, "show", "doomed:0"))
    assert "state:       pending" in shown and "\nruns:        2 " in shown
    attempts = shown[shown.index("attempts:") :].splitlines()
    assert attempts[1].split()[:3] == ["run", "worker", "state"]
    assert attempts[2].split()[:3] == ["1", "w-first", "fail"]
    assert "RuntimeError: the first attempt fails" in attempts[2]
    assert "state:       blocked" in ok(cli(uri, "show", "after:0"))
    _run_worker_until(uri, ["doomed:0", "after:0"], "w-second")
    shown = ok(cli(uri, "show", "doomed:0"))
    assert "state:       success" in shown and "\nerror:" not in shown
    attempts = shown[shown.index("attempts:") :].splitlines()
    assert [line.split()[:3] for line in attempts[2:4]] == [
        ["1", "w-first", "fail"],
        ["2", "w-second", "success"],
    ]
    assert "state:       success" in ok(cli(uri, "show", "after:0"))
    whole = json.loads(ok(cli(uri, "show", "doomed:0", "--json")))
    assert whole["runs"] == 2 and whole["earlier_attempts"][0]["worker_id"] == "w-first"


# ------------------------------------------------------------------ 4. pipes, and --json


def test_tables_in_a_pipe_keep_whole_values(uri: str):
    long_key = "digest-every-minute-for-the-accounting-team@20300101T000000Z"
    ok(cli(uri, "publish", long_key, "--name", "digest"))
    listing = ok(cli(uri, "ls"))
    assert [line for line in listing.splitlines() if line.startswith(long_key)]  # ls | grep
    assert listing.splitlines()[0].split("\t")[:3] == ["key", "name", "state"]
    ok(
        cli(
            uri,
            "schedule",
            "add",
            "a-rather-long-schedule-identifier",
            "--name",
            "x",
            "--every",
            "1h30m",
        )
    )
    schedules = ok(cli(uri, "schedule", "ls")).splitlines()
    [row] = [line.split("\t") for line in schedules[1:]]
    assert row[0] == "a-rather-long-schedule-identifier" and row[2] == "every 1h30m"
    assert dt.datetime.fromisoformat(row[4])  # the whole time, not a cut one
    ok(cli(uri, "limit", "set", "x", "--max-running", "2"))
    for command in (
        ["ls"],
        ["stats"],
        ["workers"],
        ["schedule", "ls"],
        ["limit", "ls"],
        ["indexes"],
    ):
        json.loads(ok(cli(uri, *command, "--json")))  # every read command speaks JSON


# ------------------------------------------------------------------ 5. odd payloads


def test_any_bson_payload_is_shown_as_extended_json(uri: str):
    odd = {
        "raw": b"\xff\x00",
        "oid": ObjectId("65a1b2c3d4e5f60718293a4b"),
        "price": Decimal128("9.99"),
        "at": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
    }

    async def publish() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            await sched.publish("odd:1", odd, name="echo")
            await sched.publish("plain:1", {"n": 1}, name="echo")

    anyio.run(publish)
    shown = json.loads(ok(cli(uri, "show", "odd:1", "--json")))
    assert shown["payload"] == {
        "raw": {"$binary": {"base64": "/wA=", "subType": "00"}},
        "oid": {"$oid": "65a1b2c3d4e5f60718293a4b"},
        "price": {"$numberDecimal": "9.99"},
        "at": {"$date": "2030-01-01T00:00:00Z"},
    }
    assert '"$binary"' in ok(cli(uri, "show", "odd:1"))
    page = json.loads(ok(cli(uri, "ls", "--json")))
    assert sorted(task["key"] for task in page) == ["odd:1", "plain:1"]  # one odd row hides none


def test_what_show_json_prints_can_be_published_back(uri: str, tmp_path: pathlib.Path):
    odd = {
        "raw": b"\xff\x00",
        "oid": ObjectId("65a1b2c3d4e5f60718293a4b"),
        "price": Decimal128("9.99"),
        "at": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
        "big": Int64(5),
    }

    async def publish_and_read() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            await sched.publish("odd:1", odd, name="echo")

    anyio.run(publish_and_read)
    printed = json.loads(ok(cli(uri, "show", "odd:1", "--json")))["payload"]
    ok(cli(uri, "publish", "copy:1", "--name", "echo", "--payload", json.dumps(printed)))
    canonical = '{"n": {"$numberLong": "7"}, "at": {"$date": {"$numberLong": "1893456000000"}}}'
    ok(cli(uri, "publish", "canonical:1", "--name", "echo", "--payload", canonical))
    line = json.dumps({"key": "line:1", "name": "echo", "payload": printed})
    ok(cli(uri, "publish-many", "-", stdin=line + "\n"))
    ok(cli(uri, "schedule", "add", "s", "--name", "echo", "--every", "1h", "--payload", canonical))

    async def read() -> tuple[ms.Task | None, ms.Task | None, ms.Task | None, object]:
        async with await ms.Scheduler.connect(uri) as sched:
            [schedule] = await sched.schedules()
            return (
                await sched.get("copy:1"),
                await sched.get("canonical:1"),
                await sched.get("line:1"),
                schedule.payload,
            )

    copy, canonical_task, line_task, scheduled = anyio.run(read)
    assert copy is not None and line_task is not None and canonical_task is not None
    for task in (copy, line_task):
        assert task.payload["raw"] == b"\xff\x00" and task.payload["oid"] == odd["oid"]
        assert task.payload["price"] == Decimal128("9.99") and task.payload["big"] == 5
        assert task.payload["at"].replace(tzinfo=dt.timezone.utc) == odd["at"]
    assert canonical_task.payload["n"] == 7 and canonical_task.payload["at"].year == 2030
    assert isinstance(scheduled, dict) and scheduled["n"] == 7


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"x": {"$oid": "zz"}}', "error: payload: not valid extended JSON"),
        ('{"x": {"$date": "soon"}}', "error: payload: not valid extended JSON"),
        ('{"x": {"$binary": 5}}', "error: payload: not valid extended JSON"),
        ('{"x": {"$where": "1"}}', "error: payload.x: field name '$where' starts with '$'"),
    ],
)
def test_a_dollar_field_that_is_not_extended_json_is_refused_naming_the_flag(
    uri: str, payload: str, message: str
):
    one_line_error(cli(uri, "publish", "k", "--name", "echo", "--payload", payload), message)
    one_line_error(
        cli(uri, "schedule", "add", "s", "--name", "x", "--every", "1h", "--payload", payload),
        message,
    )


# ------------------------------------------------------------------ 6. input the shell expects


def test_payload_from_a_file_or_stdin_and_durations_in_any_form(uri: str, tmp_path: pathlib.Path):
    (tmp_path / "p.json").write_text('{"from": "file"}')
    ok(cli(uri, "publish", "f", "--name", "echo", "--payload", f"@{tmp_path / 'p.json'}"))
    ok(cli(uri, "publish", "s", "--name", "echo", "--payload", "-", stdin='{"from": "stdin"}'))
    assert json.loads(ok(cli(uri, "show", "f", "--json")))["payload"] == {"from": "file"}
    assert json.loads(ok(cli(uri, "show", "s", "--json")))["payload"] == {"from": "stdin"}
    for text, seconds in [("90s", 90), ("1h30m", 5400), ("1.5h", 5400), ("PT30M", 1800)]:
        task = json.loads(
            ok(cli(uri, "publish", f"d:{text}", "--name", "n", "--delay", text, "--json"))
        )["task"]
        waits = dt.datetime.fromisoformat(task["not_before"]) - dt.datetime.fromisoformat(
            task["created_at"]
        )
        assert dt.timedelta(seconds=seconds - 1) < waits <= dt.timedelta(seconds=seconds), text


def test_publish_flags_for_the_common_options(uri: str):
    done = cli(
        uri,
        "publish",
        "o",
        "--name",
        "n",
        "--retries",
        "5",
        "--timeout",
        "10m",
        "--priority",
        "7",
        "--concurrency",
        "2",
        "--not-before",
        "2030-01-01T09:00+09:00",
        "--json",
    )
    options = json.loads(ok(done))["task"]["options"]
    assert options["max_unexpected_retries"] == 5 and options["timeout_ms"] == 600_000
    assert options["priority"] == 7 and options["concurrent_worker_cnt"] == 2
    assert options["not_before"].startswith("2030-01-01T00:00:00")  # 09:00 in Tokyo, in UTC
    one_line_error(
        cli(uri, "publish", "d", "--name", "n", "--depends-on", "later"),
        "error: depends_on: no task has the key(s) ['later'] (--allow-missing to ignore)",
    )
    ok(cli(uri, "publish", "d", "--name", "n", "--depends-on", "later", "--allow-missing"))
    task = json.loads(ok(cli(uri, "show", "d", "--json")))  # a missing dependency counts as met
    assert task["state"] == "pending" and task["depends_on"] == []


def test_publish_many_from_json_lines(uri: str, tmp_path: pathlib.Path):
    lines = [json.dumps({"key": f"bulk:{n}", "payload": {"n": n}}) for n in range(1200)]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    done = cli(uri, "publish-many", str(tmp_path / "tasks.jsonl"), "--name", "echo")
    assert ok(done) == "published 1200 task(s), 0 existed\n"
    again = cli(
        uri,
        "publish-many",
        "-",
        "--name",
        "echo",
        stdin=lines[0] + "\n" + json.dumps({"key": "new", "name": "other"}),
    )
    assert ok(again) == "published 1 task(s), 1 existed\n"
    rows = {
        (r["name"], r["state"]): r["count"] for r in json.loads(ok(cli(uri, "stats", "--json")))
    }
    assert rows == {("echo", "pending"): 1200, ("other", "pending"): 1}
    bad = cli(uri, "publish-many", "-", stdin='{"key": "a", "name": "n"}\n{"key": "b"}\n')
    one_line_error(bad, "error: line 2: name:")
    assert '"a"' not in ok(cli(uri, "ls", "--name", "n", "--json"))  # nothing written


def test_the_command_starts_without_loading_the_library():
    """``--help`` and usage errors need typer alone: pymongo, pydantic and the consumer load
    when a command runs."""
    heavy = ("pymongo", "pydantic", "mscheduler.api", "mscheduler.consumer", "rich")
    probe = f"import sys, mscheduler.cli.main; print([n for n in {heavy} if n in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"


# ------------------------------------------------------------------ 7. errors in the user's words


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--uri", "mongodb://[::1", "stats"],
            "error: uri: 'mongodb://[::1' is not a valid MongoDB URI",
        ),
        (
            ["limit", "set", "x", "--rate", "5", "--per", "0s"],
            "error: per: 0s is shorter than the minimum, 1ms",
        ),
        (
            ["worker", HANDLERS, "--poll-interval", "0s"],
            "error: poll-interval: 0s is shorter than the minimum, 10ms",
        ),
        (["worker", HANDLERS, "--grace", "2d"], "error: grace: 2d is longer than the maximum, 1d"),
        (
            ["purge", "--older-than", "PT1X"],
            "error: older-than: 'PT1X' is not a duration such as 90s, 15m, 1h30m",
        ),
        (
            ["schedule", "add", "s", "--name", "x", "--cron", "every day"],
            "error: cron: 'every day' is not a cron expression",
        ),
        (["retry"], "error: retry: give the KEY of a task to run again, or --failed"),
        (
            ["publish", "k", "--name", "n", "--delay", "1x"],
            "error: delay: '1x' is not a duration such as 90s",
        ),
        (["publish", "k", "--name", "n", "--retries", "-1"], "error: retries: must be at least 0"),
        (
            ["publish", "k", "--name", "n", "--concurrency", "0"],
            "error: concurrency: must be at least 1",
        ),
        (["publish", "k", "--name", "n", "--priority", "x"], "error: priority: must be an integer"),
        (["limit", "set", "x", "--max-running", "0"], "error: max-running: expected an integer"),
        (["worker", HANDLERS, "--max-running", "0"], "error: max-running: must be at least 1"),
        (["watch", "--limit", "-1"], "error: limit: must be at least 0"),
        (["events", "--limit", "-1"], "error: limit: must be at least 0"),
        (["demo", "--emails", "-1"], "error: emails: must be at least 0"),
        (
            ["dashboard", "--poll-interval", "1x"],
            "error: poll-interval: '1x' is not a duration such as 90s",
        ),
    ],
)
def test_errors_are_one_line_naming_the_flag_in_its_units(uri: str, args: list[str], message: str):
    if args[0] != "--uri":
        args = ["--uri", uri, *args]
    one_line_error(program(*args, cwd=ROOT), message)


# ------------------------------------------------------------------ 8. foot-guns


def test_purge_counts_first_and_asks(uri: str):
    async def finish_two() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            for key in ("old:1", "old:2"):
                await sched.publish(key, None, name="echo")
                lease = await sched.store.tasks.claim("w", key=key)
                assert lease is not None
                await sched.store.tasks.succeed(lease, None)

    anyio.run(finish_two)
    assert ok(cli(uri, "purge", "--older-than", "0s", "--dry-run")) == (
        "would delete 2 success task(s) that ended more than 0s ago\n"
    )
    one_line_error(cli(uri, "purge", "--older-than", "0s"), "error: purge: would delete 2 success")
    assert len(json.loads(ok(cli(uri, "ls", "--json")))) == 2  # nothing deleted
    assert ok(cli(uri, "purge", "--older-than", "0s", "--yes")) == "deleted 2 task(s)\n"


def test_an_unknown_database_is_said_beside_the_empty_result(wire_server: WireServer):
    typo = wire_server.uri.replace("/?", "/typo_db_for_tests?")
    for command in (["stats"], ["ls"]):
        done = cli(typo, *command, "--json")
        assert json.loads(ok(done)) == []
        assert done.stderr.startswith("note: database: typo_db_for_tests.tasks holds no task")


def test_a_pause_reason_is_seen_even_without_tasks(uri: str):
    ok(cli(uri, "pause", "sms", "--reason", "provider outage"))
    [row] = json.loads(ok(cli(uri, "stats", "--json")))
    assert row["name"] == "sms" and row["paused"] and row["pause_reason"] == "provider outage"
    assert ok(cli(uri, "stats")).splitlines()[1].endswith("paused: provider outage")


# ------------------------------------------------------------------ 9. long tasks spread out


def test_claim_spread_shares_a_burst_of_long_tasks(uri: str):
    """Three workers, six tasks of a second each: with --claim-spread none runs more than its
    share and a half (greedy, the first to poll would take all six)."""
    spread = ("--claim-spread", "1s", "--heartbeat", "100ms", "--names", "nap")
    workers = [
        start_worker(uri, "worker", HANDLERS, "--worker-id", f"w-{n}", *spread, cwd=ROOT)
        for n in range(3)
    ]
    try:
        for process in workers:
            read_until(process, " running ")
        deadline = dt.datetime.now() + dt.timedelta(seconds=20)
        while len(json.loads(ok(cli(uri, "workers", "--json")))) < 3:
            assert dt.datetime.now() < deadline
        time.sleep(0.5)  # a few heartbeats: each counts three live workers
        publish(uri, *((f"long:{n}", "nap", 1) for n in range(6)))
        done = wait_for_tasks(uri, [f"long:{n}" for n in range(6)])
    finally:
        for process in workers:
            process.kill()
    by_worker = Counter(task.result for task in done.values())
    assert all(task.state is ms.TaskState.SUCCESS for task in done.values())
    assert len(by_worker) >= 2 and max(by_worker.values()) <= 3, by_worker


# ------------------------------------------------------------------ 10. exit codes scripts rely on


def publish_long_keys(uri: str, count: int) -> None:
    """``count`` tasks whose keys and payloads are long: any listing of them overflows a pipe."""

    async def work() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            specs = [
                ms.TaskSpec(key=f"long:{n:04d}:{'k' * 300}", name="echo", payload="p" * 1000)
                for n in range(count)
            ]
            await sched.publish_many(specs)
            await sched.publish("big", {"text": "b" * 200_000}, name="echo")

    anyio.run(work)


@pytest.mark.parametrize(
    "command",
    [
        ["ls", "--limit", "400"],
        ["ls", "--limit", "400", "--json"],
        ["show", "big"],
        ["show", "big", "--json"],
    ],
)
def test_a_reader_that_stops_early_is_success(uri: str, command: list[str]):
    """``mscheduler ls | head -1``: the reader closes the pipe while the command still writes;
    that is what the reader asked for, not a failure of the command."""
    publish_long_keys(uri, 400)
    for _ in range(3):
        process = subprocess.Popen(
            [str(BIN), "--uri", uri, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.read(10)
        process.stdout.close()
        assert process.wait(timeout=60) == 0
        assert process.stderr.read() == ""


@pytest.mark.parametrize(
    "command",
    [["ls"], ["stats"], ["workers"], ["limit", "ls"], ["schedule", "ls"]],
)
def test_an_empty_listing_is_an_empty_list(uri: str, command: list[str]):
    assert json.loads(ok(cli(uri, *command, "--json"))) == []
    assert ok(cli(uri, *command)).count("\n") <= 1  # the header line at most


# ------------------------------------------------------------------ 11. one grammar, one rule


@pytest.mark.parametrize(
    "args",
    [
        ["worker", HANDLERS, "--grace", "5", "--heartbeat", "5", "--poll-interval", "5"],
        ["worker", HANDLERS, "--claim-spread", "5"],
        ["worker", HANDLERS, "--claim-spread", "0"],
        ["dashboard", "--poll-interval", "2s"],
        ["dashboard", "--poll-interval", "0.5"],
    ],
)
def test_every_duration_flag_takes_the_same_forms(args: list[str]):
    """A bare number is seconds, as the API's ``delay=5``; a unit form is taken by every
    command. (On memory:// the command then refuses the database: its flags were taken.)"""
    done = cli("memory://", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {args[0]}: memory:// is a database"), done.stderr


def test_a_bare_number_is_seconds(uri: str):
    task = json.loads(ok(cli(uri, "publish", "d", "--name", "n", "--delay", "5", "--json")))
    waits = dt.datetime.fromisoformat(task["task"]["not_before"]) - dt.datetime.fromisoformat(
        task["task"]["created_at"]
    )
    assert dt.timedelta(seconds=4) < waits <= dt.timedelta(seconds=5)
    ok(cli(uri, "limit", "set", "x", "--rate", "5", "--per", "60"))
    assert json.loads(ok(cli(uri, "limit", "ls", "--json")))[0]["per_ms"] == 60_000
    ok(cli(uri, "schedule", "add", "s", "--name", "x", "--every", "90", "--jitter", "1.5"))
    [schedule] = json.loads(ok(cli(uri, "schedule", "ls", "--json")))
    assert schedule["every_ms"] == 90_000 and schedule["jitter_ms"] == 1_500
    assert ok(cli(uri, "purge", "--older-than", "60", "--dry-run")).startswith("would delete 0")


def test_undoing_what_is_not_there_is_success_with_a_note(uri: str):
    """Asked twice, a command that removes or undoes something succeeds twice: the second
    time it says there was nothing to do (as ``resume`` does), and exits 0."""
    ok(cli(uri, "limit", "set", "x", "--max-running", "2"))
    assert ok(cli(uri, "limit", "rm", "x")) == "unlimited: x\n"
    assert ok(cli(uri, "limit", "rm", "x")) == "was not limited: x\n"
    ok(cli(uri, "schedule", "add", "s", "--name", "x", "--every", "1h"))
    assert ok(cli(uri, "schedule", "rm", "s")) == "removed: s\n"
    assert ok(cli(uri, "schedule", "rm", "s")) == "no schedule to remove: s\n"
    ok(cli(uri, "pause", "x"))
    assert ok(cli(uri, "resume", "x")) == "resumed: x\n"
    assert ok(cli(uri, "resume", "x")) == "was not paused: x\n"
    ok(cli(uri, "publish", "k", "--name", "x"))
    assert ok(cli(uri, "cancel", "k")) == "cancelled: k\n"
    assert ok(cli(uri, "cancel", "k")) == "already finished: k (cancelled)\n"
    one_line_error(cli(uri, "cancel", "nope"), "error: no task has the key 'nope'")
