"""The ``mscheduler`` command: in process against each engine (``--uri``), and as a program."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import anyio
import pytest
from typer.testing import CliRunner

import mscheduler as ms
from mscheduler.backends.memory import forget_memory_server
from mscheduler.cli.main import app
from mscheduler.models import WorkerStateKind
from tests.engines import WireServer

runner = CliRunner()


@pytest.fixture
def uri(engine: str, engine_uri: str) -> Iterator[str]:
    """A database of the test's own: a named memory one, or on the wire one named in the URI
    (which the CLI uses, as ``--database`` is not given)."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    if engine == "memory":
        yield f"memory://{name}"
        forget_memory_server(name)
    else:
        yield engine_uri.replace("/?", f"/{name}?")


def fill(uri: str) -> None:
    async def work() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            await sched.publish("email:1", {"to": "a@b.c"}, name="email")
            await sched.publish("email:2", {"to": "d@e.f"}, name="email")
            await sched.publish(
                "sms:1", None, name="sms", options=ms.TaskOptions(max_unexpected_retries=0)
            )
            lease = await sched.store.tasks.claim("w1", key="sms:1")
            assert lease is not None
            await sched.store.tasks.fail(lease, RuntimeError("no signal"))

    anyio.run(work)


def cli(uri: str, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["--uri", uri, *args])
    return result.exit_code, result.stdout, result.stderr


def test_ls_and_stats_as_json(uri: str):
    fill(uri)
    code, out, _ = cli(uri, "ls", "--json")
    assert code == 0
    assert sorted(task["key"] for task in json.loads(out)) == ["email:1", "email:2", "sms:1"]
    code, out, _ = cli(uri, "ls", "--state", "fail", "--json")
    assert [task["key"] for task in json.loads(out)] == ["sms:1"]
    code, out, _ = cli(uri, "stats", "--json")
    rows = {(row["name"], row["state"]): row["count"] for row in json.loads(out)}
    assert rows == {("email", "pending"): 2, ("sms", "fail"): 1}


def test_publish_show_cancel(uri: str):
    code, out, _ = cli(
        uri, "publish", "k", "--name", "email", "--payload", '{"to": "x"}', "--priority", "3"
    )
    assert code == 0 and "published: k" in out
    code, out, _ = cli(uri, "publish", "k", "--name", "email", "--payload", '{"to": "y"}')
    assert code == 0 and "exists, unchanged" in out
    code, out, _ = cli(uri, "show", "k", "--json")
    task = json.loads(out)
    assert task["payload"] == {"to": "x"} and task["options"]["priority"] == 3
    assert cli(uri, "cancel", "k")[0] == 0
    code, out, _ = cli(uri, "cancel", "k")
    assert code == 0 and out == "already finished: k (cancelled)\n"
    code, out, err = cli(uri, "cancel", "nothing")
    assert (code, out, err) == (2, "", "error: no task has the key 'nothing'\n")


def test_publish_replaces_a_finished_task_by_its_state(uri: str):
    fill(uri)  # sms:1 failed
    code, out, _ = cli(uri, "publish", "sms:1", "--name", "sms", "--replace-finished", "cancelled")
    assert code == 0 and out == "exists, unchanged: sms:1 (fail)\n"
    code, out, _ = cli(
        uri, "publish", "sms:1", "--name", "sms", "--replace-finished", "fail,cancelled"
    )
    assert code == 0 and out == "published anew: sms:1 (pending)\n"
    code, _, err = cli(uri, "publish", "sms:1", "--name", "sms", "--replace-finished", "running")
    assert code == 2 and "replace-finished: 'running' is not a finished state" in err
    code, _, err = cli(uri, "publish", "sms:1", "--name", "sms", "--replace-finished", ",")
    assert code == 2 and "replace-finished" in err


def test_cancel_every_task_of_a_name(uri: str):
    fill(uri)  # email:1 and email:2 pending, sms:1 failed
    code, _, err = cli(uri, "cancel", "--name", "email")
    assert code == 2 and err.startswith("error: yes: this cancels every pending/blocked task")
    assert "--yes" in err
    code, _, err = cli(uri, "cancel", "--name", "email", "--state", "success", "--yes")
    assert code == 2 and err.startswith("error: state: only unfinished tasks can be cancelled")
    code, out, _ = cli(uri, "cancel", "--name", "email", "--yes")
    assert code == 0 and out == "cancelled 2 task(s) of email\n"
    code, out, _ = cli(uri, "ls", "--name", "email", "--state", "cancelled", "--json")
    assert sorted(t["key"] for t in json.loads(out)) == ["email:1", "email:2"]
    code, out, _ = cli(uri, "cancel", "--name", "email", "--state", "running", "--yes")
    assert code == 0 and out == "cancelled 0 task(s) of email\n"
    code, _, err = cli(uri, "cancel", "email:1", "--name", "email", "--yes")
    assert code == 2 and "give a KEY or --name, not both" in err


def test_retry_failed_and_purge(uri: str):
    fill(uri)
    code, out, _ = cli(uri, "retry", "--failed")
    assert code == 0 and "retried 1 task(s)" in out
    code, out, _ = cli(uri, "ls", "--state", "pending", "--json")
    assert "sms:1" in [t["key"] for t in json.loads(out)]
    code, out, _ = cli(uri, "purge", "--state", "success", "--older-than", "7d")
    assert code == 0 and "deleted 0 task(s)" in out


def test_indexes_are_created_and_listed(uri: str):
    code, out, _ = cli(uri, "indexes", "--finished-ttl", "30d", "--json")
    assert code == 0
    listing = json.loads(out)
    assert {"key_unique", "claim_order_v2", "finished_ttl"} <= set(listing)


def test_watch_prints_each_change_until_the_limit(uri: str, monkeypatch: pytest.MonkeyPatch):
    """The command's own part; `Scheduler.watch` itself is tested on a live stream in
    tests/scenarios/test_wait.py (the memory backend cannot be written from another thread)."""
    fill(uri)  # on the wire too: the stream is replaced below

    async def changes(self: ms.Scheduler, *, names: list[str] | None = None):  # type: ignore[no-untyped-def]
        for task in await self.list_tasks(limit=10):
            yield task

    monkeypatch.setattr(ms.Scheduler, "watch", changes)
    code, out, _ = cli(uri, "watch", "--json", "--limit", "2")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 2 and set(lines[0]) == {"key", "name", "state", "version", "progress"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["publish", "k", "--name", "x", "--payload", "{not json"], "payload: not valid JSON"),
        (["ls", "--state", "done"], "state: 'done' is not one of pending"),
        (["show", "nope"], "no task has the key 'nope'"),
        (["purge", "--older-than", "soon"], "is not a duration"),
        (["retry"], "retry: give the KEY of a task to run again, or --failed"),
        (["publish", "k", "--name", ""], "error: name: must be a non-empty string"),
        (["worker", "no.such.module:handlers"], "cannot load 'no.such.module:handlers'"),
    ],
)
def test_user_errors_are_one_line(uri: str, args: list[str], message: str):
    code, out, err = cli(uri, *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err + out


def test_bad_uri_is_one_line():
    result = runner.invoke(app, ["--uri", "redis://localhost", "stats"])
    assert result.exit_code == 2 and result.stderr.startswith("error: uri: unsupported scheme")


# ------------------------------------------------------------------------ the installed command

BIN = pathlib.Path(sys.executable).parent / "mscheduler"


ROOT = pathlib.Path(__file__).parents[2]
needs_bin = pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")


def program(
    *args: str, env: dict[str, str] | None = None, cwd: pathlib.Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
    )


@pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")
def test_demo_completes_and_prints_statistics():
    done = program("demo", "--emails", "8")
    assert done.returncode == 0, done.stderr
    assert "statistics" in done.stdout
    assert "report" in done.stdout and "success" in done.stdout


@pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")
def test_json_output_parses_and_env_vars_apply():
    done = program("stats", "--json", env={"MSCHEDULER_URI": "memory://from-env"})
    assert done.returncode == 0 and json.loads(done.stdout) == []


@pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--uri", "mongodb://h:notaport", "stats"], "error: uri:"),
        (["publish", "k", "--name", "n", "--payload", "[1,"], "error: payload: not valid JSON"),
        (["ls", "--state", "nope"], "error: state: 'nope' is not one of"),
    ],
)
def test_program_errors_exit_non_zero_with_one_line(args: list[str], message: str):
    done = program(*args)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1


def wire_db(server: WireServer) -> str:
    """A database of its own on the wire engine: a real server, in another process."""
    return server.uri.replace("/?", f"/cli-{uuid.uuid4().hex[:8]}?")


def start_worker(uri: str, *args: str, cwd: pathlib.Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN), "--uri", uri, *args],
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "MSCHEDULER_POLL_INTERVAL": "50ms", **env},
    )


def read_until(process: subprocess.Popen[str], text: str) -> list[str]:
    """stderr lines up to the one holding ``text`` (the worker logs before it says so)."""
    assert process.stderr is not None
    lines: list[str] = []
    while not any(text in line for line in lines):
        line = process.stderr.readline()
        assert line, f"the worker exited before saying {text!r}: {lines}"
        lines.append(line)
    return lines


def wait_for_tasks(uri: str, keys: list[str]) -> dict[str, ms.Task]:
    async def work() -> dict[str, ms.Task]:
        async with await ms.Scheduler.connect(uri) as sched:
            return await sched.wait_many(keys, timeout=60, poll_interval_ms=50)

    return anyio.run(work)


def publish(uri: str, *tasks: tuple[str, str, object]) -> None:
    async def work() -> None:
        async with await ms.Scheduler.connect(uri) as sched:
            for key, name, payload in tasks:
                options = ms.TaskOptions(max_unexpected_retries=0)
                await sched.publish(key, payload, name=name, options=options)

    anyio.run(work)


@needs_bin
def test_worker_serves_metrics_and_stops_gracefully_on_sigint(wire_server: WireServer):
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = start_worker(
        wire_db(wire_server),
        "worker",
        "tests.acceptance.handlers_for_tests:handlers",
        "--metrics-port",
        str(port),
        cwd=ROOT,
    )
    try:
        read_until(process, " running ")
        deadline = time.monotonic() + 20
        while True:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "no /metrics"
                time.sleep(0.1)
        assert b"mscheduler_tasks" in page or b"mscheduler_handler_seconds" in page
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) in (0, 130)  # 130: ended by the signal, as asked
        assert process.stderr is not None
        assert "stopping gracefully" in process.stderr.read()
    finally:
        process.kill()


@needs_bin
def test_worker_imports_from_the_current_directory_and_runs_sync_handlers(
    wire_server: WireServer, tmp_path: pathlib.Path
):
    """``mscheduler worker myapp.tasks:handlers`` from the project's
    directory, as with ``celery -A``; a registry with a sync handler; a failure logged as a
    JSON line naming the task."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(
        textwrap.dedent(
            """
            import threading
            import mscheduler as ms

            handlers = ms.Handlers()

            @handlers.task("resize")
            def resize(task):  # a plain function: run in a worker thread
                return {"size": task.payload * 2, "thread": threading.current_thread().name}

            @handlers.task("charge")
            async def charge(task):
                raise RuntimeError("card declined")
            """
        )
    )
    uri = wire_db(wire_server)
    publish(uri, ("img", "resize", 21), ("pay", "charge", None))
    process = start_worker(
        uri, "--log-format", "json", "worker", "myapp.tasks:handlers", cwd=tmp_path
    )
    try:
        said = read_until(process, "running charge, resize")
        done = wait_for_tasks(uri, ["img", "pay"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert process.stderr is not None
        lines = said + process.stderr.read().splitlines()
    finally:
        process.kill()
    assert done["img"].state is ms.TaskState.SUCCESS and done["img"].result["size"] == 42
    assert done["img"].result["thread"] != "MainThread"
    assert done["pay"].state is ms.TaskState.FAIL
    records = [json.loads(line) for line in lines if line.startswith("{")]
    failed = [r for r in records if r.get("key") == "pay"]
    assert len(failed) == 1 and failed[0]["level"] == "WARNING"
    assert failed[0]["action"] == "task_failed" and failed[0]["attempt"] == 1
    assert failed[0]["error"] == "RuntimeError: card declined"
    assert "card declined" in failed[0]["exc_info"]  # the traceback, as the task failed for good
    # The polling fallback is said once, as a JSON line too (the wire engine has no streams).
    assert any(r.get("action") == "polling_fallback" for r in records)


@needs_bin
def test_worker_without_metrics_runs_until_sigterm(wire_server: WireServer):
    process = start_worker(
        wire_db(wire_server),
        "worker",
        "tests.acceptance.handlers_for_tests:handlers",
        "--names",
        "echo",
        cwd=ROOT,
    )
    try:
        read_until(process, " running ")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert process.stderr is not None
        assert "SIGTERM: stopping gracefully" in process.stderr.read()
    finally:
        process.kill()


@needs_bin
def test_a_second_sigint_releases_the_running_tasks_at_once(wire_server: WireServer):
    """The first Ctrl-C says what it waits for and for how long; the second cancels the
    handlers and releases their leases: nothing stays ``running``, nothing counts as a failure,
    and the process exits within seconds, not at the grace period's end."""
    import time

    uri = wire_db(wire_server)
    publish(uri, ("slow:1", "slow", None), ("slow:2", "slow", None))
    process = start_worker(
        uri,
        "worker",
        "tests.acceptance.handlers_for_tests:handlers",
        "--names",
        "slow",
        "--grace",
        "10m",
        cwd=ROOT,
    )

    async def states() -> list[ms.Task]:
        async with await ms.Scheduler.connect(uri) as sched:
            return [t for t in [await sched.get("slow:1"), await sched.get("slow:2")] if t]

    try:
        read_until(process, "running slow")
        deadline = time.monotonic() + 30
        while any(t.state is not ms.TaskState.RUNNING for t in anyio.run(states)):
            assert time.monotonic() < deadline, "the worker never ran both tasks"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        said = read_until(process, "stopping gracefully")
        assert "waiting up to 600 s for 2 running task(s)" in said[-1]
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) in (0, 130)  # 130: ended by the signal, as asked
        assert time.monotonic() - stopped_at < 5
        assert process.stderr is not None
        assert "stopping now" in process.stderr.read()
    finally:
        process.kill()
    for task in anyio.run(states):
        assert task.state is ms.TaskState.PENDING, task
        assert task.unexpected_failures == 0
        assert [ws.state for ws in task.worker_states] == [WorkerStateKind.RELEASED]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@needs_bin
@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads /proc")
def test_worker_isolate_runs_plain_handlers_in_children_that_end_with_a_killed_worker(
    wire_server: WireServer, tmp_path: pathlib.Path
):
    """``--isolate``: the plain def handlers run in child processes; one that exits fails its
    own task alone; after a ``kill -9`` of the worker, its child running a handler ends too."""
    import time

    uri = wire_db(wire_server)
    pid_file = tmp_path / "stuck.pid"
    publish(uri, ("p", "pid", 1), ("d", "exit_3", None))
    process = start_worker(uri, "worker", "tests.isolated_handlers:handlers", "--isolate", cwd=ROOT)
    try:
        said = read_until(process, " running ")
        assert "(in child processes: exit_3, pid, stuck)" in said[-1]
        done = wait_for_tasks(uri, ["p", "d"])
        publish(uri, ("s", "stuck", str(pid_file)))
        deadline = time.monotonic() + 30
        while not pid_file.exists():
            assert time.monotonic() < deadline, "the stuck handler never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert child != process.pid and process_alive(child)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while process_alive(child):
            assert time.monotonic() < deadline, "the child outlived its killed worker"
            time.sleep(0.05)
    finally:
        process.kill()
    assert done["p"].state is ms.TaskState.SUCCESS
    assert done["p"].result["pid"] not in (process.pid, os.getpid())
    assert done["d"].state is ms.TaskState.FAIL and done["d"].error is not None
    assert done["d"].error.type == "HandlerProcessDied"
    assert "exited with code 3" in done["d"].error.message


@needs_bin
def test_watch_polls_a_server_without_change_streams(wire_server: WireServer):
    """The wire engine has no change streams: ``watch`` says once that it polls, and prints a
    task published after it started."""
    uri = wire_db(wire_server)
    process = subprocess.Popen(
        [str(BIN), "--uri", uri, "watch", "--json", "--limit", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        said = read_until(process, "polling every")
        publish(uri, ("late:1", "late", {"n": 1}))
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(p["key"], p["state"]) for p in printed] == [("late:1", "pending")]
    assert sum("polling every" in line for line in [*said, *err.splitlines()]) == 1


@needs_bin
def test_a_busy_metrics_port_is_one_line(wire_server: WireServer):
    import socket

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = program(
            "--uri",
            wire_db(wire_server),
            "worker",
            "tests.acceptance.handlers_for_tests:handlers",
            "--metrics-port",
            str(port),
            cwd=ROOT,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: metrics-port: cannot listen on {port}")
    assert done.stderr.count("\n") == 1


# ------------------------------------------------------------------------ first-hour errors


@needs_bin
def test_commands_say_when_their_database_is_private_to_the_process():
    done = program("publish", "k", "--name", "email")
    assert done.returncode == 0 and "published: k" in done.stdout
    assert done.stderr.startswith("note: memory:// is a database inside this process")
    assert "--uri (or MSCHEDULER_URI)" in done.stderr and done.stderr.count("\n") == 1
    for command in (["worker", "tests.acceptance.handlers_for_tests:handlers"], ["watch"]):
        refused = program(*command, cwd=ROOT)
        assert refused.returncode == 2
        assert refused.stderr.startswith(f"error: {command[0]}: memory:// is a database inside")
        assert refused.stderr.count("\n") == 1


@needs_bin
@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("def broken(:\n", "raised SyntaxError"),
        ("raise RuntimeError('no config')\n", "raised RuntimeError: no config"),
        ("import no_such_dependency\n", "raised ModuleNotFoundError"),
        ("other = {}\n", "module badapp has no 'handlers'"),
    ],
)
def test_a_handlers_module_that_cannot_be_imported_is_one_line(
    tmp_path: pathlib.Path, module: str, message: str
):
    (tmp_path / "badapp.py").write_text(module)
    done = program("worker", "badapp:handlers", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: worker: ") and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@needs_bin
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-level", "bogus", "stats"], "error: log-level: 'bogus' is not one of debug,"),
        (["--log-format", "xml", "stats"], "error: log-format: 'xml' is not one of text, json"),
        (["publish", "k", "--name", "n", "--priority", "high"], "error: priority: must be an"),
        (["nosuchcommand"], "error: 'nosuchcommand' is not a command of mscheduler"),
        (["limit", "nosuch"], "error: 'nosuch' is not a command of mscheduler limit"),
        (["stats", "--bogus"], "error: --bogus: no such option"),
        (["worker", "x:y", "--metrics-port", "70000"], "error: metrics-port: 70000 is not a TCP"),
        (["worker", "x:y", "--metrics-port", "-1"], "error: metrics-port: -1 is not a TCP port"),
        (["publish", "k", "--name", "n", "--payload", "NaN"], "error: payload: not valid JSON"),
        (
            ["publish", "k", "--name", "n", "--payload", "1e999"],
            "error: payload: not valid JSON (1e999",
        ),
        (
            ["publish", "k", "--name", "n", "--payload", '{"x": {"$numberDecimal": "abc"}}'],
            "error: payload: not valid extended JSON: a $numberDecimal must be a decimal",
        ),
        (
            ["publish", "k", "--name", "n", "--not-before", "2030-01-01T09:00"],
            "error: not-before: '2030-01-01T09:00' has no timezone",
        ),
        (["publish", "k", "--name", "n", "--delay", "soon"], "error: delay: 'soon' is not a dur"),
        (
            ["--uri", "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=200", "stats"],
            "error: cannot reach MongoDB at",
        ),
    ],
)
def test_user_errors_of_the_program_are_one_line(args: list[str], message: str):
    done = program(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert len(done.stderr) < 400  # the topology description is not printed


@needs_bin
def test_the_full_server_error_is_in_the_debug_log():
    uri = "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=200"
    done = program("--log-level", "debug", "--uri", uri, "stats")
    assert done.returncode == 2 and "Topology Description" in done.stderr


@needs_bin
def test_version_and_delay():
    done = program("--version")
    assert done.returncode == 0 and done.stdout == f"mscheduler {ms.__version__}\n"
    done = program("publish", "k", "--name", "n", "--delay", "90s", "--json")
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)["task"]
    created = dt.datetime.fromisoformat(task["created_at"])
    waits = dt.datetime.fromisoformat(task["not_before"]) - created  # from the moment of asking
    assert dt.timedelta(seconds=89) < waits <= dt.timedelta(seconds=90)


def test_schedule_add_ls_rm(uri: str):
    code, out, err = cli(
        uri,
        "schedule",
        "add",
        "nightly",
        "--name",
        "report",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
        "--payload",
        '{"kind": "sales"}',
        "--skip-if-running",
        "--catch-up",
        "none",
        "--jitter",
        "30s",
    )
    assert code == 0, err
    assert out.startswith("scheduled: nightly (next ")
    code, out, _ = cli(uri, "schedule", "add", "tick", "--name", "tick", "--every", "15m")
    assert code == 0
    code, out, _ = cli(uri, "schedule", "ls", "--json")
    listed = {s["_id"]: s for s in json.loads(out)}
    assert listed["nightly"]["cron"] == "0 3 * * *" and listed["nightly"]["catch_up"] == "none"
    assert listed["nightly"]["skip_if_running"] and listed["nightly"]["jitter_ms"] == 30_000
    assert listed["tick"]["every_ms"] == 900_000
    assert cli(uri, "schedule", "rm", "tick")[0] == 0
    assert cli(uri, "schedule", "rm", "tick")[:2] == (0, "no schedule to remove: tick\n")
    code, _, err = cli(uri, "schedule", "add", "bad", "--name", "x", "--cron", "every day")
    assert code == 2 and err.startswith("error: cron:") and err.count("\n") == 1


def test_pause_resume_and_stats_show_it(uri: str):
    fill(uri)
    assert cli(uri, "pause", "email", "--reason", "quota")[1] == "paused: email\n"
    assert cli(uri, "pause", "email")[1] == "already paused: email\n"
    out = cli(uri, "stats", "--json")[1]
    paused = {(row["name"], row["state"]): row["paused"] for row in json.loads(out)}
    assert paused == {("email", "pending"): True, ("sms", "fail"): False}
    lines = cli(uri, "stats")[1].splitlines()  # not a terminal: tab-separated, whole values
    assert lines[0].split("\t") == [
        "name",
        "state",
        "count",
        "running",
        "live workers",
        "oldest pending",
        "note",
    ]
    email = lines[1].split("\t")
    assert email[:3] == ["email", "pending", "2"] and email[-1].startswith("paused: quota")
    assert cli(uri, "resume", "email")[1] == "resumed: email\n"
    assert cli(uri, "resume", "email")[1] == "was not paused: email\n"


def test_publish_with_debounce_and_expiry(uri: str):
    code, out, err = cli(
        uri, "publish", "k", "--name", "n", "--debounce", "5s", "--expires-in", "1h"
    )
    assert code == 0, err
    code, out, _ = cli(uri, "publish", "k", "--name", "n", "--debounce", "5s", "--payload", "2")
    assert code == 0 and out.startswith("debounced: k")
    task = json.loads(cli(uri, "show", "k", "--json")[1])
    assert task["payload"] == 2 and task["options"]["expires_at"] is not None


def test_limit_set_ls_rm(uri: str):
    code, out, err = cli(uri, "limit", "set", "email", "--rate", "100", "--per", "1m")
    assert code == 0 and out == "limited: email\n", err
    assert cli(uri, "limit", "set", "render", "--max-running", "2")[0] == 0
    out = cli(uri, "limit", "ls")[1]
    assert out.splitlines() == [
        "name\tstarts\trunning\tper partition",
        "email\t0/100 per 1m\t-\t-",
        "render\t-\t0/2\t-",
    ]
    listed = {row["name"]: row for row in json.loads(cli(uri, "limit", "ls", "--json")[1])}
    assert listed["email"]["rate"] == 100 and listed["email"]["per_ms"] == 60_000
    assert listed["render"]["max_running"] == 2 and listed["render"]["running"] == 0
    assert cli(uri, "limit", "rm", "render")[1] == "unlimited: render\n"
    assert cli(uri, "limit", "rm", "render")[:2] == (0, "was not limited: render\n")
    code, _, err = cli(uri, "limit", "set", "email", "--rate", "0", "--per", "1m")
    assert code == 2 and err.startswith("error: rate: expected an integer")


def test_limit_set_partition_max_running_and_publish_a_partition(uri: str):
    code, out, err = cli(uri, "limit", "set", "report", "--partition-max-running", "1")
    assert code == 0 and out == "limited: report\n", err
    for key in ("r1", "r2"):
        code, _, err = cli(uri, "publish", key, "--name", "report", "--partition", "tenant-7")
        assert code == 0, err
    assert json.loads(cli(uri, "show", "r1", "--json")[1])["options"]["partition"] == "tenant-7"
    assert cli(uri, "limit", "ls")[1].splitlines() == [
        "name\tstarts\trunning\tper partition",
        "report\t-\t-\t0/1 (busiest)",
    ]
    [listed] = json.loads(cli(uri, "limit", "ls", "--json")[1])
    assert listed["partition_max_running"] == 1 and listed["busiest_partition_running"] == 0
    code, _, err = cli(uri, "limit", "set", "report", "--partition-max-running", "0")
    assert code == 2 and err.startswith("error: partition-max-running: expected an integer"), err
    code, _, err = cli(uri, "publish", "r3", "--name", "report", "--partition", "x" * 513)
    assert code == 2 and err.startswith("error: partition: 513 characters long"), err
    assert cli(uri, "show", "r3")[0] != 0  # nothing written
    assert cli(uri, "limit", "rm", "report")[1] == "unlimited: report\n"


def test_refused_credentials_are_said_as_such(monkeypatch: pytest.MonkeyPatch):
    """A wrong password is not "cannot reach MongoDB": the server answered, and said no. (The
    wire engine has no users, so the client is replaced by one whose server refuses.)"""
    from pymongo.errors import OperationFailure

    import mscheduler.backends.uri as uri_module

    class RefusingClient:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.admin = self

        async def command(self, *args: object) -> None:
            reply = {"ok": 0, "errmsg": "Authentication failed.", "code": 18}
            raise OperationFailure("Authentication failed.", 18, reply)

        async def close(self) -> None: ...

    monkeypatch.setattr(uri_module, "AsyncMongoClient", RefusingClient)
    result = runner.invoke(app, ["--uri", "mongodb://ops:secret@db.example:27017/", "stats"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: uri: MongoDB at 'mongodb://ops:***@db.example:27017/' refused the credentials: "
        "Authentication failed.\n"
    )


def test_serve_refuses_another_interface_without_a_token():
    code, _, err = cli("memory://serve-refused", "serve", "--host", "0.0.0.0")
    assert code == 2 and "--token" in err


def start_server(*args: str, serve: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], str]:
    """``mscheduler serve`` on a free port (``python -m mscheduler``, so the package of this
    checkout), and its address once it listens. ``serve``: the command's own flags."""
    root = pathlib.Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-m", "mscheduler", *args, "serve", "--port", "0", *serve],
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    line = read_until(process, "serve: http://")[-1]
    return process, line.split("serve: ")[1].split()[0].rstrip("/")


def test_serve_answers_with_its_token_on_a_free_port():
    import httpx

    process, address = start_server("--uri", "memory://served", "--log-level", "warning")
    try:
        with httpx.Client(base_url=address, timeout=30) as http:
            assert http.get("/openapi.json").status_code == 200
            assert http.get("/v1/stats").status_code == 200  # no token given: none asked
            body = {"key": "k", "name": "job"}
            assert http.post("/v1/tasks", json=body).status_code == 201
            owned = http.post("/v1/own", json={"names": ["job"], "worker_id": "w"}).json()
            assert [lease["key"] for lease in owned["leases"]] == ["k"]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) in (0, 130)  # 130: ended by the signal, as asked


SERVED_TOKEN = "a-token-of-24-characters"


@pytest.mark.parametrize(
    ("allowed", "answered", "refused"),
    [
        ((), ["192.0.2.7", "tasks.example", "localhost"], []),
        (("--allowed-host", "tasks.example"), ["tasks.example", "localhost"], ["192.0.2.7"]),
    ],
)
def test_serve_on_every_interface_answers_the_names_a_token_guards(
    allowed: tuple[str, ...], answered: list[str], refused: list[str]
):
    """``serve --host 0.0.0.0 --token T`` is reached by the machine's address or any name it
    has (the token guards it); ``--allowed-host`` narrows that to the names given and the
    loopback ones, as the dashboard's flag does."""
    import httpx

    process, address = start_server(
        "--uri",
        "memory://every-interface",
        "--log-level",
        "warning",
        serve=("--host", "0.0.0.0", "--token", SERVED_TOKEN, *allowed),
    )
    port = address.rsplit(":", 1)[1]
    auth = {"Authorization": f"Bearer {SERVED_TOKEN}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for name in answered:
                reply = http.get("/v1/stats", headers={**auth, "Host": f"{name}:{port}"})
                assert reply.status_code == 200, (name, reply.text)
            for name in refused:
                reply = http.get("/v1/stats", headers={**auth, "Host": f"{name}:{port}"})
                assert reply.status_code == 400 and reply.json()["error"] == "bad_host"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) in (0, 130)


@needs_bin
@pytest.mark.parametrize("command", ["serve", "dashboard"])
def test_a_busy_port_is_one_line_before_anything_is_announced(
    wire_server: WireServer, command: str
):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = program("--uri", wire_db(wire_server), command, "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"error: port: {port} on 127.0.0.1 is in use by another program; choose another --port\n"
    )


@needs_bin
def test_help_shows_no_type_beside_a_flag_and_wraps_whole_sentences():
    wide = {"COLUMNS": "200"}
    for command in (
        [],
        ["publish"],
        ["worker"],
        ["dashboard"],
        ["schedule", "add"],
        ["limit", "set"],
        ["workers", "stop"],
    ):
        done = program(*command, "--help", env=wide)
        assert done.returncode == 0, done.stderr
        assert "--help" in done.stdout and "<bool>" not in done.stdout, command
    # Paragraphs of several source lines, each on one line of a wide terminal.
    listed = program("--help", env=wide).stdout
    assert "The attempts of the earlier runs stay in its history" in listed
    worker = program("worker", "--help", env=wide).stdout
    assert "a mapping of task name to handler (async or plain functions)" in worker
