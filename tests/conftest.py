from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

import mscheduler as ms
from mscheduler.backends.memory.server import forget_memory_server
from tests.engines import (
    ENGINES,
    POLL_MS,
    WIRE_DATABASE,
    WireServer,
    settle,
    wire_python,
    wire_unavailable,
)

OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ms.ManualClock:
    return ms.ManualClock()


@pytest.fixture(scope="session")
def wire_server() -> Iterator[WireServer]:
    python = wire_python()
    if python is None:
        wire_unavailable("no wire engine: run .ci/wire-venv (needs Python >= 3.13)")
    assert python is not None
    server = WireServer(python)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Every test that asks for it (or for `scheduler`) runs once per engine."""
    return str(request.param)


@pytest.fixture
def engine_uri(engine: str, request: pytest.FixtureRequest) -> str:
    """A URI of the engine, for code that connects by itself (the CLI, the examples)."""
    if engine == "wire":
        server: WireServer = request.getfixturevalue("wire_server")
        return server.uri
    if engine == "mongodb":  # tests/integration: a real replica set
        return os.environ["MSCHEDULER_TEST_MONGODB_URI"]
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def server_database() -> str:
    """The database the wire (and integration) tests make their collections in: the
    integration tier gives each run its own (tests/integration/conftest.py)."""
    return WIRE_DATABASE


@pytest.fixture
def prepare_collection() -> Callable[[str, str], None]:
    """Called with (database, collection) before a test's collection on a server is first
    opened: nothing to do here; on a sharded cluster the integration tier shards it."""
    return lambda database, collection: None


@pytest.fixture
async def open_scheduler(
    engine: str,
    clock: ms.ManualClock,
    request: pytest.FixtureRequest,
    server_database: str,
    prepare_collection: Callable[[str, str], None],
) -> AsyncIterator[OpenScheduler]:
    """Opens schedulers on the test's engine: on memory a private database that refuses any
    query no declared index serves; on the wire a fresh collection, dropped afterwards.
    Schedulers opened with the same ``collection`` share it."""
    opened: list[ms.Scheduler] = []
    collections: dict[str, str] = {}
    memory_name = uuid.uuid4().hex

    async def open_one(
        *,
        collection: str = "tasks",
        clock: ms.Clock = clock,
        changestreams: bool = True,
        notablescan: bool = True,
    ) -> ms.Scheduler:
        if engine in ("wire", "mongodb"):
            if collection not in collections:
                collections[collection] = f"t_{uuid.uuid4().hex[:16]}"
                prepare_collection(server_database, collections[collection])
            name = collections[collection]
            sched = await ms.Scheduler.connect(
                request.getfixturevalue("engine_uri"),
                database=server_database,
                collection=name,
                clock=clock,
            )
        else:
            query = f"notablescan={int(notablescan)}&changestreams={int(changestreams)}"
            sched = await ms.Scheduler.connect(
                f"memory://{memory_name}?{query}", collection=collection, clock=clock
            )
        opened.append(sched)
        return sched

    yield open_one
    for sched in opened:
        if engine != "memory":
            await sched.collection.drop()
        await sched.close()
    forget_memory_server(memory_name)


@pytest.fixture
def discover(engine: str, clock: ms.ManualClock) -> Callable[[], Awaitable[None]]:
    """Let consumers and waiters see what changed. On memory the change stream delivers it;
    on the wire (no change streams: they poll every `POLL_MS`) one poll interval passes."""

    async def discover() -> None:
        await settle()
        if engine == "wire":
            clock.advance(POLL_MS / 1000)
            await settle()

    return discover


@pytest.fixture
async def scheduler(open_scheduler: OpenScheduler) -> ms.Scheduler:
    return await open_scheduler()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.unit.test_chaos import TOTALS
    from tests.unit.test_claim_protocol_model import RUNS

    for engine, totals in TOTALS.items():
        terminalreporter.write_line(
            f"chaos on {engine}: {totals['runs']} runs, {totals['tasks']} tasks, "
            f"{totals['executions']} handler executions, {totals['violations']} violations"
        )

    for engine, counts in RUNS.items():
        if counts["machines"]:
            terminalreporter.write_line(
                f"claim protocol model on {engine}: {counts['machines']} state-machine runs, "
                f"{counts['steps']} store calls"
            )
