"""The engines every scenario runs on: ``memory`` (in process), ``wire`` (pymongo's real
``AsyncMongoClient`` against mongoeco's wire-protocol server, in a process of its own) and
``mongodb`` (a real server, when ``MSCHEDULER_TEST_MONGODB_URI`` is set: tests/mongodb.py).

The wire server runs from ``.venv-wire`` (``.ci/wire-venv`` makes it; mongoeco needs
Python >= 3.13) or from ``MSCHEDULER_WIRE_PYTHON``. Without one the wire variants are
deselected, with one line saying how to enable them (tests/conftest.py); under CI
(``CI=true``) they run and fail, so the tier cannot quietly stop.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from pymongo import monitoring

import mscheduler as ms
from mscheduler.testing import ManualClock

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("memory", "wire", "mongodb")  # mongodb: a real server (tests/mongodb.py)
WIRE_DATABASE = "mscheduler_test"
# Consumers and waiters in tests poll this often where the engine has no change streams.
POLL_MS = 10
# Task options whose pings and lease expiry a test's manual clock reaches in a few steps.
FAST = {"ping_interval_ms": 1_000, "worker_timeout_ms": 5_000}
# The `tally` fixture: `tally("chaos", engine, runs=1, ...)` adds counts to the run's closing
# lines (tests/conftest.py).
Tally = Callable[..., None]


def worker(worker_id: str = "w1", **fields: Any) -> ms.WorkerOptions:
    """A consumer's options in a scenario: its id, and the engines' short poll interval."""
    return ms.WorkerOptions(worker_id=worker_id, poll_interval_ms=POLL_MS, **fields)


class SkewedClock:
    """A view of the shared manual clock off by a fixed amount: a worker on another machine."""

    def __init__(self, base: ManualClock, skew_s: float) -> None:
        self.base = base
        self.skew = dt.timedelta(seconds=skew_s)

    def now(self) -> dt.datetime:
        return self.base.now() + self.skew

    async def wait_until(self, deadline: dt.datetime | None, event: anyio.Event) -> None:
        await self.base.wait_until(None if deadline is None else deadline - self.skew, event)


class OpenStreams:
    """Counts the streams the memory backend's change feed of a scheduler's database opens,
    and how many are open at once (a stream is open until closed or ended)."""

    def __init__(self, sched: ms.Scheduler) -> None:
        feed = sched.collection.changes
        self.opened = 0
        self._live: list[Any] = []
        self.most_at_once = 0
        open_stream = feed.open

        def counted(*args: Any, **kwargs: Any) -> Any:
            stream = open_stream(*args, **kwargs)
            self.opened += 1
            self._live = [s for s in self._live if s.alive] + [stream]
            self.most_at_once = max(self.most_at_once, len(self._live))
            return stream

        feed.open = counted


# What an engine lacks, named once so every skip says the same thing.
NO_CHANGE_STREAMS = "the wire engine (mongoeco) has no change streams over the wire"
NO_GRAPH_LOOKUP = "the wire engine (mongoeco) has no $graphLookup over the wire"
MEMORY_ONE_THREAD = "memory:// is used from one thread at a time (mongomock is not thread-safe)"


def needs_change_streams(engine: str) -> None:
    """For a test of the change stream itself (its errors, resume tokens, events)."""
    import pytest

    if engine == "wire":
        pytest.skip(NO_CHANGE_STREAMS)


def wire_python() -> str | None:
    configured = os.environ.get("MSCHEDULER_WIRE_PYTHON")
    if configured:
        return configured
    default = ROOT / ".venv-wire" / "bin" / "python"
    return str(default) if default.exists() else None


def wire_unavailable(reason: str) -> None:
    """Skip, or fail under CI: the wire tier must not silently stop running there."""
    import pytest

    message = f"wire tier: {reason}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message + " (CI=true: the wire tier must run)", pytrace=False)
    pytest.skip(message)


class WireServer:
    """mongoeco's server on a free loopback port, for one pytest session."""

    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, str(ROOT / "tests" / "wire" / "serve.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"the wire server did not start (it printed {line!r})")
        self.uri = f"mongodb://127.0.0.1:{int(line)}/?directConnection=true"

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Connections(monitoring.ConnectionPoolListener):
    """Counts connections checked out of pymongo's pools: an operation is in flight while
    one is. `until_idle` needs it, since a coroutine waiting on a socket counts as blocked."""

    def __init__(self) -> None:
        self.in_flight = 0

    def connection_check_out_started(
        self, event: monitoring.ConnectionCheckOutStartedEvent
    ) -> None:
        self.in_flight += 1

    def connection_check_out_failed(self, event: monitoring.ConnectionCheckOutFailedEvent) -> None:
        self.in_flight -= 1

    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None:
        self.in_flight -= 1

    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None: ...
    def pool_created(self, event: monitoring.PoolCreatedEvent) -> None: ...
    def pool_ready(self, event: monitoring.PoolReadyEvent) -> None: ...
    def pool_cleared(self, event: monitoring.PoolClearedEvent) -> None: ...
    def pool_closed(self, event: monitoring.PoolClosedEvent) -> None: ...
    def connection_created(self, event: monitoring.ConnectionCreatedEvent) -> None: ...
    def connection_ready(self, event: monitoring.ConnectionReadyEvent) -> None: ...
    def connection_closed(self, event: monitoring.ConnectionClosedEvent) -> None: ...


class _StreamWaits(monitoring.CommandListener):
    """Counts change streams' ``getMore`` calls in progress. On a server with change streams
    (a real replica set) an open stream always has one waiting for events, holding its
    connection: that is idling, not an operation `until_idle` should wait for."""

    def __init__(self) -> None:
        self.waiting = 0
        self._streams: set[int] = set()  # cursor ids of change streams
        self._opening: set[tuple[object, int]] = set()
        self._waits: set[tuple[object, int]] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        key = (event.connection_id, event.request_id)
        command = event.command
        if event.command_name == "aggregate":
            first = (command.get("pipeline") or [{}])[0]
            if "$changeStream" in first:
                self._opening.add(key)
        elif event.command_name == "getMore" and command.get("getMore") in self._streams:
            self._waits.add(key)
            self.waiting += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        key = (event.connection_id, event.request_id)
        if key in self._opening:
            self._opening.discard(key)
            self._streams.add(int(event.reply.get("cursor", {}).get("id", 0)))
        self._ended(key)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        key = (event.connection_id, event.request_id)
        self._opening.discard(key)
        self._ended(key)

    def _ended(self, key: tuple[object, int]) -> None:
        if key in self._waits:
            self._waits.discard(key)
            self.waiting -= 1


CONNECTIONS = _Connections()
STREAM_WAITS = _StreamWaits()
monitoring.register(CONNECTIONS)  # applies to every client created after this import
monitoring.register(STREAM_WAITS)


def operations_in_flight() -> int:
    """Database operations under way, not counting change streams waiting for events."""
    return CONNECTIONS.in_flight - STREAM_WAITS.waiting


async def until_idle(rounds: int = 3) -> None:
    """Let every task run until it blocks on the clock or an event, not on the database: a
    few rounds for chains of wake-ups. On the wire a coroutine awaiting a reply looks blocked
    too, so wait (in real time, briefly) until no operation is in flight."""
    for _ in range(rounds):
        # A reply that never comes (10 real seconds) is a failure, not a hang.
        for _ in range(20_000):
            await anyio.wait_all_tasks_blocked()
            if operations_in_flight() <= 0:
                break
            await anyio.sleep(0.0005)
        else:
            raise AssertionError(f"{operations_in_flight()} database operations never finished")
