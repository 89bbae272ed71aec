"""The first-hour scenarios (issue 13: delay, time limit, sync handlers, registry, several
consumers, failure logs), unchanged, on a real server (see conftest.py)."""

from tests.unit.test_first_hour import *  # noqa: F403
