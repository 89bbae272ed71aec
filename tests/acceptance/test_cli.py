"""The ``mscheduler`` command: in process against each engine (``--uri``), and as a program."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Iterator

import anyio
import pytest
from typer.testing import CliRunner

import mscheduler as ms
from mscheduler.backends.memory.server import forget_memory_server
from mscheduler.cli.main import app

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
            lease = await sched.store.claim("w1", key="sms:1")
            assert lease is not None
            await sched.store.fail(lease, RuntimeError("no signal"))

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
    code, _, err = cli(uri, "cancel", "k")
    assert code == 2 and "already finished" in err


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
    tests/unit/test_wait.py (the memory backend cannot be written from another thread)."""
    fill(uri)  # on the wire too: the stream is replaced below

    async def changes(self: ms.Scheduler, *, names: list[str] | None = None):  # type: ignore[no-untyped-def]
        for task in await self.list_tasks(limit=10):
            yield task

    monkeypatch.setattr(ms.Scheduler, "watch", changes)
    code, out, _ = cli(uri, "watch", "--json", "--limit", "2")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 2 and set(lines[0]) == {"key", "name", "state", "version"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["publish", "k", "--name", "x", "--payload", "{not json"], "payload: not valid JSON"),
        (["ls", "--state", "done"], "state: 'done' is not one of pending"),
        (["show", "nope"], "no task has the key 'nope'"),
        (["purge", "--older-than", "soon"], "is not a duration"),
        (["retry"], "give a KEY or --failed"),
        (["publish", "k", "--name", ""], "name must be a non-empty string"),
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


def program(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        timeout=120,
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


@pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")
def test_worker_serves_metrics_and_stops_gracefully_on_sigint():
    import signal as signals
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = pathlib.Path(__file__).parents[2]
    process = subprocess.Popen(
        [
            str(BIN),
            "worker",
            "tests.acceptance.handlers_for_tests:handlers",
            "--metrics-port",
            str(port),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert process.stderr is not None
        started = [process.stderr.readline() for _ in range(2)]
        assert any("running echo" in line for line in started), started
        deadline = time.monotonic() + 20
        while True:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "no /metrics"
                time.sleep(0.1)
        assert b"mscheduler_tasks" in page or b"mscheduler_handler_seconds" in page
        process.send_signal(signals.SIGINT)
        assert process.wait(timeout=30) == 0
        assert "stopping gracefully" in process.stderr.read()
    finally:
        process.kill()


@pytest.mark.skipif(not BIN.exists(), reason="the mscheduler command is not installed")
def test_worker_without_metrics_runs_until_sigterm():
    import signal as signals

    root = pathlib.Path(__file__).parents[2]
    process = subprocess.Popen(
        [str(BIN), "worker", "tests.acceptance.handlers_for_tests:handlers", "--names", "echo"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert process.stderr is not None
        assert "running echo" in process.stderr.readline()
        process.send_signal(signals.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "SIGTERM: stopping gracefully" in process.stderr.read()
    finally:
        process.kill()
