"""The wait scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_wait import *  # noqa: F403
