"""What a user gets from ``pip install mscheduler``: types for the checker, a
quiet library logger, no test machinery in a production worker, a compose worker that runs
``mscheduler worker``."""

from __future__ import annotations

import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import uuid

import mscheduler as ms
from tests.engines import WireServer

ROOT = pathlib.Path(__file__).parents[2]


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_package_is_typed_and_its_logger_is_silent_by_default():
    assert (pathlib.Path(ms.__file__).parent / "py.typed").exists()
    handlers = logging.getLogger("mscheduler").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_a_worker_on_a_server_never_imports_mongomock_and_memory_still_works(
    wire_server: WireServer,
):
    """The embedded backend (mongomock) loads only when a ``memory://`` URI is opened."""
    uri = wire_server.uri.replace("/?", f"/pkg-{uuid.uuid4().hex[:8]}?")
    done = python(
        """
        import sys
        import anyio
        import mscheduler as ms
        import mscheduler.cli.main

        def loaded():
            return sorted(m for m in sys.modules if m.split(".")[0].startswith("mongomock"))

        async def echo(task):
            return task.payload

        async def main(uri):
            async with await ms.Scheduler.connect(uri) as sched:
                await sched.publish("k", 7, name="echo")
                options = ms.WorkerOptions(poll_interval_ms=20)
                async with sched.consumers({"echo": echo}, options=options):
                    task = await sched.wait("k", timeout=30, poll_interval_ms=20)
            assert task.result == 7, task
            assert loaded() == [], loaded()
            async with await ms.Scheduler.connect("memory://") as sched:
                await sched.publish("m", None, name="echo")
            assert "mongomock" in loaded(), loaded()
            print("ok")

        anyio.run(main, sys.argv[1])
        """,
        uri,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


def test_the_compose_worker_command_serves_the_example_handlers(wire_server: WireServer):
    compose = (ROOT / "docker" / "compose.yml").read_text()
    # opentelemetry-instrument sets OpenTelemetry's SDK up from the OTEL_* variables first.
    found = re.search(
        r'command: \[(?:"opentelemetry-instrument", )?"mscheduler", "worker", (.*)\]', compose
    )
    assert found is not None, "the compose worker does not run `mscheduler worker`"
    args = [part.strip().strip('"') for part in found[1].split(",")]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "WORKDIR /app/examples" in dockerfile
    process = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "mscheduler"), "worker", *args],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT / "examples",
        env={
            **os.environ,
            "MSCHEDULER_URI": wire_server.uri.replace("/?", f"/compose-{uuid.uuid4().hex[:8]}?"),
        },
    )
    try:
        assert process.stderr is not None
        lines = []
        while not any("running thumbnail, webhook" in line for line in lines):
            line = process.stderr.readline()
            assert line, f"the worker exited: {lines}"
            lines.append(line)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
