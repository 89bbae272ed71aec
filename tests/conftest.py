from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import mscheduler as ms


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ms.ManualClock:
    return ms.ManualClock()


@pytest.fixture
async def scheduler(clock: ms.ManualClock) -> AsyncIterator[ms.Scheduler]:
    """A private in-process database that refuses any query no declared index serves."""
    async with await ms.Scheduler.connect("memory://?notablescan=1", clock=clock) as sched:
        yield sched


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.unit.test_claim_protocol_model import RUNS

    if RUNS["machines"]:
        terminalreporter.write_line(
            f"claim protocol model: {RUNS['machines']} state-machine runs, "
            f"{RUNS['steps']} store calls"
        )
