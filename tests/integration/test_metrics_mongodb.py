"""The metrics scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_metrics import *  # noqa: F403
