"""The rate limits scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_rate_limits import *  # noqa: F403
