"""The operations scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_operations import *  # noqa: F403
