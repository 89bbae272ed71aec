"""The one conftest: every test that takes ``engine`` (or ``scheduler``, ``open_scheduler``,
``engine_uri``) runs once per engine. tests/scenarios runs on all three: ``memory``,
``wire`` (tests/engines.py) and ``mongodb`` (a real server, tests/mongodb.py); tests/acceptance
on memory and wire. An engine this machine lacks is deselected at collection, with one line
in the report saying how to enable it; ``--engine NAME`` (repeatable) runs only those.

Two tiers: the README's command (``python -m pytest``, on every core through pytest-xdist)
leaves out the tests marked ``slow`` (what only long runs show: the models at length, chaos
with many seeds, the browser, ...); ``--slow`` adds them, and is what ``.ci/run`` runs. The
closing lines say what did not run and the command that runs everything."""

from __future__ import annotations

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
    Tally,
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
SETS_OTEL_PROVIDERS = ("test_tracing.py", "test_otel_metrics.py")
SLOW_TIER = "--slow"
EVERYTHING = f".venv/bin/python -m pytest {SLOW_TIER}"  # what .ci/run runs
DESELECTED: dict[str, int] = {}  # why -> how many, for the terminal summary
SLOW_LEFT_OUT: dict[str, int] = {}  # file -> how many slow tests were left out
# The wire tier's engine, as the first process of the run found or set it up: (python or
# None, why not). Workers of pytest-xdist get the controller's answer (`pytest_configure_node`)
# so that a first run sets the tier up once, before any worker starts.
WIRE: dict[str, str | None] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        action="append",
        choices=ENGINES,
        help="Run only the variants on this engine (repeatable); tests that take no engine "
        "are deselected too.",
    )
    parser.addoption(
        SLOW_TIER,
        action="store_true",
        help="Run the slow tier too (tests marked slow: the models at length, chaos with many "
        "seeds, the browser); bash .ci/run does.",
    )


def _worker_input(config: pytest.Config) -> dict[str, object] | None:
    """What the controller of a pytest-xdist run handed this worker, or None outside one."""
    return getattr(config, "workerinput", None)


def _wants_wire(config: pytest.Config) -> bool:
    chosen = config.getoption("engine")
    return not chosen or "wire" in chosen


def pytest_configure(config: pytest.Config) -> None:
    """Find (or, on a first run, set up) the wire tier's engine once, in the first process,
    before pytest-xdist starts its workers, so the header says what will run."""
    given = _worker_input(config)
    if given is not None:
        WIRE.update(given["mscheduler_wire"])  # type: ignore[call-overload]
        return
    if config.option.help or not _wants_wire(config):
        return
    _set_up_wire()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """pytest-xdist: each worker gets the controller's answer about the wire tier."""
    node.workerinput["mscheduler_wire"] = dict(WIRE)  # type: ignore[attr-defined]


def engines_for(path: Path) -> tuple[str, ...]:
    """The scenario tree runs on every engine; the rest (the CLI, the examples, which make
    collections of their own) on the engines that need no set-up."""
    if path.is_relative_to(SCENARIOS):
        return ENGINES
    return tuple(engine for engine in ENGINES if engine != "mongodb")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" in metafunc.fixturenames:
        metafunc.parametrize("engine", engines_for(metafunc.definition.path), indirect=True)


def _set_up_wire() -> None:
    """Find the wire tier's engine, or set it up now from the project's own script (the
    first run on a machine; it needs a Python >= 3.13 and the package index)."""
    if WIRE:
        return
    python = wire_python()
    if python is not None and Path(python).exists():
        WIRE.update(python=python, why_not=None)
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        # Under CI the wire tier must run: its variants stay, and `wire_server` fails them.
        WIRE.update(python=python, why_not=None)
        return
    if os.environ.get("MSCHEDULER_WIRE_PYTHON"):
        WIRE.update(python=None, why_not=WIRE_MISSING)  # a path was given and is not there
        return
    sys.stderr.write("setting up the wire tier's engine in .venv-wire (bash .ci/wire-venv)...\n")
    made = subprocess.run(
        ["bash", str(ROOT / ".ci" / "wire-venv")], capture_output=True, text=True, check=False
    )
    python = wire_python()
    if made.returncode == 0 and python is not None and Path(python).exists():
        WIRE.update(python=python, why_not=None)
        return
    said = (made.stderr.strip().splitlines() or ["failed"])[-1]
    WIRE.update(python=None, why_not=f"{WIRE_MISSING} ({said})")


def _wire_available() -> bool:
    _set_up_wire()
    return WIRE["why_not"] is None


def _why_not(item: pytest.Item, chosen: list[str] | None) -> str | None:
    """Why ``item`` does not run here, or None."""
    callspec = getattr(item, "callspec", None)
    engine = callspec.params.get("engine") if callspec is not None else None
    if engine is None and "wire_server" in getattr(item, "fixturenames", ()):
        engine = "wire"
    if chosen and engine not in chosen:
        return f"--engine {' '.join(chosen)}: not on " + (engine or "any engine")
    if engine == "wire" and not _wire_available():
        return f"wire: {WIRE['why_not']}"
    if engine == "mongodb":
        if mongodb_uri() is None:
            return f"mongodb: {MONGODB_MISSING}"
        if item.path.name in NOT_YET_ON_MONGODB:
            return "mongodb: not yet run on a real server: " + ", ".join(NOT_YET_ON_MONGODB)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect, rather than skip one by one, what this machine cannot run and the slow tier
    when not asked for: one line per reason in the summary instead of a SKIPPED line per
    test."""
    chosen = config.getoption("engine")
    slow = config.getoption("slow")
    kept, dropped = [], []
    for item in items:
        why = _why_not(item, chosen)
        if why is None and not slow and item.get_closest_marker("slow") is not None:
            SLOW_LEFT_OUT[item.path.name] = SLOW_LEFT_OUT.get(item.path.name, 0) + 1
            why = "slow"
        if why is None:
            kept.append(item)
        else:
            dropped.append(item)
            if why != "slow":
                DESELECTED[why] = DESELECTED.get(why, 0) + 1
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    # OpenTelemetry's providers are set once per process (tests/otel.py) and stay: the tests
    # that set them run after every other test of their process, in any pytest-xdist worker
    # (with a provider set, test_faults.py's unprintable exception and test_document_size.py's
    # limit behave otherwise).
    items.sort(key=lambda item: item.path.name in SETS_OTEL_PROVIDERS)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which engines and tiers this run runs, as decided before collection (`pytest_configure`
    set the wire tier up if it had to)."""
    chosen = config.getoption("engine") or ENGINES
    engines, missing = [], []
    for engine in ENGINES:
        if engine not in chosen:
            missing.append(f"{engine} (--engine)")
        elif engine == "wire" and not _wire_available():
            missing.append("wire (no engine: bash .ci/wire-venv, needs Python >= 3.13)")
        elif engine == "wire":
            engines.append(f"wire ({WIRE['python'] or 'no engine: under CI=true its tests fail'})")
        elif engine == "mongodb" and mongodb_uri() is None:
            missing.append(f"mongodb ({URI_VARIABLE} not set)")
        else:
            engines.append(engine)
    lines = [f"engines: {', '.join(engines) or 'none'}"]
    if missing:
        lines[0] += f"; not run: {', '.join(missing)}"
    if config.getoption("slow"):
        lines.append(f"tiers: the README's and the slow tier ({SLOW_TIER})")
    else:
        lines.append(f"tiers: the README's; not the slow tier ({EVERYTHING} adds it)")
    return lines


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


TALLIES: dict[tuple[str, str], dict[str, int]] = {}  # (what, engine) -> counts, summed


@pytest.fixture
def tally(request: pytest.FixtureRequest) -> Tally:
    """Counts a test adds to the run's closing lines (``tally("chaos", engine, runs=1)``):
    carried on its report, so they add up across pytest-xdist's workers too."""

    def add(what: str, engine: str, **counts: int) -> None:
        request.node.user_properties.append(("mscheduler_tally", (what, engine, counts)))

    return add


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sums the tallies; in a pytest-xdist worker too, where nothing prints them (the
    controller sums the reports it is sent)."""
    # A test of text that is not UTF-8 (a lone surrogate) logs it: pytest-xdist could not send
    # the report to the controller, and its worker would stop. Escaped here, before it sends.
    report.sections = [(title, _utf8(text)) for title, text in report.sections]
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == "mscheduler_tally":
            what, engine, counts = value
            total = TALLIES.setdefault((what, engine), {})
            for key, count in counts.items():
                total[key] = total.get(key, 0) + count


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: hand what collection left out to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["mscheduler_not_run"] = (dict(DESELECTED), dict(SLOW_LEFT_OUT))


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist: every worker collects the same tests, so one worker's account of what it
    left out is the run's."""
    output = getattr(node, "workeroutput", {})
    if "mscheduler_not_run" in output:
        deselected, slow = output["mscheduler_not_run"]
        DESELECTED.clear()
        DESELECTED.update(deselected)
        SLOW_LEFT_OUT.clear()
        SLOW_LEFT_OUT.update(slow)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """Our lines come after pytest's short summary, just above its closing line, so that a
    reader of the end sees what did not run and the command that runs everything."""
    yield
    for (what, engine), counts in sorted(TALLIES.items()):
        said = ", ".join(f"{count} {key.replace('_', ' ')}" for key, count in counts.items())
        terminalreporter.write_line(f"{what} on {engine}: {said}")
    for why, count in DESELECTED.items():
        terminalreporter.write_line(f"not run: {count} tests, {why}")
    if SLOW_LEFT_OUT:
        files = ", ".join(f"{name} {count}" for name, count in sorted(SLOW_LEFT_OUT.items()))
        terminalreporter.write_line(
            f"not run: {sum(SLOW_LEFT_OUT.values())} tests, the slow tier (tests marked slow, "
            f"in {files}): {SLOW_TIER} runs them"
        )
    if DESELECTED or SLOW_LEFT_OUT:
        terminalreporter.write_line(
            f"everything: {EVERYTHING} (what bash .ci/run runs; the real-MongoDB tier also "
            f"needs {URI_VARIABLE})"
        )
