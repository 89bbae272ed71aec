"""Run the scenario files against a real MongoDB replica set.

Set ``MSCHEDULER_TEST_MONGODB_URI`` (for example ``mongodb://localhost:27017/?replicaSet=rs0``,
what ``docker compose -f docker/compose.yml up -d mongo`` starts); otherwise every test here is
skipped, and ``pytest -ra`` prints why. The engine is ``mongodb``: each test gets its own
collection, dropped afterwards (see ``tests/conftest.py``).
"""

from __future__ import annotations

import os

import pytest

SKIP_REASON = "MSCHEDULER_TEST_MONGODB_URI is not set: no real MongoDB to run against"


@pytest.fixture(params=["mongodb"])
def engine(request: pytest.FixtureRequest) -> str:
    if not os.environ.get("MSCHEDULER_TEST_MONGODB_URI"):
        pytest.skip(SKIP_REASON)
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Scenarios that do not take an engine are memory-only: tests/unit runs them."""
    skip = pytest.mark.skip(reason="memory-only scenario (no engine fixture): tests/unit runs it")
    for item in items:
        if "integration" in item.path.parts and "engine" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
