"""The reliability regressions (issue 10), unchanged, on a real server (see conftest.py)."""

from tests.unit.test_reliability import *  # noqa: F403
