"""The indexes scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_indexes import *  # noqa: F403
