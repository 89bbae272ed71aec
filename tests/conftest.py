"""The one conftest: every test that takes ``engine`` (or ``scheduler``, ``open_scheduler``,
``engine_uri``) runs once per engine. tests/scenarios runs on all three: ``memory``,
``wire`` (tests/engines.py) and ``mongodb`` (a real server, tests/mongodb.py); tests/acceptance
on memory and wire. An engine this machine lacks is deselected at collection, with one line
in the report saying how to enable it; ``--engine NAME`` (repeatable) runs only those."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

import mscheduler as ms
from mscheduler.backends.memory import forget_memory_server
from mscheduler.testing import Clock, ManualClock
from tests.engines import (
    ENGINES,
    POLL_MS,
    ROOT,
    WIRE_DATABASE,
    WireServer,
    until_idle,
    wire_python,
    wire_unavailable,
)
from tests.mongodb import URI_VARIABLE, MongoRun, mongodb_uri

OpenScheduler = Callable[..., Awaitable[ms.Scheduler]]

SCENARIOS = ROOT / "tests" / "scenarios"
# Scenario files never yet run on a real server (they had no integration shim); their mongodb
# variants are deselected until one passes there.
NOT_YET_ON_MONGODB = (
    "test_change_streams.py",  # drives the memory backend's change feed (oversized events...)
    "test_claim_protocol_model.py",
    "test_dashboard.py",
    "test_dashboard_guard.py",
    "test_discovery_hub_model.py",  # drives the memory backend's change feed and the poll
    "test_many_names.py",
    "test_restarts.py",
    "test_sharded.py",
    "test_workers.py",
)
WIRE_MISSING = (
    "no wire engine: run `bash .ci/wire-venv` (needs Python >= 3.13) or set MSCHEDULER_WIRE_PYTHON"
)
MONGODB_MISSING = (
    f"the real-MongoDB tier: {URI_VARIABLE} is not set; to run it, start a replica set "
    "(`bash .ci/mongodb replica-set 8.0`, with Docker) and export the URI it prints"
)
DESELECTED: dict[str, int] = {}  # why -> how many, for the terminal summary
WIRE_SETUP_FAILED: list[str] = []  # what .ci/wire-venv said when it could not set the tier up


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        action="append",
        choices=ENGINES,
        help="Run only the variants on this engine (repeatable); tests that take no engine "
        "are deselected too.",
    )


def engines_for(path: Path) -> tuple[str, ...]:
    """The scenario tree runs on every engine; the rest (the CLI, the examples, which make
    collections of their own) on the engines that need no set-up."""
    if path.is_relative_to(SCENARIOS):
        return ENGINES
    return tuple(engine for engine in ENGINES if engine != "mongodb")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" in metafunc.fixturenames:
        metafunc.parametrize("engine", engines_for(metafunc.definition.path), indirect=True)


@functools.cache
def _wire_available() -> bool:
    """The wire tier's engine is found, or set up now from the project's own script (the
    first run on a machine; it needs a Python >= 3.13 and the package index)."""
    python = wire_python()
    if python is not None and Path(python).exists():
        return True
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        # Under CI the wire tier must run: its variants stay, and `wire_server` fails them.
        return True
    if os.environ.get("MSCHEDULER_WIRE_PYTHON"):
        return False  # a path was given and is not there: not ours to replace
    sys.stderr.write("setting up the wire tier's engine in .venv-wire (bash .ci/wire-venv)...\n")
    made = subprocess.run(
        ["bash", str(ROOT / ".ci" / "wire-venv")], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        WIRE_SETUP_FAILED.append((made.stderr.strip().splitlines() or ["failed"])[-1])
        return False
    python = wire_python()
    return python is not None and Path(python).exists()


def _why_not(item: pytest.Item, chosen: list[str] | None) -> str | None:
    """Why ``item`` does not run here, or None."""
    callspec = getattr(item, "callspec", None)
    engine = callspec.params.get("engine") if callspec is not None else None
    if engine is None and "wire_server" in getattr(item, "fixturenames", ()):
        engine = "wire"
    if chosen and engine not in chosen:
        return f"--engine {' '.join(chosen)}: not on " + (engine or "any engine")
    if engine == "wire" and not _wire_available():
        said = f" ({WIRE_SETUP_FAILED[0]})" if WIRE_SETUP_FAILED else ""
        return f"wire: {WIRE_MISSING}{said}"
    if engine == "mongodb":
        if mongodb_uri() is None:
            return f"mongodb: {MONGODB_MISSING}"
        if item.path.name in NOT_YET_ON_MONGODB:
            return "mongodb: not yet run on a real server: " + ", ".join(NOT_YET_ON_MONGODB)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect, rather than skip one by one, what this machine cannot run: one line per
    reason in the summary instead of a SKIPPED line per test."""
    chosen = config.getoption("engine")
    kept, dropped = [], []
    for item in items:
        why = _why_not(item, chosen)
        if why is None:
            kept.append(item)
        else:
            dropped.append(item)
            DESELECTED[why] = DESELECTED.get(why, 0) + 1
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> str:
    python = wire_python()
    wire = f"wire ({python})" if _wire_available() and python else "wire: not available"
    mongodb = "mongodb" if mongodb_uri() else f"mongodb: {URI_VARIABLE} not set"
    return f"engines: memory, {wire}, {mongodb}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


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


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> str:
    """Every test that asks for it (or for `scheduler`) runs once per engine
    (`pytest_generate_tests`)."""
    return str(request.param)


@pytest.fixture(scope="session")
def mongodb_run() -> Iterator[MongoRun]:
    uri = mongodb_uri()
    assert uri is not None, "mongodb variants are deselected without " + URI_VARIABLE
    run = MongoRun(uri)
    try:
        yield run
    finally:
        run.close()


@pytest.fixture
def engine_uri(engine: str, request: pytest.FixtureRequest) -> str:
    """A URI of the engine, for code that connects by itself (the CLI, the examples)."""
    if engine == "wire":
        server: WireServer = request.getfixturevalue("wire_server")
        return server.uri
    if engine == "mongodb":  # a real replica set or mongos (tests/mongodb.py)
        request.getfixturevalue("mongodb_run")  # checked once, its database made
        return os.environ[URI_VARIABLE]
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def server_database(engine: str, request: pytest.FixtureRequest) -> str:
    """The database the wire and mongodb tests make their collections in: on a real server,
    this run's own (tests/mongodb.py)."""
    if engine == "mongodb":
        run: MongoRun = request.getfixturevalue("mongodb_run")
        return run.database
    return WIRE_DATABASE


@pytest.fixture
def prepare_collection(engine: str, request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Called with (database, collection) before a test's collection on a server is first
    opened: on a sharded cluster, shards it; otherwise nothing to do."""
    if engine == "mongodb":
        run: MongoRun = request.getfixturevalue("mongodb_run")
        return run.prepare
    return lambda database, collection: None


@pytest.fixture
async def open_scheduler(
    engine: str,
    clock: ManualClock,
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
        clock: Clock = clock,
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
def discover(engine: str, clock: ManualClock) -> Callable[[], Awaitable[None]]:
    """Let consumers and waiters see what changed. On memory the change stream delivers it;
    on the wire (no change streams: they poll every `POLL_MS`) one poll interval passes."""

    async def discover() -> None:
        await until_idle()
        if engine == "wire":
            clock.advance(POLL_MS / 1000)
            await until_idle()

    return discover


@pytest.fixture
async def scheduler(open_scheduler: OpenScheduler) -> ms.Scheduler:
    return await open_scheduler()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """Our lines come after pytest's short summary, just above its closing line, so that a
    reader of the end sees what did not run and the command that runs it."""
    yield
    from tests.scenarios.test_chaos import TOTALS
    from tests.scenarios.test_claim_protocol_model import RUNS
    from tests.scenarios.test_discovery_hub_model import RUNS as HUB_RUNS

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
    for engine, counts in HUB_RUNS.items():
        if counts["machines"]:
            terminalreporter.write_line(
                f"discovery hub model on {engine}: {counts['machines']} state-machine runs, "
                f"{counts['steps']} steps"
            )
    for why, count in DESELECTED.items():
        terminalreporter.write_line(f"not run: {count} tests, {why}")
