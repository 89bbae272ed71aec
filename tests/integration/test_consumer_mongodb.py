"""The consumer scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_consumer import *  # noqa: F403
