"""The dependencies scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_dependencies import *  # noqa: F403
