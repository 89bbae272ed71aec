"""Run the store scenarios against a real MongoDB replica set.

Set ``MSCHEDULER_TEST_MONGODB_URI`` (for example ``mongodb://localhost:27017/?replicaSet=rs0``,
what ``docker compose -f docker/compose.yml up -d mongo`` starts); otherwise every test here is
skipped, and ``pytest -ra`` prints why. Each test gets its own collection, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest

import mscheduler as ms

URI = os.environ.get("MSCHEDULER_TEST_MONGODB_URI", "")
SKIP_REASON = "MSCHEDULER_TEST_MONGODB_URI is not set: no real MongoDB to run against"


@pytest.fixture
async def scheduler(clock: ms.ManualClock) -> AsyncIterator[ms.Scheduler]:
    if not URI:
        pytest.skip(SKIP_REASON)
    name = f"tasks_{uuid.uuid4().hex[:12]}"
    sched = await ms.Scheduler.connect(
        URI, database="mscheduler_test", collection=name, clock=clock
    )
    try:
        yield sched
    finally:
        await sched.collection.drop()
        await sched.close()
