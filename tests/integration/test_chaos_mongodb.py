"""The chaos test, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_chaos import *  # noqa: F403
