"""The periodic tasks scenarios (issue 14 #1), unchanged, on a real server (see conftest.py)."""

from tests.unit.test_periodic import *  # noqa: F403
